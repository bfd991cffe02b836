/* kvs_error.c — the text side of KVS_ERRNO_MAP. */
#include "kvs_error.h"

#include <stdarg.h>

const char *kvs_strerror(int code)
{
    switch (code) {
    case KVS_OK:
        return "success";
#define KVS__ERR_TEXT(name, val, text)                                         \
    case KVS_##name:                                                           \
        return text;
        KVS_ERRNO_MAP(KVS__ERR_TEXT)
#undef KVS__ERR_TEXT
    default:
        return "unknown error";
    }
}

const char *kvs_errname(int code)
{
    switch (code) {
    case KVS_OK:
        return "KVS_OK";
#define KVS__ERR_NAME(name, val, text)                                         \
    case KVS_##name:                                                           \
        return "KVS_" #name;
        KVS_ERRNO_MAP(KVS__ERR_NAME)
#undef KVS__ERR_NAME
    default:
        return "KVS_E?";
    }
}

int kvs_fail(char *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, KVS_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return code;
}

int kvs_status_from_grpc(int grpc_status)
{
    switch (grpc_status) { /* gRPC status codes, numbered as on the wire */
    case 0: /* OK */
        return KVS_OK;
    case 1: /* CANCELLED */
        return KVS_ECANCELED;
    case 3: /* INVALID_ARGUMENT */
        return KVS_EINVAL;
    case 4: /* DEADLINE_EXCEEDED */
        return KVS_ETIMEDOUT;
    case 5: /* NOT_FOUND */
        return KVS_ENOTFOUND;
    case 6: /* ALREADY_EXISTS */
        return KVS_EEXIST;
    case 7: /* PERMISSION_DENIED */
        return KVS_EPERM;
    case 8: /* RESOURCE_EXHAUSTED */
        return KVS_ENOSPC;
    case 9: /* FAILED_PRECONDITION */
        return KVS_EPRECOND;
    case 12: /* UNIMPLEMENTED */
        return KVS_EUNIMPL;
    case 14: /* UNAVAILABLE */
        return KVS_EUNAVAIL;
    case 15: /* DATA_LOSS */
        return KVS_EFORMAT;
    case 16: /* UNAUTHENTICATED */
        return KVS_EUNAUTH;
    default:
        return KVS_EINTERNAL;
    }
}

const char *kvs_grpc_code_name(int grpc_status)
{
    static const char *const names[] = {
        "OK",          "CANCELLED",          "UNKNOWN",       "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND",    "ALREADY_EXISTS", "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL",         "UNAVAILABLE",   "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if (grpc_status < 0 || (size_t)grpc_status >= sizeof names / sizeof names[0])
        return NULL;
    return names[grpc_status];
}
