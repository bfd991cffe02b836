/*
 * kvstash_cli.c — the `kvstash` command-line client: health, stats and runtime
 * configuration of one kvstashd, through libkvstash; the data commands
 * (lookup, put, get, delete, pin, unpin: cli_data.c) and `bench` (bench.c);
 * and `calibrate`, which
 * needs no server: it reads KV sample files and writes a calibration profile
 * (kernels/calib/kvq_calib.h, docs/CALIBRATION.md); and `token-hash`, which
 * prints the config line that names a tenant's token by its SHA-256
 * (service/tenants.h), so the file need not hold the token.
 *
 * Exit codes: 0 success (for `health`: the service is SERVING), 1 an error
 * from the server or the network (or `health` answered but not SERVING),
 * 2 a usage error. Errors are one line on stderr:
 * "kvstash: <command>: <kvs_strerror>: <detail>".
 */
#include "cli.h"
#include "kvq_calib.h"
#include "kvstash.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVS_VERSION
#define KVS_VERSION "0.0.0"
#endif

#define DEFAULT_SERVER "127.0.0.1:50551"
#define EXIT_USAGE KVS_CLI_EXIT_USAGE

/* One line of the string per line of the help. */
/* clang-format off */
static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvstash [--server ADDR] [--token T] [--tls-ca FILE [--tls-cert F --tls-key F]]\n"
            "               [--timeout-ms N] COMMAND [ARGS]\n"
            "\n"
            "Commands:\n"
            "  health [SERVICE]                    print the serving status; exit 0 only if SERVING\n"
            "  stats [PREFIX]                      version, uptime and metrics (Prometheus text)\n"
            "  config get [NAME...]                configuration entries, all when no NAME\n"
            "  config set NAME=VALUE... [--dry-run] change runtime settings atomically\n"
            "  calibrate --out PROFILE [--scheme e4m3|e5m2|int8] [--percentile P]\n"
            "            [--block-tokens T] [--k-outliers N] [--v-outliers N] [--sinks S]\n"
            "            [--max-meta-bits B] [--key-offsets 0|1] [--model NAME] SAMPLE_FILE...\n"
            "                                      per-channel statistics of KV sample files ->\n"
            "                                      a profile of static scales (no server needed)\n"
            "  token-hash                          read a bearer token from stdin (its first\n"
            "                                      line), print its tenant line\n"
            "                                      \"token_sha256 = <hex>\" (no server needed)\n"
            "\n%s"
            "\n"
            "Options:\n"
            "  --server ADDR      kvstashd address (default: $KVSTASH_SERVER, else " DEFAULT_SERVER ")\n"
            "  --token T          bearer token sent as \"authorization: Bearer T\"\n"
            "  --tls-ca FILE      speak TLS, trusting the CA certificate(s) in FILE (PEM)\n"
            "                     (default: $KVSTASH_TLS_CA; none: plaintext)\n"
            "  --tls-cert FILE, --tls-key FILE\n"
            "                     client certificate and key for a server that requires\n"
            "                     them (tls_client_ca); default $KVSTASH_TLS_CERT, _KEY\n"
            "  --timeout-ms N     connect and per-call deadline in milliseconds\n"
            "  --help, --version\n"
            "\n"
            "Exit status: 0 success, 1 error (or not SERVING), 2 usage error.\n",
            kvs_cli_data_usage);
}
/* clang-format on */

#define usage_error kvs_cli_usage_error
#define fail kvs_cli_fail
#define connect_client kvs_cli_connect

int kvs_cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvstash: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'kvstash --help'.\n");
    va_end(ap);
    return EXIT_USAGE;
}

int kvs_cli_fail(const char *command, int rc, const char *detail)
{
    if (detail != NULL && detail[0] != '\0')
        fprintf(stderr, "kvstash: %s: %s: %s\n", command, kvs_strerror(rc), detail);
    else
        fprintf(stderr, "kvstash: %s: %s\n", command, kvs_strerror(rc));
    return 1;
}

