/*
 * sim.c — kvstash-sim: replay request traces through the real store and policies.
 *
 *   kvstash-sim --trace FILE --capacity-blocks N[,N...] [--policy NAME|all] [-v]
 *   kvstash-sim --generate KIND [--requests N] [--seed S]      (JSONL to stdout)
 *
 * One output line per (policy, capacity): "policy=NAME capacity=N hit=0.xxxx",
 * hit = prefix-hit blocks / requested blocks (../shared/traces/README.md); put
 * lines ("op": "put") are inserted but are not requests.
 * "all" runs every policy, Belady's offline optimum included. -v adds the
 * replay time and eviction count to stderr. Exit 1 on a malformed trace line
 * (the message names the line), 2 on bad usage.
 */
#include "kvs_error.h"
#include "store.h"
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvstash-sim --trace FILE --capacity-blocks N[,N...] [--policy NAME|all] [-v]\n"
            "       kvstash-sim --generate chat|sysprompt|docs|mix [--requests N] [--seed S]\n"
            "policies:");
    for (const char *const *p = kvs_store_policy_names(); *p; p++)
        fprintf(f, " %s", *p);
    fputc('\n', f);
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return -1;
    *v = x;
    return 0;
}

int main(int argc, char **argv)
{
    const char *trace = NULL, *policy = "all", *caps = NULL, *generate = NULL;
    uint64_t nreq = 4000, seed = 1;
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-v")) {
            verbose = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "kvstash-sim: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        if (!strcmp(a, "--trace"))
            trace = v;
        else if (!strcmp(a, "--capacity-blocks"))
            caps = v;
        else if (!strcmp(a, "--policy"))
            policy = v;
        else if (!strcmp(a, "--generate"))
            generate = v;
        else if (!strcmp(a, "--requests") && !parse_u64(v, &nreq))
            ;
        else if (!strcmp(a, "--seed") && !parse_u64(v, &seed))
            ;
        else {
            fprintf(stderr, "kvstash-sim: bad argument %s %s\n", a, v);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (generate) {
        kvs_trace *t;
        int rc = kvs_trace_generate(generate, nreq, seed, &t);
        if (rc) {
            fprintf(stderr, "kvstash-sim: --generate %s: %s\n", generate, kvs_strerror(rc));
            return 2;
        }
        rc = kvs_trace_write(t, stdout);
        kvs_trace_free(t);
        return rc ? 1 : 0;
    }
    if (!trace || !caps) {
        usage(stderr);
        return 2;
    }
    uint64_t cap[64];
    size_t ncap = 0;
    char cbuf[1024];
    snprintf(cbuf, sizeof cbuf, "%s", caps);
    for (char *save = NULL, *tok = strtok_r(cbuf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (ncap == 64 || parse_u64(tok, &cap[ncap]) || cap[ncap] == 0) {
            fprintf(stderr, "kvstash-sim: bad --capacity-blocks '%s'\n", caps);
            return 2;
        }
        ncap++;
    }
    const char *const *names = kvs_store_policy_names();
    const char *one[2] = {policy, NULL};
    if (strcmp(policy, "all")) {
        int ok = 0;
        for (const char *const *p = names; *p; p++)
            ok |= !strcmp(*p, policy);
        if (!ok) {
            fprintf(stderr, "kvstash-sim: unknown policy '%s'\n", policy);
            usage(stderr);
            return 2;
        }
        names = one;
    }
    FILE *f = strcmp(trace, "-") ? fopen(trace, "r") : stdin;
    if (!f) {
        fprintf(stderr, "kvstash-sim: %s: %s\n", trace, strerror(errno));
        return 1;
    }
    kvs_trace *t;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_trace_load(f, trace, &t, err, sizeof err);
    if (f != stdin)
        fclose(f);
    if (rc) {
        fprintf(stderr, "kvstash-sim: %s\n", err[0] ? err : kvs_strerror(rc));
        return 1;
    }
    if (verbose)
        fprintf(stderr, "trace %s: %zu requests, %zu blocks\n", trace, t->nreq, t->nblocks);
    for (size_t c = 0; c < ncap && !rc; c++)
        for (const char *const *p = names; *p && !rc; p++) {
            kvs_replay_result r;
            rc = kvs_trace_replay(t, *p, cap[c], 0, &r, err, sizeof err);
            if (rc) {
                fprintf(stderr, "kvstash-sim: %s: %s\n", *p, err);
                break;
            }
            printf("policy=%s capacity=%llu hit=%.4f\n", *p, (unsigned long long)cap[c],
                   r.requested ? (double)r.hits / (double)r.requested : 0.0);
            fflush(stdout);
            if (verbose)
                fprintf(stderr, "  %s: %.2f s, %llu evictions\n", *p, r.seconds,
                        (unsigned long long)r.evictions);
        }
    kvs_trace_free(t);
    return rc ? 1 : 0;
}
