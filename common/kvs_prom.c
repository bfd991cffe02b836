/*
 * kvs_prom.c — number spelling and escaping for Prometheus text (kvs_prom.h).
 */
#include "kvs_prom.h"

#include <math.h>
#include <stdlib.h>

void kvs_prom_format_double(double v, char *buf, size_t n)
{
    if (isnan(v)) {
        snprintf(buf, n, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, n, v > 0 ? "+Inf" : "-Inf");
    } else {
        snprintf(buf, n, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, n, "%.17g", v);
    }
}

int kvs_prom_put_escaped(FILE *f, const char *s, int quote)
{
    int bad = 0;
    for (; *s != '\0'; s++) {
        int r;
        if (*s == '\\')
            r = fputs("\\\\", f);
        else if (*s == '\n')
            r = fputs("\\n", f);
        else if (quote && *s == '"')
            r = fputs("\\\"", f);
        else
            r = fputc((unsigned char)*s, f);
        bad |= (r == EOF);
    }
    return bad;
}

const char *kvs_prom_type_name(int kind)
{
    switch (kind) {
    case 1:
        return "counter";
    case 2:
        return "gauge";
    case 3:
        return "histogram";
    default:
        return "untyped";
    }
}
