/*
 * kvs_error.h — status codes shared by every kvstash module, and KVS_ASSERT.
 *
 * Two error channels (STYLE.md): functions return int, 0 for success or a
 * negative KVS_E* code for anything a client, a disk or a network can cause;
 * KVS_ASSERT aborts with file:line on a programmer error. Untrusted input never
 * reaches an assert.
 *
 * One X-macro table, KVS_ERRNO_MAP, makes both the enum and kvs_strerror()
 * (libuv's UV_ERRNO_MAP), so a code and its text never drift apart.
 */
#ifndef KVS_ERROR_H
#define KVS_ERROR_H

#include <stdio.h>
#include <stdlib.h>

/* XX(NAME, value, text). Values are stable: they travel in logs and tests. */
#define KVS_ERRNO_MAP(XX)                                                      \
    XX(EINVAL, -1, "invalid argument")                                         \
    XX(ENOMEM, -2, "out of memory")                                            \
    XX(ENOTFOUND, -3, "not found")                                             \
    XX(EEXIST, -4, "already exists")                                           \
    XX(EFORMAT, -5, "malformed or corrupted data")                             \
    XX(ETIMEDOUT, -6, "deadline exceeded")                                     \
    XX(EUNAVAIL, -7, "server unavailable")                                     \
    XX(EUNAUTH, -8, "unauthenticated")                                         \
    XX(EPERM, -9, "permission denied")                                         \
    XX(ENOSPC, -10, "resource exhausted")                                      \
    XX(EPRECOND, -11, "failed precondition")                                   \
    XX(EUNIMPL, -12, "not implemented")                                        \
    XX(EIO, -13, "I/O error")                                                  \
    XX(ECANCELED, -14, "operation canceled")                                   \
    XX(EPROTO, -15, "protocol error")                                          \
    XX(ENODEV, -16, "no such device")                                          \
    XX(EINTERNAL, -17, "internal error")

typedef enum kvs_errno {
    KVS_OK = 0,
#define KVS__ERR_ENUM(name, val, text) KVS_##name = (val),
    KVS_ERRNO_MAP(KVS__ERR_ENUM)
#undef KVS__ERR_ENUM
} kvs_errno;

/* Room for a caller-owned detail message (Redis anet style): char err[KVS_ERR_LEN]. */
#define KVS_ERR_LEN 256

#ifdef __cplusplus
extern "C" {
#endif

/* Text for a status code; never NULL, static storage. Unknown codes get
 * "unknown error". */
const char *kvs_strerror(int code);

/* The symbolic name, e.g. "KVS_EINVAL"; "KVS_OK" for 0; never NULL. */
const char *kvs_errname(int code);

/* Formats a detail message into err (KVS_ERR_LEN bytes; err may be NULL) and
 * returns code, so a check reads `return kvs_fail(err, KVS_EFORMAT, "...")`. */
int kvs_fail(char *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

/* Programmer errors only. Active in every build type: a broken invariant in a
 * cache that serves model state must stop the process, not corrupt answers. */
#define KVS_ASSERT(cond)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)

#endif /* KVS_ERROR_H */
