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

/* Before the gRPC port is bound and the server starts serving: opens
 * the trace recorder (record_trace), starts /metrics (metrics_listen) and
 * writes metrics_port_file. s->trace and s->metrics are set here and only
 * cleared by kvs__ops_stop after the workers are joined, so handlers read
 * them without a lock. On error the parts already started are stopped again
 * and err says why. */
int kvs__ops_start(struct kvs_server *s, char *err);

/* Stops /metrics and closes the trace (before the server frees its state). */
void kvs__ops_stop(struct kvs_server *s);

/* Appends the operator surfaces' own figures to set (collect() in handlers.c,
 * so Stats and /metrics both carry them): kvstash_tls_enabled,
 * kvstash_metrics_scrapes_total (when /metrics is on) and
 * kvstash_trace_lines_total (when recording). 0 or KVS_ENOMEM. */
struct kvs_metric_set;
int kvs__ops_collect(struct kvs_server *s, struct kvs_metric_set *set);

#endif /* KVS_OPS_H */
