/*
 * server.h — kvstashd's gRPC server: the only place the process meets gRPC.
 *
 * One completion queue, a pool of worker threads calling
 * grpc_completion_queue_next on it, registered methods (one per RPC of
 * proto/kvstash/v1/kvstash.proto plus grpc.health.v1.Health/Check), and a
 * generic slot that answers UNIMPLEMENTED for every other path so no call ever
 * waits for a handler that does not exist.
 *
 * Lifecycle: kvs_server_start binds and starts serving; kvs_server_stop shuts
 * down in the order gRPC requires (shutdown_and_notify, grace period,
 * cancel_all_calls, wait for the tag, shut the queue down and drain it, join,
 * destroy, grpc_shutdown) and frees everything. Start and stop are called
 * from one thread; everything else is internal.
 */
#ifndef KVS_SERVER_H
#define KVS_SERVER_H

#include "config.h"

typedef struct kvs_server kvs_server;

/* Starts a server with a copy of cfg (runtime settings may later change
 * through SetConfig). On success *out is running and kvs_server_port tells
 * the bound port. Errors: KVS_EINVAL (bad listen address), KVS_EIO (cannot
 * bind, cannot write port_file), KVS_ENOMEM; err says which. */
int kvs_server_start(const kvs_config *cfg, kvs_server **out, char *err);

/* The TCP port the server listens on (resolved when listen asked for 0). */
int kvs_server_port(const kvs_server *s);

/* Stops and frees the server; in-flight calls get shutdown_grace_ms to finish,
 * then are cancelled. Returns 0, or KVS_EINTERNAL when calls leaked (logged). */
int kvs_server_stop(kvs_server *s);

/*
 * Re-reads the configuration (SIGHUP) from the sources it started with: the
 * config file, environment and flags (kvs_config_from_args on argc, argv,
 * envp). Every run-time setting whose value there differs from the last time
 * they were read (start, or the last successful reload) is applied as one
 * SetConfig would apply it, all or nothing; a setting changed by SetConfig
 * since, and not changed in the sources, keeps its value. Model rules'
 * profile files are read again. Settings that only take effect at start, and
 * tenants' tokens, secrets, models and admin flags, are logged as needing a
 * restart and left. Counted in kvstash_config_reloads_total{result}. 0, or
 * the KVS_E* status with err (nothing changed).
 */
int kvs_server_reload(kvs_server *s, int argc, char **argv, char *const *envp, char *err);

/* Version string reported by Stats and --version. */
const char *kvs_server_version(void);

#endif /* KVS_SERVER_H */
