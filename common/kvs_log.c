/* kvs_log.c — see kvs_log.h. Formats into a stack buffer, one write(2) per line
 * so concurrent records never interleave mid-line. */
#include "kvs_log.h"

#include "kvs_error.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = KVS_LOG_INFO;

static const char *const k_names[] = {"debug", "info", "warn", "error", "off"};

void kvs_log_set_level(kvs_log_level level)
{
    atomic_store_explicit(&g_level, (int)level, memory_order_relaxed);
}

kvs_log_level kvs_log_get_level(void)
{
    return (kvs_log_level)atomic_load_explicit(&g_level, memory_order_relaxed);
}

int kvs_log_level_parse(const char *s, kvs_log_level *out)
{
    if (s == NULL)
        return KVS_EINVAL;
    for (int i = KVS_LOG_DEBUG; i <= KVS_LOG_OFF; i++) {
        if (strcasecmp(s, k_names[i]) == 0) {
            *out = (kvs_log_level)i;
            return KVS_OK;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = KVS_LOG_WARN;
        return KVS_OK;
    }
    return KVS_EINVAL;
}

const char *kvs_log_level_name(kvs_log_level level)
{
    if ((int)level < KVS_LOG_DEBUG || (int)level > KVS_LOG_OFF)
        return "?";
    return k_names[level];
}

void kvs_log(kvs_log_level level, const char *module, const char *fmt, ...)
{
    if ((int)level < atomic_load_explicit(&g_level, memory_order_relaxed))
        return;
    static const char *const upper[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};
    char buf[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                     upper[level < KVS_LOG_OFF ? level : KVS_LOG_ERROR],
                     module ? module : "-");
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}
