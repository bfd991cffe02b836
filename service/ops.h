/*
 * ops.h — the operator surfaces of kvstashd wired into the server: the
 * /metrics daemon, the request-trace recorder and the listener's TLS
 * credentials. server.c calls these three hooks; everything they need from
 * the server is in server_internal.h.
 */
#ifndef KVS_OPS_H
#define KVS_OPS_H

#include "config.h"

#include <grpc/grpc_security.h>

struct kvs_server;

/* Credentials for the gRPC listener: TLS when cfg->tls_cert is set (with
 * tls_key, and tls_client_ca to require client certificates), else insecure.
 * Returns NULL with a message in err when a file cannot be read or only one
 * of cert/key is set. The caller releases the result. */
grpc_server_credentials *kvs__ops_credentials(const kvs_config *cfg, char *err);

/* After the gRPC listener is up: opens the trace recorder (record_trace),
 * starts /metrics (metrics_listen) and writes metrics_port_file. On error the
 * parts already started are stopped again and err says why. */
int kvs__ops_start(struct kvs_server *s, char *err);

/* Stops /metrics and closes the trace (before the server frees its state). */
void kvs__ops_stop(struct kvs_server *s);

#endif /* KVS_OPS_H */
