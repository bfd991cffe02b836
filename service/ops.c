/*
 * ops.c — lifecycle of the operator surfaces (see ops.h): TLS credentials
 * for the listener, the /metrics daemon, the trace recorder.
 *
 * Invariant: s->metrics and s->trace are either NULL or fully started;
 * kvs__ops_stop stops /metrics first (its callback reads server state) and
 * may be called whatever kvs__ops_start managed to do.
 */
#include "ops.h"

#include "kvs_error.h"
#include "kvs_log.h"
#include "metrics_http.h"
#include "server.h"
#include "server_internal.h"
#include "trace_rec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MOD     "ops"
#define PEM_MAX ((long)1 << 20)

/* Reads a whole PEM file into a NUL-terminated buffer (caller frees). */
static char *read_pem(const char *what, const char *path, char *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        kvs_fail(err, KVS_EIO, "%s %.200s: %s", what, path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n <= PEM_MAX &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
    } else {
        free(buf);
        buf = NULL;
        kvs_fail(err, KVS_EIO, "%s %.200s: %s", what, path,
                 n > PEM_MAX ? "larger than 1 MiB" : "cannot read");
    }
    fclose(f);
    if (buf != NULL && strstr(buf, "-----BEGIN ") == NULL) {
        kvs_fail(err, KVS_EINVAL, "%s %.200s: not a PEM file", what, path);
        free(buf);
        buf = NULL;
    }
    return buf;
}

grpc_server_credentials *kvs__ops_credentials(const kvs_config *cfg, char *err)
{
    if (cfg->tls_cert[0] == '\0' && cfg->tls_key[0] == '\0') {
        if (cfg->tls_client_ca[0] != '\0') {
            kvs_fail(err, KVS_EINVAL, "tls_client_ca needs tls_cert and tls_key");
            return NULL;
        }
        return grpc_insecure_server_credentials_create();
    }
    if (cfg->tls_cert[0] == '\0' || cfg->tls_key[0] == '\0') {
        kvs_fail(err, KVS_EINVAL, "TLS needs both tls_cert and tls_key");
        return NULL;
    }
    char *cert = read_pem("tls_cert", cfg->tls_cert, err);
    char *key = cert ? read_pem("tls_key", cfg->tls_key, err) : NULL;
    char *ca = NULL;
    if (key != NULL && cfg->tls_client_ca[0] != '\0')
        ca = read_pem("tls_client_ca", cfg->tls_client_ca, err);
    grpc_server_credentials *creds = NULL;
    if (key != NULL && (cfg->tls_client_ca[0] == '\0' || ca != NULL)) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        creds = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (creds == NULL)
            kvs_fail(err, KVS_EINVAL, "gRPC refused the TLS certificate or key");
    }
    /* gRPC copies the PEM strings into the credentials. */
    free(cert);
    free(key);
    free(ca);
    if (creds != NULL)
        KVS_LOG_INFO(MOD, "TLS on (%s)",
                     cfg->tls_client_ca[0] ? "client certificates required" : "server auth");
    return creds;
}

static int collect_cb(void *arg, kvs_metric_set *set)
{
    return kvs__server_collect(arg, set);
}

static int write_port(const char *path, int port, char *err)
{
    char tmp[KVS_CONFIG_STR_MAX + 16];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return kvs_fail(err, KVS_EINVAL, "metrics_port_file: name too long");
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return kvs_fail(err, KVS_EIO, "metrics_port_file %.160s: %s", path, strerror(e));
    }
    return 0;
}

int kvs__ops_start(kvs_server *s, char *err)
{
    /* Called before the server serves its first call; the snapshot under the
     * read lock costs nothing and keeps this safe if that ever changes. */
    kvs_config snap;
    pthread_rwlock_rdlock(&s->cfg_lock);
    snap = s->cfg;
    pthread_rwlock_unlock(&s->cfg_lock);
    const kvs_config *cfg = &snap;
    int rc = 0;
    if (cfg->record_trace[0] != '\0') {
        rc = kvs_trace_rec_open(cfg->record_trace, &s->trace, err);
        if (rc == 0)
            KVS_LOG_INFO(MOD, "recording requests to %s", cfg->record_trace);
    }
    if (rc == 0 && cfg->metrics_listen[0] != '\0') {
        rc = kvs_metrics_http_start(cfg->metrics_listen, collect_cb, s, &s->metrics, err);
        if (rc == 0) {
            KVS_LOG_INFO(MOD, "Prometheus metrics at /metrics on port %d (metrics_listen %s)",
                         kvs_metrics_http_port(s->metrics), cfg->metrics_listen);
            if (cfg->metrics_port_file[0] != '\0')
                rc = write_port(cfg->metrics_port_file, kvs_metrics_http_port(s->metrics), err);
        }
    } else if (rc == 0 && cfg->metrics_port_file[0] != '\0') {
        rc = kvs_fail(err, KVS_EINVAL, "metrics_port_file is set but metrics_listen is empty");
    }
    if (rc != 0)
        kvs__ops_stop(s);
    return rc;
}

void kvs__ops_stop(kvs_server *s)
{
    kvs_metrics_http_stop(s->metrics);
    s->metrics = NULL;
    kvs_trace_rec_close(s->trace);
    s->trace = NULL;
}

int kvs__ops_collect(kvs_server *s, kvs_metric_set *set)
{
    /* tls_cert is a static row: set at start, never changed by SetConfig. */
    pthread_rwlock_rdlock(&s->cfg_lock);
    double tls = s->cfg.tls_cert[0] != '\0';
    pthread_rwlock_unlock(&s->cfg_lock);
    if (!kvs_metric_add(set, "kvstash_tls_enabled", "1 when the gRPC listener speaks TLS",
                        KVS_MT_GAUGE, tls, 0))
        return KVS_ENOMEM;
    if (s->metrics != NULL &&
        !kvs_metric_add(set, "kvstash_metrics_scrapes_total",
                        "GET /metrics answered 200 (this scrape not yet counted)", KVS_MT_COUNTER,
                        (double)kvs_metrics_http_scrapes(s->metrics), 0))
        return KVS_ENOMEM;
    if (s->trace != NULL &&
        !kvs_metric_add(set, "kvstash_trace_lines_total",
                        "requests written to the record_trace file", KVS_MT_COUNTER,
                        (double)kvs_trace_rec_lines(s->trace), 0))
        return KVS_ENOMEM;
    return 0;
}