int kvs_cli_connect(const cli *o, const char *command, kvs_client **out)
{
    kvs_client_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.target = o->server;
    opts.token = o->token;
    opts.tls_ca_file = o->tls_ca;
    opts.tls_cert_file = o->tls_cert;
    opts.tls_key_file = o->tls_key;
    opts.connect_timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 0;
    opts.call_timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 0;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_open(&opts, out, err);
    if (rc != 0)
        return fail(command, rc, err);
    return 0;
}

static int cmd_health(const cli *o, int argc, char **argv)
{
    if (argc > 2)
        return usage_error("health: unexpected argument '%s'", argv[2]);
    kvs_client *c;
    if (connect_client(o, "health", &c) != 0)
        return 1;
    char err[KVS_ERR_LEN] = "";
    kvs_health_status st = KVS_HEALTH_UNKNOWN;
    int rc = kvs_client_health(c, argc == 2 ? argv[1] : "", o->timeout_ms, &st, err);
    kvs_client_close(c);
    if (rc != 0)
        return fail("health", rc, err);
    printf("%s\n", kvs_health_status_name(st));
    return st == KVS_HEALTH_SERVING ? 0 : 1;
}

static int cmd_stats(const cli *o, int argc, char **argv)
{
    if (argc > 2)
        return usage_error("stats: unexpected argument '%s'", argv[2]);
    kvs_client *c;
    if (connect_client(o, "stats", &c) != 0)
        return 1;
    char err[KVS_ERR_LEN] = "";
    kvs_stats *s = NULL;
    int rc = kvs_client_stats(c, argc == 2 ? argv[1] : "", o->timeout_ms, &s, err);
    kvs_client_close(c);
    if (rc != 0)
        return fail("stats", rc, err);
    printf("# version: %s\n# uptime_seconds: %.3f\n", s->version, s->uptime_seconds);
    rc = kvs_stats_print(s, stdout);
    kvs_stats_free(s);
    if (rc != 0)
        return fail("stats", rc, "cannot write to stdout");
    return 0;
}

static void print_config(const kvs_config *cfg)
{
    for (size_t i = 0; i < cfg->n; i++) {
        const kvs_config_entry *e = &cfg->entries[i];
        printf("%s = %s   # %s, %s, %s\n", e->name, e->value, e->type,
               e->runtime ? "runtime" : "static", e->help);
    }
}

static int cmd_config_get(const cli *o, int argc, char **argv)
{
    kvs_client *c;
    if (connect_client(o, "config get", &c) != 0)
        return 1;
    char err[KVS_ERR_LEN] = "";
    kvs_config *cfg = NULL;
    int rc = kvs_client_get_config(c, (const char *const *)argv, (size_t)argc, o->timeout_ms,
                                   &cfg, err);
    kvs_client_close(c);
    if (rc != 0)
        return fail("config get", rc, err);
    print_config(cfg);
    kvs_config_free(cfg);
    return 0;
}

static int cmd_config_set(const cli *o, int argc, char **argv)
{
    int dry_run = 0;
    size_t n = 0;
    const char **names = calloc((size_t)argc + 1, sizeof *names);
    const char **values = calloc((size_t)argc + 1, sizeof *values);
    char **copies = calloc((size_t)argc + 1, sizeof *copies);
    int ret = 1;
    if (names == NULL || values == NULL || copies == NULL) {
        fail("config set", KVS_ENOMEM, NULL);
        goto out;
    }
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--dry-run") == 0) {
            dry_run = 1;
            continue;
        }
        char *eq = strchr(argv[i], '=');
        if (argv[i][0] == '-' || eq == NULL || eq == argv[i]) {
            ret = usage_error("config set: expected NAME=VALUE, got '%s'", argv[i]);
            goto out;
        }
        if ((copies[n] = strdup(argv[i])) == NULL) {
            fail("config set", KVS_ENOMEM, NULL);
            goto out;
        }
        copies[n][eq - argv[i]] = '\0';
        names[n] = copies[n];
        values[n] = copies[n] + (eq - argv[i]) + 1;
        n++;
    }
    if (n == 0) {
        ret = usage_error("%s", "config set: at least one NAME=VALUE is required");
        goto out;
    }
    kvs_client *c;
    if (connect_client(o, "config set", &c) != 0)
        goto out;
    char err[KVS_ERR_LEN] = "";
    kvs_config *cfg = NULL;
    int rc = kvs_client_set_config(c, names, values, n, dry_run, o->timeout_ms, &cfg, err);
    kvs_client_close(c);
    if (rc != 0) {
        fail("config set", rc, err);
        goto out;
    }
    if (dry_run)
        printf("# dry run: %zu setting(s) valid, nothing changed\n", n);
    print_config(cfg);
    kvs_config_free(cfg);
    ret = 0;
