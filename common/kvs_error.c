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
