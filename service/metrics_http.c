/*
 * metrics_http.c — the /metrics endpoint on libmicrohttpd (see metrics_http.h).
 *
 * The idea: nothing here knows any figure. Each scrape asks the callback for a
 * fresh kvs_metric_set, renders it with kvs_prom_render, and hands the buffer
 * to MHD, which frees it after sending. The daemon binds the socket itself
 * from a resolved sockaddr (MHD_OPTION_SOCK_ADDR), so "port 0" works and the
 * bound port is read back from the listening socket.
 *
 * Invariants: the access handler answers on its first call for every request
 * (GET bodies are ignored; other methods are refused before any upload is
 * read), so no per-connection state is kept.
 */
#include "metrics_http.h"

#include "kvs_error.h"
#include "kvs_log.h"
#include "prom.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MOD "metrics"

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

struct kvs_metrics_http {
    struct MHD_Daemon *d;
    kvs_metrics_collect_fn collect;
    void *arg;
    int port;
    atomic_ullong scrapes;
};

static MHD_Result_t reply_text(struct MHD_Connection *conn, unsigned code, const char *text,
                               const char *allow)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow != NULL)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    MHD_Result_t ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static MHD_Result_t on_request(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    kvs_metrics_http *m = cls;
    (void)version;
    (void)upload;
    (void)con_cls;
    int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    int head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!get && !head)
        return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                          "405 method not allowed: /metrics answers GET and HEAD\n", "GET, HEAD");
    if (strcmp(url, "/metrics") != 0)
        return reply_text(conn, MHD_HTTP_NOT_FOUND, "404 not found: try /metrics\n", NULL);
    *upload_size = 0; /* a GET body, if any, is ignored */

    kvs_metric_set set;
    kvs_metric_set_init(&set);
    char *body = NULL;
    size_t len = 0;
    int rc = m->collect(m->arg, &set);
    if (rc == 0)
        rc = kvs_prom_render(&set, &body, &len);
    kvs_metric_set_free(&set);
    if (rc != 0) {
        KVS_LOG_WARN(MOD, "scrape failed: %s", kvs_strerror(rc));
        return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "500 cannot collect the metrics\n",
                          NULL);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, KVS_PROM_CONTENT_TYPE);
    MHD_Result_t ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    atomic_fetch_add(&m->scrapes, 1);
    return ret;
}

/* Splits "host:port" / "[v6]:port" and resolves it (numeric port only). */
static int resolve(const char *listen, struct sockaddr_storage *ss, socklen_t *sslen, char *err)
{
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || colon == listen || colon[1] == '\0')
        return kvs_fail(err, KVS_EINVAL, "metrics_listen '%.200s': expected host:port", listen);
    size_t hl = (size_t)(colon - listen);
    const char *h = listen;
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return kvs_fail(err, KVS_EINVAL, "metrics_listen: host name too long");
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535)
        return kvs_fail(err, KVS_EINVAL, "metrics_listen '%.200s': bad port", listen);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &res);
    if (g != 0 || res == NULL)
        return kvs_fail(err, KVS_EINVAL, "metrics_listen '%.200s': %s", listen, gai_strerror(g));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int kvs_metrics_http_start(const char *listen, kvs_metrics_collect_fn collect, void *arg,
                           kvs_metrics_http **out, char *err)
{
    if (listen == NULL || collect == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "kvs_metrics_http_start: missing argument");
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    int rc = resolve(listen, &ss, &sslen, err);
    if (rc != 0)
        return rc;
    kvs_metrics_http *m = calloc(1, sizeof *m);
    if (m == NULL)
        return kvs_fail(err, KVS_ENOMEM, "out of memory");
    m->collect = collect;
    m->arg = arg;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    m->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, m, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, 64u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (m->d == NULL) {
        free(m);
        return kvs_fail(err, KVS_EIO, "metrics_listen %.200s: cannot bind (address in use?)",
                        listen);
    }
    const union MHD_DaemonInfo *fd = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (fd == NULL || getsockname(fd->listen_fd, (struct sockaddr *)&bound, &blen) != 0) {
        MHD_stop_daemon(m->d);
        free(m);
        return kvs_fail(err, KVS_EIO, "metrics_listen %.200s: cannot read the bound port", listen);
    }
    m->port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *out = m;
    return 0;
}

int kvs_metrics_http_port(const kvs_metrics_http *m)
{
    return m->port;
}

unsigned long long kvs_metrics_http_scrapes(const kvs_metrics_http *m)
{
    return atomic_load(&m->scrapes);
}

void kvs_metrics_http_stop(kvs_metrics_http *m)
{
    if (m == NULL)
        return;
    MHD_stop_daemon(m->d);
    free(m);
}
