/*
 * kvs_bench_stats.h — the clock and the median every benchmark in tests/bench
 * reports with. Header-only, like kvs_fdio.h, so benchmarks that do not link
 * the CUnit support library can use it.
 */
#ifndef KVS_BENCH_STATS_H
#define KVS_BENCH_STATS_H

#include <math.h>
#include <stdlib.h>
#include <time.h>

/* Monotonic seconds. */
static inline double kvs_bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* qsort order of doubles, ascending. */
static inline int kvs_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (the mean of the middle two for even n); sorts v.
 * NAN for n <= 0. */
static inline double kvs_bench_median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, kvs_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif /* KVS_BENCH_STATS_H */
