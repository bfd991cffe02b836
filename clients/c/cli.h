/*
 * cli.h — internals shared by the files of the `kvstash` command-line tool
 * (kvstash_cli.c: main, health/stats/config/calibrate; cli_data.c: lookup,
 * put, get, delete, pin, unpin; bench.c: kvstash bench). Not installed.
 *
 * Every command returns the process exit status: 0 success, 1 an error from
 * the server or the network, 2 a usage error (one line on stderr each).
 */
#ifndef KVS_CLI_H
#define KVS_CLI_H

#include "kvstash.h"

#include <stddef.h>
#include <stdint.h>

#define KVS_CLI_EXIT_USAGE 2

typedef struct cli {
    const char *server;
    const char *token;
    const char *tls_ca;   /* NULL: plaintext */
    const char *tls_cert; /* client certificate for mutual TLS, or NULL */
    const char *tls_key;
    int timeout_ms; /* -1: library defaults */
} cli;

int kvs_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "kvstash: <command>: <kvs_strerror(rc)>: <detail>" on stderr; returns 1. */
int kvs_cli_fail(const char *command, int rc, const char *detail);
/* Opens the client the global options describe; 0, or 1 after printing the error. */
int kvs_cli_connect(const cli *o, const char *command, kvs_client **out);

/* argv[0] is the command: "lookup", "put", "get", "delete", "pin", "unpin". */
int kvs_cli_is_data_command(const char *cmd);
int kvs_cli_data(const cli *o, int argc, char **argv);
/* argv[0] == "bench". */
int kvs_cli_bench(const cli *o, int argc, char **argv);

/* Help text of the data commands and of bench, for `kvstash --help`. */
extern const char kvs_cli_data_usage[];

/* ---- parsing shared by cli_data.c and bench.c ---- */

/* "--name VALUE" / "--name=VALUE" options and bare flags, then positionals. */
typedef struct kvs_cli_args {
    int n;
    const char *name[64];
    const char *value[64]; /* NULL for a flag */
    int npos;
    const char *pos[64];
} kvs_cli_args;

/* Splits argv[1..argc) (argv[0] is the command). flags: NULL-terminated names
 * (with "--") that take no value; allowed: NULL-terminated names accepted.
 * Returns 0 or prints a usage error and returns 2. */
int kvs_cli_args_parse(const char *cmd, int argc, char **argv, const char *const *flags,
                       const char *const *allowed, kvs_cli_args *a);
const char *kvs_cli_arg(const kvs_cli_args *a, const char *name); /* last value or NULL */
int kvs_cli_flag(const kvs_cli_args *a, const char *name);        /* given at all? */
/* Unsigned decimal in [lo, hi] from option name (def when absent); 0 or 2 (usage error). */
int kvs_cli_arg_u64(const char *cmd, const kvs_cli_args *a, const char *name, uint64_t lo,
                    uint64_t hi, uint64_t def, uint64_t *out);

/* The namespace options: --model --salt --layers --kv-heads --head-dim
 * --block-tokens --dtype. Their names, for `allowed` lists: */
#define KVS_CLI_NS_OPTS                                                                            \
    "--model", "--salt", "--layers", "--kv-heads", "--head-dim", "--block-tokens", "--dtype"
int kvs_cli_ns_parse(const char *cmd, const kvs_cli_args *a, kvs_ns *ns);
/* Bytes per element of ns->dtype. */
size_t kvs_cli_dtype_size(unsigned dtype);
/* Fills n elements of dtype with pseudo-random values in [-2, 2] from *seed. */
void kvs_cli_fill_random(void *dst, size_t n, unsigned dtype, uint64_t *seed);

#endif /* KVS_CLI_H */
