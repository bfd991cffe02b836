/*
 * kvs_log.h — levelled logging to stderr.
 *
 * One line per record: "2026-11-29T22:08:44.123Z LEVEL [module] message".
 * The level is process-wide and may change at run time (SetConfig log_level);
 * records below it cost one relaxed atomic load. Thread-safe: each record is
 * formatted into a local buffer and written with a single write(2).
 */
#ifndef KVS_LOG_H
#define KVS_LOG_H

typedef enum kvs_log_level {
    KVS_LOG_DEBUG = 0,
    KVS_LOG_INFO = 1,
    KVS_LOG_WARN = 2,
    KVS_LOG_ERROR = 3,
    KVS_LOG_OFF = 4,
} kvs_log_level;

void kvs_log_set_level(kvs_log_level level);
kvs_log_level kvs_log_get_level(void);

/* Parses "debug", "info", "warn", "error" or "off" (case-insensitive).
 * Returns 0 or KVS_EINVAL. */
int kvs_log_level_parse(const char *s, kvs_log_level *out);
const char *kvs_log_level_name(kvs_log_level level);

void kvs_log(kvs_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define KVS_LOG_DEBUG(mod, ...) kvs_log(KVS_LOG_DEBUG, mod, __VA_ARGS__)
#define KVS_LOG_INFO(mod, ...) kvs_log(KVS_LOG_INFO, mod, __VA_ARGS__)
#define KVS_LOG_WARN(mod, ...) kvs_log(KVS_LOG_WARN, mod, __VA_ARGS__)
#define KVS_LOG_ERROR(mod, ...) kvs_log(KVS_LOG_ERROR, mod, __VA_ARGS__)

#endif /* KVS_LOG_H */
