/*
 * kvstash_cli.c — the `kvstash` command-line client: health, stats and runtime
 * configuration of one kvstashd, through libkvstash.
 *
 * Exit codes: 0 success (for `health`: the service is SERVING), 1 an error
 * from the server or the network (or `health` answered but not SERVING),
 * 2 a usage error. Errors are one line on stderr:
 * "kvstash: <command>: <kvs_strerror>: <detail>".
 */
#include "kvstash.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVS_VERSION
#define KVS_VERSION "0.0.0"
#endif

#define DEFAULT_SERVER "127.0.0.1:50551"
#define EXIT_USAGE 2

typedef struct cli {
    const char *server;
    const char *token;
    int timeout_ms; /* -1: library defaults */
} cli;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvstash [--server ADDR] [--token T] [--timeout-ms N] COMMAND [ARGS]\n"
            "\n"
            "Commands:\n"
            "  health [SERVICE]                    print the serving status; exit 0 only if SERVING\n"
            "  stats [PREFIX]                      version, uptime and metrics (Prometheus text)\n"
            "  config get [NAME...]                configuration entries, all when no NAME\n"
            "  config set NAME=VALUE... [--dry-run] change runtime settings atomically\n"
            "\n"
            "Options:\n"
            "  --server ADDR      kvstashd address (default: $KVSTASH_SERVER, else " DEFAULT_SERVER ")\n"
            "  --token T          bearer token sent as \"authorization: Bearer T\"\n"
            "  --timeout-ms N     connect and per-call deadline in milliseconds\n"
            "  --help, --version\n"
            "\n"
            "Exit status: 0 success, 1 error (or not SERVING), 2 usage error.\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvstash: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'kvstash --help'.\n");
    va_end(ap);
    return EXIT_USAGE;
}

static int fail(const char *command, int rc, const char *detail)
{
    if (detail != NULL && detail[0] != '\0')
        fprintf(stderr, "kvstash: %s: %s: %s\n", command, kvs_strerror(rc), detail);
    else
        fprintf(stderr, "kvstash: %s: %s\n", command, kvs_strerror(rc));
    return 1;
}

static int connect_client(const cli *o, const char *command, kvs_client **out)
{
    kvs_client_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.target = o->server;
    opts.token = o->token;
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
    cli o = {.server = getenv("KVSTASH_SERVER"), .token = NULL, .timeout_ms = -1};
    if (o.server == NULL || o.server[0] == '\0')
        o.server = DEFAULT_SERVER;

    enum { OPT_SERVER = 256, OPT_TOKEN, OPT_TIMEOUT, OPT_VERSION };
    static const struct option longopts[] = {
        {"server", required_argument, NULL, OPT_SERVER},
        {"token", required_argument, NULL, OPT_TOKEN},
        {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
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
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    return usage_error("unknown command '%s'", cmd);
}