out:
    if (copies != NULL) {
        for (size_t i = 0; i < n; i++)
            free(copies[i]);
    }
    free(copies);
    free(names);
    free(values);
    return ret;
}

/* ---- calibrate ------------------------------------------------------------- */

typedef struct calib_args {
    const char *out, *model;
    kvs_calib_opts o;
    int k_set, v_set, s_set, koff_set; /* given on the command line: not replaced by the
                                        * suggestion */
    char **files;
    int nfiles;
} calib_args;

static int parse_uint_arg(const char *s, unsigned max, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || s[0] == '+' || v > max)
        return -1;
    *out = (unsigned)v;
    return 0;
}

/* Options may come as "--name VALUE" or "--name=VALUE", before or after files. */
static int parse_calib_args(int argc, char **argv, calib_args *a)
{
    memset(a, 0, sizeof *a);
    kvs_calib_opts_default(&a->o);
    a->files = calloc((size_t)argc + 1, sizeof *a->files);
    if (a->files == NULL)
        return fail("calibrate", KVS_ENOMEM, NULL);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || strcmp(arg, "--") == 0) {
            if (strcmp(arg, "--") == 0) {
                while (++i < argc)
                    a->files[a->nfiles++] = argv[i];
                break;
            }
            a->files[a->nfiles++] = argv[i];
            continue;
        }
        char name[32];
        const char *val = strchr(arg, '=');
        size_t n = val ? (size_t)(val - arg) : strlen(arg);
        if (n >= sizeof name)
            return usage_error("calibrate: unknown option '%s'", arg);
        memcpy(name, arg, n);
        name[n] = '\0';
        if (val) {
            val++;
        } else {
            if (i + 1 >= argc)
                return usage_error("calibrate: %s needs a value", name);
            val = argv[++i];
        }
        unsigned u;
        if (strcmp(name, "--out") == 0) {
            a->out = val;
        } else if (strcmp(name, "--model") == 0) {
            a->model = val;
        } else if (strcmp(name, "--scheme") == 0) {
            if (kvs_scheme_parse(val, &a->o.scheme) != 0 || a->o.scheme == KVS_SCHEME_FP16)
                return usage_error("calibrate: --scheme: expected e4m3, e5m2 or int8, got '%s'",
                                   val);
        } else if (strcmp(name, "--percentile") == 0) {
            char *end;
            errno = 0;
            double p = strtod(val, &end);
            if (errno != 0 || end == val || *end != '\0' || !(p > 0.0 && p <= 100.0))
                return usage_error("calibrate: --percentile: expected a number in (0, 100], "
                                   "got '%s'",
                                   val);
            a->o.percentile = p;
        } else if (strcmp(name, "--max-meta-bits") == 0) {
            char *end;
            errno = 0;
            double b = strtod(val, &end);
            if (errno != 0 || end == val || *end != '\0' || !(b >= 0.0 && b <= 64.0))
                return usage_error("calibrate: --max-meta-bits: expected a number in [0, 64], "
                                   "got '%s'",
                                   val);
            a->o.meta_budget = b;
        } else if (strcmp(name, "--block-tokens") == 0) {
            if (parse_uint_arg(val, KVS_BLOCK_MAX_TOKENS, &u) != 0 || u < KVS_BLOCK_MIN_TOKENS)
                return usage_error("calibrate: --block-tokens: expected 16..1024, got '%s'", val);
            a->o.block_tokens = u;
        } else if (strcmp(name, "--k-outliers") == 0) {
            if (parse_uint_arg(val, KVS_TILE_MAX_OUTLIERS, &u) != 0)
                return usage_error("calibrate: --k-outliers: expected 0..16, got '%s'", val);
            a->o.k_outliers = u;
            a->k_set = 1;
        } else if (strcmp(name, "--v-outliers") == 0) {
            if (parse_uint_arg(val, KVS_TILE_MAX_OUTLIERS, &u) != 0)
                return usage_error("calibrate: --v-outliers: expected 0..16, got '%s'", val);
            a->o.v_outliers = u;
            a->v_set = 1;
        } else if (strcmp(name, "--sinks") == 0) {
            if (parse_uint_arg(val, KVS_TILE_MAX_SINKS, &u) != 0)
                return usage_error("calibrate: --sinks: expected 0..64, got '%s'", val);
            a->o.sinks = u;
            a->s_set = 1;
        } else if (strcmp(name, "--key-offsets") == 0) {
            if (parse_uint_arg(val, 1, &u) != 0)
                return usage_error("calibrate: --key-offsets: expected 0 or 1, got '%s'", val);
            a->o.key_offsets = u;
            a->koff_set = 1;
        } else {
            return usage_error("calibrate: unknown option '%s'", name);
        }
    }
    if (a->out == NULL)
        return usage_error("%s", "calibrate: --out PROFILE is required");
    if (a->nfiles == 0)
        return usage_error("%s", "calibrate: at least one SAMPLE_FILE is required");
    if (a->o.sinks > a->o.block_tokens)
        return usage_error("%s", "calibrate: --sinks: more than --block-tokens");
    return 0;
}

