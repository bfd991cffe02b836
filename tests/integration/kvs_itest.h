/*
 * kvs_itest.h — helpers shared by the C integration tests (test_server,
 * test_data, test_connect) on top of kvs_server_proc: start/stop a real
 * kvstashd in the CUnit suite-init convention, open a libkvstash client, and
 * one unary call through the raw gRPC C core (no libkvstash code involved, so
 * a request can carry arbitrary bytes).
 *
 * Invariants: every helper prints its reason to stderr when it fails; the
 * suite helpers return 0 or 1 (what CUnit wants from init/cleanup); nothing
 * here keeps state between calls. Not thread-safe for servers (see
 * kvs_server_proc.h); kvs_itest_raw_call and kvs_itest_open_client are.
 */
#ifndef KVS_ITEST_H
#define KVS_ITEST_H

#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <stddef.h>
#include <stdint.h>

/* main() of a test against a real kvstashd: *kvstashd = argv[1] or $KVSTASHD
 * (neither: usage on stderr, 2), then kvs_test_run(suites) between
 * grpc_init and grpc_shutdown; returns its exit status. */
int kvs_itest_main(int argc, char **argv, const char **kvstashd, const kvs_test_suite *suites);

/* kvs_client_open to addr with token (may be NULL), opts.ucx = ucx, a 5 s
 * connect timeout and call_timeout_ms per call. Returns kvs_client_open's
 * result; the caller owns *out (kvs_client_close). */
int kvs_itest_open_client(const char *addr, const char *token, int ucx, int call_timeout_ms,
                          kvs_client **out);
/* The same with kvs_client_opts.ucx_retry_ms (0: the default). */
int kvs_itest_open_client_retry(const char *addr, const char *token, int ucx, int call_timeout_ms,
                                int ucx_retry_ms, kvs_client **out);
/* kvs_client_open to addr without a token or UCX, opts.decode = dec (where
 * rendered formats are decoded), a 5 s connect and a 30 s call timeout. */
int kvs_itest_open_client_decode(const char *addr, kvs_decode_at dec, kvs_client **out);

/* A namespace of model (salt "", both borrowed) with this layout and element
 * type (kvs_ns.dtype: 1 fp16, 2 bf16, 3 fp32). */
kvs_ns kvs_itest_ns(const char *model, unsigned layers, unsigned heads, unsigned head_dim,
                    unsigned block_tokens, unsigned dtype);

/* n pseudo-random finite fp16 values (sign, exponent 13..16, about 0.06..2,
 * random mantissa) from seed: the same tensor on every run, so failures
 * reproduce. */
void kvs_itest_fill_fp16(uint16_t *p, size_t n, uint64_t seed);

/* The value of kvstashd's metric name (the sample with label = value when
 * label is not NULL; a histogram's count) through c's Stats call, or -1 when
 * the call fails or the sample is absent. */
double kvs_itest_stat(kvs_client *c, const char *name, const char *label, const char *value);

/* mkdtemp(dir_tmpl) and writes text to "<dir>/kvstashd.ini", whose path goes
 * to path (path_len bytes). Returns 0, or 1 with the reason printed. */
int kvs_itest_write_config(char *dir_tmpl, char *path, size_t path_len, const char *text);

/* kvs_server_proc_start(kvstashd, args, p); on failure prints
 * "cannot start kvstashd (what): reason" and returns 1, else 0. */
int kvs_itest_start(const char *kvstashd, const char *const *args, kvs_server_proc *p,
                    const char *what);

/* SIGTERM and wait up to timeout_ms; 0 when the server exited with status 0,
 * else prints why and returns 1. The process is gone either way. */
int kvs_itest_stop(kvs_server_proc *p, int timeout_ms);

/* The TCP sockets process pid listens on outside loopback (read from
 * /proc/PID/fd and /proc/PID/net/tcp, tcp6): their count, the first one as
 * "ADDR:PORT" in first (n bytes, may be NULL), or -1 when /proc cannot be
 * read. */
int kvs_itest_listening_outside_loopback(int pid, char *first, size_t n);

/* The running value of setting name through c's GetConfig (malloc'd; the
 * caller frees), or NULL with the reason printed. */
char *kvs_itest_setting(kvs_client *c, const char *name);

/* SetConfig of one setting (not a dry run): 0, or the status with the reason
 * in err (KVS_ERR_LEN; may be NULL) and printed. */
int kvs_itest_set_setting(kvs_client *c, const char *name, const char *value, char *err);

/* Sends SIGHUP to kvstashd pid and waits (up to 10 s) for c's Stats to count
 * one more reload of `result` ("applied" or "refused",
 * kvstash_config_reloads_total). 0 when it did and the other result's count
 * did not move, else -1 (printed). */
int kvs_itest_hup_wait(kvs_client *c, int pid, const char *result);

/* The suite_init of a test whose kvstashd reads a config file: starts it with
 * "--config ini" (kvs_itest_start) and opens *client to it (no token, no UCX,
 * 30 s per call). 0, or 1 with the reason printed. */
int kvs_itest_start_config(const char *kvstashd, const char *ini, kvs_server_proc *p,
                           kvs_client **client, const char *what);

/* The matching suite_cleanup: closes *client (then NULL), kvs_itest_stop(p,
 * 10 s), and removes the folder dir and everything in it. 0 when the server
 * exited cleanly, else 1. */
int kvs_itest_stop_config(kvs_server_proc *p, kvs_client **client, const char *dir);

/* One unary call of method with payload[0..len) and, when token is not NULL,
 * "authorization: Bearer <token>"; deadline timeout_ms. Returns the gRPC
 * status. reply/reply_len (both may be NULL) get the reply bytes, malloc'd
 * and owned by the caller (NULL, 0 when none); details (may be NULL, n bytes)
 * get the status message. */
grpc_status_code kvs_itest_raw_call(const char *addr, const char *token, const char *method,
                                    const void *payload, size_t len, int timeout_ms,
                                    uint8_t **reply, size_t *reply_len, char *details, size_t n);

/* A client-streaming (or unary) call of method sending msgs[0..n) (not
 * consumed: the caller destroys them) then half-closing, or, with
 * cancel_after >= 0, cancelling after that many messages; token and
 * timeout_ms as for kvs_itest_raw_call. Returns the gRPC status; details
 * (may be NULL, dn bytes) get the status message. */
grpc_status_code kvs_itest_raw_stream(const char *addr, const char *token, const char *method,
                                      grpc_byte_buffer **msgs, size_t n, int cancel_after,
                                      int timeout_ms, char *details, size_t dn);

/* A byte buffer holding a copy of p[0..n); the caller destroys it. */
grpc_byte_buffer *kvs_itest_bb_from(const void *p, size_t n);

#endif /* KVS_ITEST_H */
