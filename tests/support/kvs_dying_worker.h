/*
 * kvs_dying_worker.h — a UCX worker killed in the middle of a fetch, for the
 * programs that need kvstashd's data plane to lose a peer with blocks still
 * on the wire (test_connect's "stuck" and "goodbye" suites, soak_bench's
 * churn).
 *
 * The worker is the calling program itself, run again (/proc/self/exe) with
 * KVS_DW_FLAG, so its gRPC and UCX start fresh after exec: the parent calls
 * kvs_dw_spawn, and the program's main hands an argv for which
 * kvs_dw_is_worker says 1 to kvs_dw_main before anything else. The keys
 * travel on the command line as 64 hex digits each:
 *   PROG --die-mid-fetch ADDR KEYHEX...
 * The worker connects over UCX to kvstashd at ADDR (no token), fetches every
 * block in one request in the stored format and raises SIGKILL at one layer
 * (kvs_dw_opts): no clean-up of any kind, so the server sees its peer die
 * with the rest of the request still being sent.
 *
 * Where it dies (kvs_dw_opts.thread):
 *   KVS_DW_ON_CALLER    libkvstash's own session (kvs_client_open with
 *                       opts.ucx = 1) and kvs_client_fetch, killed in its
 *                       layer callback, on the calling thread. On a loaded
 *                       machine that thread may run only after the whole
 *                       fetch has landed: the kill then leaves nothing in
 *                       flight.
 *   KVS_DW_ON_PROGRESS  a session opened by hand (Connect over the raw gRPC
 *                       core, then a transfer client, transfer/xfer.h) and
 *                       kvs_xfer_fetch, killed in the transfer's on_layer, on
 *                       its UCX progress thread, the only thread that drains
 *                       its receive queue: the kill lands while later blocks
 *                       still stream, whatever the scheduling. Receive
 *                       buffers of KVS_DW_BLOCK_CAP bytes per block.
 *
 * A program that uses it compiles kvs_dying_worker.c and
 * tests/integration/kvs_itest.c (the raw Connect), and links libkvstash,
 * kvs_transfer, kvs_proto, gRPC and kvs_test_support.
 */
#ifndef KVS_DYING_WORKER_H
#define KVS_DYING_WORKER_H

#include "kvstash.h"

#include <stdint.h>

#define KVS_DW_FLAG       "--die-mid-fetch"
#define KVS_DW_MAX_BLOCKS 64
#define KVS_DW_BLOCK_CAP  ((uint64_t)2 << 20) /* KVS_DW_ON_PROGRESS: bytes per block */

typedef enum kvs_dw_thread {
    KVS_DW_ON_CALLER = 0,
    KVS_DW_ON_PROGRESS = 1,
} kvs_dw_thread;

typedef struct kvs_dw_opts {
    kvs_dw_thread thread;
    /* It dies once layer `layer` of block `block` has landed: block >= 0
     * counts from the first block, < 0 from the end (-1: the last). */
    int block;
    unsigned layer;
    kvs_ns ns; /* KVS_DW_ON_CALLER: the blocks' namespace (kvs_client_fetch's) */
} kvs_dw_opts;

/* 1 when argv is a dying worker's (argv[1] is KVS_DW_FLAG), else 0. */
int kvs_dw_is_worker(int argc, char **argv);

/* The dying worker: argv as kvs_dw_spawn made it. Does not return when it
 * dies as asked. Otherwise its exit status: 2 argv or o is not usable (no
 * key, more than KVS_DW_MAX_BLOCKS, a key not 64 hex digits, o->block not
 * one of them); 3 the fetch came to its end without the kill; 4 no UCX (the
 * client or transfer client did not start, a buffer not allocated, or, on
 * the calling thread, the fetch fell back to gRPC); 5 Connect failed; 6 the
 * endpoint to kvstashd's worker did not connect; 7 the transfer refused the
 * fetch. 5 to 7: KVS_DW_ON_PROGRESS only. Messages on stderr. */
int kvs_dw_main(int argc, char **argv, const kvs_dw_opts *o);

/* Runs the dying worker (this program again, with argv[0] prog) against
 * kvstashd at addr for the nb blocks (1..KVS_DW_MAX_BLOCKS) of keys, and
 * waits for it. 1 when it died of its SIGKILL; else 0, with how it ended on
 * stderr. stdout and stderr are flushed first (the child inherits them). */
int kvs_dw_spawn(const char *prog, const char *addr, const unsigned char (*keys)[32], unsigned nb);

#endif /* KVS_DYING_WORKER_H */