/* One pass over every file. */
static int calib_pass(const calib_args *a, const kvs_calib_opts *o, kvs_calib **out)
{
    char err[KVS_ERR_LEN] = "";
    kvs_calib *c = NULL;
    int rc = kvs_calib_create(o, &c, err);
    if (rc != 0)
        return fail("calibrate", rc, err);
    for (int i = 0; i < a->nfiles; i++) {
        kvs_sample *s = NULL;
        rc = kvs_sample_read(a->files[i], &s, err);
        if (rc == 0) {
            rc = kvs_calib_add(c, s, err);
            kvs_sample_free(s);
            if (rc != 0) { /* name the file: calibration messages do not */
                kvs_calib_free(c);
                fprintf(stderr, "kvstash: calibrate: %s: %s: %s\n", kvs_strerror(rc), a->files[i],
                        err);
                return 1;
            }
        }
        if (rc != 0) {
            kvs_calib_free(c);
            return fail("calibrate", rc, err);
        }
    }
    *out = c;
    return 0;
}

static int cand_index(uint32_t k)
{
    for (int i = 0; i < KVS_CALIB_NUM_K; i++)
        if (kvs_calib_k_candidates[i] == k)
            return i;
    return -1;
}

static int cmp_float_asc(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

static void print_calib_summary(const calib_args *a, const kvs_calib *c,
                                const kvs_calib_suggestion *sg, const kvs_profile *p)
{
    const uint32_t L = p->num_layers, H = p->num_kv_heads, D = p->head_dim;
    printf("calibrate: %llu sample(s), %llu tokens; model %s; %u layers x %u kv heads x "
           "head_dim %u, %s, keys %s\n",
           (unsigned long long)kvs_calib_samples(c), (unsigned long long)kvs_calib_tokens(c),
           p->model, L, H, D, kvs_dtype_name(p->dtype), p->post_rope ? "post-RoPE" : "pre-RoPE");
    printf("scheme %s, block_tokens %u, static scale = p%g of non-outlier |x| / qmax\n",
           kvs_scheme_name(p->scheme), p->block_tokens, p->percentile);
    printf("relative error measured per k (0 1 2 4), mean over layers:\n  K:");
    for (int i = 0; i < KVS_CALIB_NUM_K; i++)
        printf(" %.3e", sg->k_err[i]);
    printf("\n  V:");
    for (int i = 0; i < KVS_CALIB_NUM_K; i++)
        printf(" %.3e", sg->v_err[i]);
    printf("\n  K with key offsets:");
    for (int i = 0; i < KVS_CALIB_NUM_K; i++)
        printf(" %.3e", sg->k_err_koff[i]);
    printf("\nkey offsets at k=%u v=%u: K error x%.3f (%.1f %% less) for %.2f %% more bytes: "
           "%s\n",
           sg->k_outliers, sg->v_outliers, sg->koff_err_ratio, 100.0 * (1.0 - sg->koff_err_ratio),
           100.0 * sg->koff_bytes, sg->key_offsets ? "suggested" : "not suggested");
    printf("suggested k=%u v=%u sinks=%u key_offsets=%d (%s; %s); profile uses k=%u v=%u "
           "sinks=%u key_offsets=%u\n",
           sg->k_outliers, sg->v_outliers, sg->sinks, sg->key_offsets,
           sg->budget_met ? "within the metadata budget" : "the scales alone exceed the budget",
           sg->sinks_measured ? "sinks measured" : "no sequence-start samples", p->k_outliers,
           p->v_outliers, p->sinks, p->key_offsets);
    printf("%5s %10s %9s %7s %10s %10s %10s %10s %10s %12s %12s\n", "layer", "K amax", "K chan x",
           "K bias", "K p99.9", "V amax", "V p99.9", "K err", "V err", "K tensor sc",
           "V tensor sc");
    double bias_sum = 0;
    float *ch = malloc(sizeof(float) * (size_t)H * D);
    const int ki = cand_index(p->k_outliers), vi = cand_index(p->v_outliers);
    for (uint32_t l = 0; l < L && ch; l++) {
        float kp = 0, vp = 0;
        for (uint32_t h = 0; h < H; h++) {
            kvs_calib_stats st;
            for (uint32_t d = 0; d < D; d++) {
                kvs_calib_k_stats(c, l, h, d, &st);
                ch[h * D + d] = st.amax;
                kp = st.p999 > kp ? st.p999 : kp;
            }
            kvs_calib_v_stats(c, l, h, &st);
            vp = st.p999 > vp ? st.p999 : vp;
        }
        qsort(ch, (size_t)H * D, sizeof *ch, cmp_float_asc);
        float med = ch[(size_t)H * D / 2];
        /* How far the largest K channel stands out: max / median channel amax. */
        double ratio = med > 0 ? ch[(size_t)H * D - 1] / (double)med : 0.0;
        double ke = -1, ve = -1, kb = 0;
        kvs_calib_k_bias(c, l, &kb);
        bias_sum += kb;
        if (ki >= 0)
            kvs_calib_layer_error(c, l, KVS_TILE_K, ki, &ke);
        if (vi >= 0)
            kvs_calib_layer_error(c, l, KVS_TILE_V, vi, &ve);
        printf("%5u %10.4g %9.1f %7.3f %10.4g %10.4g %10.4g %10.3e %10.3e %12.4g %12.4g\n", l,
               (double)p->layers[l].k_amax, ratio, kb, (double)kp, (double)p->layers[l].v_amax,
               (double)vp, ke, ve, (double)p->layers[l].k_tensor_scale,
               (double)p->layers[l].v_tensor_scale);
    }
    free(ch);
    printf("(K p99.9 and V p99.9: the largest over heads and channels; K/V err: relative "
           "reconstruction error at the profile's k, dynamic scales; K bias: the share of K's "
           "energy in its tiles' per-channel means, mean over layers %.3f; with 32-token tiles "
           "stories260K gives 0.11-0.18 per layer and stories15M 0.52-0.65, where key offsets "
           "cut KL to 0.33-0.35x, against 0.67-0.72x on stories260K, docs/QUALITY.md §10)\n",
           L ? bias_sum / L : 0.0);
    printf("wrote %s\n", a->out);
}

static int cmd_calibrate(int argc, char **argv)
{
    calib_args a;
    int ret = parse_calib_args(argc, argv, &a);
    if (ret != 0) {
        free(a.files);
        return ret;
    }
    kvs_calib *c = NULL;
    kvs_profile *p = NULL;
    char err[KVS_ERR_LEN] = "";
    ret = 1;
    if (calib_pass(&a, &a.o, &c) != 0)
        goto out;
    kvs_calib_suggestion sg;
    int rc = kvs_calib_suggest(c, &sg);
    if (rc != 0) {
        fail("calibrate", rc, "no statistics");
        goto out;
    }
    /* The suggestion replaces what was not given; the scale statistics depend
     * on k and S, so a changed setting takes a second pass over the files. */
    kvs_calib_opts o = a.o;
    if (!a.k_set)
        o.k_outliers = sg.k_outliers;
    if (!a.v_set)
        o.v_outliers = sg.v_outliers;
    if (!a.s_set)
        o.sinks = sg.sinks;
    if (!a.koff_set) /* the statistics do not depend on it: no second pass for it */
        o.key_offsets = (uint32_t)sg.key_offsets;
    if (o.k_outliers != a.o.k_outliers || o.v_outliers != a.o.v_outliers || o.sinks != a.o.sinks) {
        kvs_calib *c2 = NULL;
        if (calib_pass(&a, &o, &c2) != 0)
            goto out;
        kvs_calib_free(c);
        c = c2;
    }
    rc = kvs_calib_profile(c, a.model, &p, err);
    if (rc == 0) {
        p->key_offsets = o.key_offsets; /* c may be the first pass's, made without it */
        rc = kvs_profile_write(a.out, p, err);
    }
    if (rc != 0) {
        fail("calibrate", rc, err);
        goto out;
    }
    print_calib_summary(&a, c, &sg, p);
    ret = 0;
out:
    kvs_profile_free(p);
    kvs_calib_free(c);
    free(a.files);
    return ret;
}

/* `kvstash token-hash`: a tenant's token, read from the first line of stdin
 * (not argv, which ps and shell histories show; a "\n" or "\r\n" ending it is
 * not part of it), becomes the line "token_sha256 = <64 hex digits>" for its
 * [tenant.NAME] section. The token must be what a `token =` line accepts
 * (8..255 printable bytes, no space: service/tenants.c), so a token that
 * kvstashd would refuse is refused here rather than hashed; it is never
 * echoed. Exit 0, 1 for a bad token, 2 for an argument. */
#define TOKEN_MAX 255 /* KVS_TENANT_TOKEN_MAX of service/tenants.h */

static int cmd_token_hash(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) /* not named: it may be the token itself */
        return usage_error("token-hash: takes no argument (the token is read from stdin)");
    char buf[TOKEN_MAX + 3]; /* the token, "\r\n", NUL */
    size_t n = 0;
    int c = 0, ret = 1;
    while (n < sizeof buf - 1 && (c = getchar()) != EOF && c != '\n')
        buf[n++] = (char)c;
    if (n > 0 && buf[n - 1] == '\r' && c == '\n')
        n--;
    int printable = 1;
    for (size_t i = 0; i < n; i++)
        printable &= buf[i] >= 0x21 && buf[i] <= 0x7e;
    uint8_t md[32];
    unsigned int mdlen = 0;
    if (ferror(stdin)) {
        fail("token-hash", KVS_EIO, "cannot read stdin");
    } else if (n < 8 || n > TOKEN_MAX || (c != '\n' && c != EOF)) {
        char why[96];
        snprintf(why, sizeof why, "the token on stdin's first line must be 8..%d bytes", TOKEN_MAX);
        fail("token-hash", KVS_EINVAL, why);
    } else if (!printable) {
        fail("token-hash", KVS_EINVAL, "the token must be printable bytes without spaces");
    } else if (EVP_Digest(buf, n, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != sizeof md) {
        fail("token-hash", KVS_EINTERNAL, "OpenSSL cannot hash");
    } else {
        printf("token_sha256 = ");
        for (size_t i = 0; i < sizeof md; i++)
            printf("%02x", md[i]);
        printf("\n");
        ret = fflush(stdout) == 0 ? 0 : fail("token-hash", KVS_EIO, "cannot write stdout");
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return ret;
}

static int parse_timeout(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0 || v > INT_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    cli o = {.server = getenv("KVSTASH_SERVER"),
             .token = NULL,
             .tls_ca = getenv("KVSTASH_TLS_CA"),
             .tls_cert = getenv("KVSTASH_TLS_CERT"),
             .tls_key = getenv("KVSTASH_TLS_KEY"),
             .timeout_ms = -1};
    if (o.server == NULL || o.server[0] == '\0')
        o.server = DEFAULT_SERVER;

    enum { OPT_SERVER = 256, OPT_TOKEN, OPT_TIMEOUT, OPT_VERSION, OPT_TLS_CA, OPT_TLS_CERT,
           OPT_TLS_KEY };
    static const struct option longopts[] = {
        {"server", required_argument, NULL, OPT_SERVER},
        {"token", required_argument, NULL, OPT_TOKEN},
        {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
        {"tls-ca", required_argument, NULL, OPT_TLS_CA},
        {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
        {"tls-key", required_argument, NULL, OPT_TLS_KEY},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    opterr = 0;
    int ch;
    /* '+': stop at the command, its own arguments may start with '-'. */
    while ((ch = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
        switch (ch) {
        case OPT_SERVER:
            o.server = optarg;
            break;
        case OPT_TOKEN:
            o.token = optarg;
            break;
        case OPT_TLS_CA:
            o.tls_ca = optarg;
            break;
        case OPT_TLS_CERT:
            o.tls_cert = optarg;
            break;
        case OPT_TLS_KEY:
            o.tls_key = optarg;
            break;
        case OPT_TIMEOUT:
            if (parse_timeout(optarg, &o.timeout_ms) != 0)
                return usage_error("--timeout-ms: not a non-negative integer: '%s'", optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        case OPT_VERSION:
            printf("kvstash %s\n", KVS_VERSION);
            return 0;
        default:
            return usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    argc -= optind;
    argv += optind;
    if (argc == 0)
        return usage_error("%s", "missing COMMAND");
    if (o.server[0] == '\0')
        return usage_error("%s", "--server: empty address");

    const char *cmd = argv[0];
    if (strcmp(cmd, "calibrate") == 0)
        return cmd_calibrate(argc, argv);
    if (strcmp(cmd, "token-hash") == 0)
        return cmd_token_hash(argc, argv);
    if (strcmp(cmd, "health") == 0)
        return cmd_health(&o, argc, argv);
    if (strcmp(cmd, "stats") == 0)
        return cmd_stats(&o, argc, argv);
    if (strcmp(cmd, "config") == 0) {
        if (argc >= 2 && strcmp(argv[1], "get") == 0)
            return cmd_config_get(&o, argc - 2, argv + 2);
        if (argc >= 2 && strcmp(argv[1], "set") == 0)
            return cmd_config_set(&o, argc - 2, argv + 2);
        return usage_error("config: expected 'get' or 'set', got '%s'",
                           argc >= 2 ? argv[1] : "");
    }
    if (kvs_cli_is_data_command(cmd))
        return kvs_cli_data(&o, argc, argv);
    if (strcmp(cmd, "bench") == 0)
        return kvs_cli_bench(&o, argc, argv);
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    return usage_error("unknown command '%s'", cmd);
}
