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

/* Maps a gRPC status code (grpc_status_code as int: the wire values of gRPC's
 * status.proto, 0..16) to the KVS_E* code a caller sees: INVALID_ARGUMENT ->
 * KVS_EINVAL, NOT_FOUND -> KVS_ENOTFOUND, ALREADY_EXISTS -> KVS_EEXIST,
 * DEADLINE_EXCEEDED -> KVS_ETIMEDOUT, UNAVAILABLE -> KVS_EUNAVAIL,
 * UNAUTHENTICATED -> KVS_EUNAUTH, PERMISSION_DENIED -> KVS_EPERM,
 * RESOURCE_EXHAUSTED -> KVS_ENOSPC, FAILED_PRECONDITION -> KVS_EPRECOND,
 * UNIMPLEMENTED -> KVS_EUNIMPL, CANCELLED -> KVS_ECANCELED, DATA_LOSS ->
 * KVS_EFORMAT, anything else KVS_EINTERNAL. Here (no gRPC header) because the
 * client library and the server's UCX put path both answer in these terms. */
int kvs_status_from_grpc(int grpc_status);

/* The name of a gRPC status code ("OK", "INVALID_ARGUMENT", ... "UNAUTHENTICATED"),
 * static storage; NULL outside 0..16 (each caller says what it shows then). */
const char *kvs_grpc_code_name(int grpc_status);

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
