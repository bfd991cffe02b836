/*
 * xfer.h — the UCX data plane: layer-streamed fetch and put of KV blocks
 * between a cache node (kvs_xfer_server) and inference workers
 * (kvs_xfer_client). DESIGN.md §7, docs/TRANSFER.md.
 *
 * The idea: UCX active messages carry small headers (which block, which
 * layer, which byte range); the bytes themselves travel by rendezvous straight
 * into the receiver's buffer (ucp_am_recv_data_nbx), so a 32 MiB block is never
 * copied through a bounce buffer on either side. A fetch streams a block layer
 * by layer; the client verifies each layer and reports it in order, so a
 * worker can start on layer 0 while later layers are still on the wire.
 *
 * Threads: each kvs_xfer_server and kvs_xfer_client owns one UCX context and
 * worker, driven by one progress thread that sleeps on the worker's event fd
 * (ucp_worker_arm + epoll). Every other thread hands work to it through a
 * queue and ucp_worker_signal. All callbacks below — the store callbacks of a
 * server, the completion callbacks of a client — run on that progress thread:
 * they must not block, and must not call kvs_xfer_*_destroy,
 * kvs_xfer_server_session_open/close or kvs_xfer_client_connect (those drive
 * UCX progress, which UCX forbids inside its callbacks). Starting a fetch or
 * a put from a callback is fine.
 *
 * Connect: the worker addresses are exchanged by the caller (the service's
 * Connect RPC): the client gives kvs_xfer_client_address() to the server,
 * which opens a session (kvs_xfer_server_session_open) and returns its own
 * address, the session id and a random token; the client then calls
 * kvs_xfer_client_connect. Every request carries (session id, token); a wrong
 * pair gets an KVS_EUNAUTH reply and the server keeps serving.
 *
 * Failure: endpoints use UCX peer error handling by default. When a client
 * dies mid-fetch, the server's release callback still runs for every block it
 * provided (no leaked references); an operation that does not finish within
 * the server's op_timeout_ms closes its session the same way. A client whose
 * endpoint failed or timed out fails every pending operation with a status and
 * keeps that status (kvs_xfer_client_status): the caller falls back to gRPC.
 *
 * Statuses: every function returns 0 or a negative KVS_E* (common/kvs_error.h).
 * When an asynchronous call returns an error its callbacks are never called.
 */
#ifndef KVS_XFER_H
#define KVS_XFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_XFER_KEY_LEN    32    /* block keys (SHA-256 chain keys, KEYSPEC.md) */
#define KVS_XFER_TOKEN_LEN  16    /* session token bytes */
#define KVS_XFER_MAX_BLOCKS 1024u /* blocks in one fetch request */
#define KVS_XFER_MAX_LAYERS 4096u /* layers (messages) of one block */
/* Bytes of put metadata (parent key, namespace, token ids: what the store
 * needs to place a block; opaque to transfer/). It rides in the active
 * message header, which UCX 1.13 caps at about 8 KiB (ucp_worker_query
 * max_am_header: 8140 tcp, 8114 posix): 32 + 8 + 1024 * 4 token bytes fit. */
#define KVS_XFER_MAX_META 6144u
/* Bytes of a block's seal (kvs_xfer_block_src.seal): it rides in the header
 * of the block's layer-0 message, under the same cap. */
#define KVS_XFER_MAX_SEAL 6144u
/* Bytes of a fetch request's nonce (kvs_xfer_fetch_req.nonce): opaque here,
 * sent with the request and handed to provide for each of its blocks. */
#define KVS_XFER_NONCE_LEN 16u

/* Formats of the bytes a fetch asks for. KVS_XFER_FMT_STORED is the encoded
 * block of kv_block.h: the client checks its header and every tile checksum.
 * Any other value is passed through to the server's provide callback (e.g. a
 * per-tensor FP8 egress form); for those the server sends an XXH3-64 of each
 * layer and the client checks it. */
#define KVS_XFER_FMT_STORED 0u

/* Shared memory only (opts.tls): what kvstashd and libkvstash use when the
 * server is on loopback and the operator set neither UCX_TLS nor
 * UCX_NET_DEVICES. UCX 1.13's tcp transport aborts on 13 crafted bytes to
 * its port (docs/TRANSFER.md "Sessions"); with these no UCX tcp port exists. */
#define KVS_XFER_TLS_SHM "posix,sysv,self"

/* Where a fetch destination lives. CUDA destinations are filled through
 * pinned host staging buffers (double buffered) and need a build with
 * KVS_CUDA_ENABLED; elsewhere they give KVS_EUNIMPL. */
typedef enum kvs_xfer_mem {
    KVS_XFER_MEM_HOST = 0,
    KVS_XFER_MEM_CUDA = 1,
} kvs_xfer_mem;

/* Endpoint error handling (docs/TRANSFER.md, "Error handling"). PEER gives
 * failure callbacks (a dead peer is detected and its resources released) at
 * the cost of shared-memory lanes unless UCX_MM_ERROR_HANDLING=y is set;
 * NONE keeps every lane but a dead peer is only noticed by a timeout. */
typedef enum kvs_xfer_err_mode {
    KVS_XFER_ERR_PEER = 0,
    KVS_XFER_ERR_NONE = 1,
} kvs_xfer_err_mode;

/* ---- server ------------------------------------------------------------ */

typedef struct kvs_xfer_server kvs_xfer_server;

/* A block the store lends to the server for one fetch. */
typedef struct kvs_xfer_block_src {
    const void *bytes; /* len bytes, readable until release(ctx, ref) */
    uint64_t len;
    /* KVS_XFER_FMT_STORED: leave layers 0 and bounds NULL; the server reads
     * the layer ranges from the block header (kvs_block_layer_range).
     * Other formats: layers >= 1 and bounds[0..layers] with bounds[0] = 0,
     * strictly increasing, bounds[layers] = len; borrowed until release. */
    uint32_t layers;
    const uint64_t *bounds;
    void *ref; /* handed back to release */
    /* Optional, opaque here: seal_len (1..KVS_XFER_MAX_SEAL) bytes the
     * client gets with the block (kvs_xfer_dst.seal) before its layer 0 is
     * reported, e.g. kvstashd's tags over each layer (docs/TRANSFER.md
     * "Sealed fetches"); borrowed until release. seal_len 0: none. A longer
     * seal fails the block (KVS_EINTERNAL). */
    const void *seal;
    uint32_t seal_len;
} kvs_xfer_block_src;

/* What a put's answer carries besides its status: the key the store filed
 * the block under (it may differ from the key the client sent: kvstashd
 * derives chain keys from the tenant's secret), its stored size, and a tag
 * the store may set so its client can check the answer (opaque here:
 * kvstashd's seal of the reply, common/kvs_putmac.h). */
#define KVS_XFER_REPLY_TAG_LEN 16
typedef struct kvs_xfer_put_reply {
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t stored_bytes;
    uint8_t tag[KVS_XFER_REPLY_TAG_LEN];
} kvs_xfer_put_reply;

/* The server's interface to the store. Every callback runs on the server's
 * progress thread. session_data is what kvs_xfer_server_session_open was
 * given (e.g. the tenant the session is bound to). */
typedef struct kvs_xfer_store_ops {
    void *ctx;
    /* Fetch: find key in format fmt. 0 and *src filled: the server holds the
     * reference until it calls release (always exactly once, whether the
     * client got the bytes, died, or timed out). A negative KVS_E* is sent to
     * the client as that block's status (KVS_ENOTFOUND for an unknown key).
     * nonce: the request's (kvs_xfer_fetch_req.nonce, as the client sent it;
     * borrowed for the call), e.g. for a seal that binds the request. */
    int (*provide)(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                   const uint8_t nonce[KVS_XFER_NONCE_LEN], kvs_xfer_block_src *src);
    void (*release)(void *ctx, void *ref);
    /* Optional: lend a block from another thread (e.g. a format the store
     * renders, which would otherwise hold this thread and every other
     * session). 1: declined, the server calls provide now. 0: pending; the
     * store calls kvs_xfer_server_provide_done(server, handle, ...) exactly
     * once later, from any thread (kvs_xfer_server_destroy waits for every
     * pending one). A negative KVS_E*: that block fails with it. */
    int (*provide_async)(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN],
                         uint32_t fmt, const uint8_t nonce[KVS_XFER_NONCE_LEN], void *handle);
    /* Put: the client offers len bytes for key in format fmt, with meta_len
     * bytes of metadata (untrusted, borrowed for the call; the service
     * defines their layout). 0 with *buf (len writable bytes, valid until
     * put_end) and *ref: the bytes land in *buf. A negative KVS_E* refuses
     * the put with that status (put_end is not called); *reply (zeroed) is
     * sent with the refusal (e.g. the key of a block cached already, with
     * KVS_EEXIST). May be NULL: puts are refused with KVS_EUNIMPL. */
    int (*put_begin)(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN],
                     uint32_t fmt, const void *meta, size_t meta_len, uint64_t len, void **buf,
                     void **ref, kvs_xfer_put_reply *reply);
    /* Optional: begin a put on another thread (e.g. kvstash-xferd's, whose
     * store is in its parent process: a round trip that would otherwise hold
     * this thread and every other session). Arguments as put_begin's; meta
     * is borrowed for the call only (copy what is needed later). 1: declined,
     * the server calls put_begin now. 0: pending; the store calls
     * kvs_xfer_server_put_begun(server, handle, ...) exactly once later, from
     * any thread, with what put_begin would have returned and filled in
     * (kvs_xfer_server_destroy waits for every pending one). A negative
     * KVS_E* refuses the put at once (without a reply). A put begun with
     * status 0 is ended by put_end or put_end_async as any other, also when
     * its session closed while the begin was pending (put_end with
     * KVS_ECANCELED, possibly after session_end). A session has at most 256
     * begins pending; further puts are refused with KVS_ENOSPC. */
    int (*put_begin_async)(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN],
                           uint32_t fmt, const void *meta, size_t meta_len, uint64_t len,
                           void *handle);
    /* Called once per successful put_begin: status 0 when every byte landed,
     * else the failure (peer gone, timeout). Returns the status the client
     * gets (e.g. KVS_EFORMAT when the store rejects the block's contents)
     * and may fill *reply (zeroed), which the client gets with it. */
    int (*put_end)(void *ctx, void *ref, int status, kvs_xfer_put_reply *reply);
    /* Optional: end a put whose every byte landed (put_end's status 0) on
     * another thread (e.g. its quantization, which would otherwise hold this
     * thread and every other session). 1: declined, the server calls put_end
     * now. 0: pending; the store calls kvs_xfer_server_put_done(server,
     * handle, ...) exactly once later, from any thread, with what put_end
     * would have returned and filled in (kvs_xfer_server_destroy waits for
     * every pending one). *buf stays the store's until then: UCX is done
     * with it. A put that failed (status != 0) always goes to put_end. */
    int (*put_end_async)(void *ctx, void *ref, void *handle);
    /* Optional: the session given session_data has closed (its client
     * failed or timed out, or session_close); no callback names it after.
     * Every block provided for it has been released by then, except a
     * provide_async the store has not finished (released when it does). A
     * put still receiving is ended (KVS_ECANCELED) only when UCX has
     * completed its receive, or at destroy: the peer's bytes may land in its
     * buffer until then. With opts.isolate, blocks the child has not given
     * back by its session's end are released then (a child that keeps them
     * is misbehaving), and a provide completed after it is released at once. Called once per
     * session: on the progress thread, or with opts.isolate on the thread that serves the child (a
     * session that ended there, or every session of a child that died) or on session_close's
     * caller. */
    void (*session_end)(void *ctx, void *session_data);
} kvs_xfer_store_ops;

/* Memory of this process that an isolated data plane (opts.isolate) may
 * read in place: a file descriptor of a shared mapping (memfd) of len bytes,
 * mapped here at base. A block provide lends from inside it is sent without
 * a copy; any other block is copied into the bounce region first. The data
 * plane process gets a read-only descriptor of it, and create seals the
 * memfd (F_SEAL_FUTURE_WRITE, F_SEAL_SHRINK, F_SEAL_GROW; create it with
 * MFD_ALLOW_SEALING, else it runs unsealed with a warning): the caller still
 * writes through the mappings it has, but can no longer map it writable
 * again, write through a descriptor, or resize it. */
typedef struct kvs_xfer_shared {
    int fd;
    const void *base;
    uint64_t len; /* 0: none */
} kvs_xfer_shared;

typedef struct kvs_xfer_server_opts {
    kvs_xfer_store_ops ops;     /* copied; provide and release required */
    kvs_xfer_err_mode err_mode; /* of the endpoints to clients */
    uint32_t op_timeout_ms;     /* 0: 30000. A fetch or put older than this closes its session */
    uint32_t window;            /* layer messages in flight per session; 0: 4 (more are queued) */
    /* Layers after layer 0 are grouped into messages of at least this many
     * bytes (0: 256 KiB); the client still verifies and reports layer by
     * layer. 1 sends every layer alone. */
    uint64_t min_msg_bytes;
    /* Progress thread: while operations are in flight it keeps polling UCX
     * for up to spin µs after the last event before it sleeps (an epoll
     * wake per event halves streaming bandwidth); with none in flight it
     * sleeps at once. 0: KVS_UCX_SPIN_US from the environment, else 200.
     * UINT32_MAX: never sleep (busy polling, a core per process). */
    uint32_t spin;
    /* The network devices UCX may listen and connect on (UCX_NET_DEVICES
     * syntax, e.g. "lo" or "eth0,lo"; read during create only). NULL or "": every
     * device UCX finds, which includes a tcp listening socket on each
     * interface. Ignored when the environment sets UCX_NET_DEVICES. Shared
     * memory transports are not network devices and are not affected. */
    const char *net_devices;
    /* The UCX transports (UCX_TLS syntax; read during create only), for
     * shared-memory-only lists such as "posix,sysv,self": with it,
     * UCX_MM_ERROR_HANDLING=y is set too (unless the environment sets it), so
     * posix and sysv stay usable under peer error handling, and no UCX tcp
     * port is opened (kvstashd on loopback: docs/TRANSFER.md "Sessions").
     * NULL or "": UCX's choice. Ignored when the environment sets UCX_TLS. */
    const char *tls;
    /* The address check (docs/TRANSFER.md "Sessions"): path of the
     * kvstash-ucx-addrcheck helper. UCX parses a worker address without a
     * length and aborts the process on some malformed ones, so with a path
     * set every client address is first tried in that separate process (an
     * endpoint is created to it and wired up for at most addr_check_ms, then
     * closed); an address that kills the helper gets KVS_EINVAL and never
     * reaches this process's UCX. The helper is started on the first
     * session_open, reads the same UCX environment and is given net_devices
     * and err_mode. NULL or "": no check. */
    const char *addr_check;
    uint32_t addr_check_ms; /* 0: 100; with isolate at most 6000 are used */
    /* Isolation (docs/TRANSFER.md "Isolation"): path of kvstash-xferd. With
     * it, UCX runs in that child process and never in this one: bytes that
     * abort UCX end the child, which is started again (at most 5 times in 10
     * s; its sessions fail, and clients fall back to gRPC or Connect again),
     * while the store stays here. The store callbacks run on a thread of this
     * process that reads the child's requests; blocks travel through shared
     * memory (shared below, else the bounce region). NULL or "": UCX in this
     * process. */
    const char *isolate;
    kvs_xfer_shared shared;
    uint64_t bounce_bytes; /* 0: 256 MiB (address space; pages on use) */
    /* Watchdog of the shared-memory receive queue (docs/TRANSFER.md
     * "Failure handling"). A peer killed while it writes a message into
     * this worker's shared-memory FIFO (UCX posix/sysv) leaves a slot that is
     * taken but never filled; the reader waits on it for good, so no client
     * reaches this server over shared memory any more. With probe_ms > 0 a
     * second worker of this process sends a probe to this one every probe_ms
     * over the same transports; one still unread after wedge_ms of progress
     * (0: 10000) calls on_wedged(wedged_arg) once, on the progress thread
     * (kvstash-xferd exits, and kvstashd starts a fresh one). 0: off. Not
     * with isolate (the child runs its own). */
    uint32_t probe_ms;
    uint32_t wedge_ms;
    void (*on_wedged)(void *arg);
    void *wedged_arg;
    /* Sends to dead peers that UCX never completes (docs/TRANSFER.md
     * "Failure handling"): over shared memory each keeps the dead peer's
     * segments mapped and the worker busy. An orphan (see stats.orphans)
     * still pending stuck_ms (0: 10000) after its session closed is stuck;
     * with stuck_max > 0, on_stuck(stuck_arg, stuck) is called once, on the
     * progress thread, when stuck_max are, or when one is while no session is
     * open (kvstash-xferd exits, and kvstashd starts a fresh one). 0: off.
     * Not with isolate (the child runs its own). */
    uint32_t stuck_max;
    uint32_t stuck_ms;
    void (*on_stuck)(void *arg, uint64_t stuck);
    void *stuck_arg;
} kvs_xfer_server_opts;

typedef struct kvs_xfer_session_info {
    uint64_t id;
    uint8_t token[KVS_XFER_TOKEN_LEN];
} kvs_xfer_session_info;

typedef struct kvs_xfer_server_stats {
    uint64_t sessions; /* open now */
    uint64_t fetch_requests;
    uint64_t blocks_sent; /* every layer delivered */
    uint64_t bytes_sent;
    uint64_t blocks_failed; /* not found, refused, or aborted mid-stream */
    uint64_t puts;          /* completed with status 0 */
    uint64_t bytes_received;
    uint64_t auth_failures; /* wrong session id or token */
    uint64_t proto_errors;  /* malformed requests */
    uint64_t peer_failures; /* sessions closed by an endpoint error */
    uint64_t timeouts;      /* sessions closed by op_timeout_ms */
    uint64_t refs_held;     /* provided blocks not yet released */
    uint64_t orphans;       /* requests UCX left pending after a force close; their blocks
                             * were released anyway (docs/TRANSFER.md "Failure handling") */
    uint64_t orphan_put_bytes; /* now: puts of closed sessions UCX still receives */
    uint64_t orphans_stuck;    /* now: orphaned sends still pending stuck_ms after the close */
    uint64_t puts_refused;     /* puts refused while orphan_put_bytes was over 256 MiB */
    /* The address check (opts.addr_check): */
    uint64_t addr_checks;        /* addresses tried in the helper */
    uint64_t addr_rejected;      /* refused by it: the helper died, or UCX refused the address */
    uint64_t addr_check_crashes; /* of those, the helper died (or hung and was killed) */
    uint64_t addr_check_spawns;  /* helpers started (the first, then one after each death) */
    uint64_t addr_check_busy;    /* refused because another check held the helper > 250 ms */
    /* Isolation (opts.isolate); the counters above are the current child's. */
    uint64_t proc_restarts; /* data plane processes that ended and were replaced,
                             * counted once all they held (puts, blocks, sessions) is back */
    uint64_t proc_pid;      /* the current one; 0 when none runs */
    uint64_t bounce_fails;  /* blocks refused for want of bounce space */
    uint64_t bounce_copies; /* blocks copied through bounce memory (not in opts.shared; puts) */
    uint64_t proc_lent;     /* blocks lent to the child now (this process's books) */
    uint64_t lend_refused;  /* blocks refused: the session had 65536 lent (docs/TRANSFER.md) */
} kvs_xfer_server_stats;

/* Creates the UCX context and worker and starts the progress thread. */
int kvs_xfer_server_create(const kvs_xfer_server_opts *o, kvs_xfer_server **out);

/* The worker address to send to clients; valid until destroy (with
 * opts.isolate: until destroy or 8 restarts of the child later, so copy it
 * at once). */
int kvs_xfer_server_address(kvs_xfer_server *s, const void **addr, size_t *len);

/* Opens a session for the client whose worker address is given (untrusted
 * bytes: a malformed address gives KVS_EINVAL). session_data is borrowed
 * until the session is closed and handed to the store callbacks. Fills *info
 * with the id and a fresh random token. With opts.addr_check the address is
 * tried in the helper first, on the calling thread (one check at a time,
 * about 0.1-1 ms; an address UCX cannot reach gives KVS_EUNAVAIL as
 * without the check); KVS_ENOSPC when the helper has died more than 10
 * times in the last second, or when another check has held it for 250 ms
 * (retry later: a slow check never holds every caller's thread),
 * KVS_EINTERNAL when it cannot be started. */
int kvs_xfer_server_session_open(kvs_xfer_server *s, const void *client_addr, size_t len,
                                 void *session_data, kvs_xfer_session_info *info);

/* Completes a provide_async that returned 0: status 0 with *src as provide
 * would fill it (copied; the reference is released as for provide, also when
 * the session is gone by now), or a negative KVS_E* that fails the block.
 * Any thread; handle is invalid afterwards. */
void kvs_xfer_server_provide_done(kvs_xfer_server *s, void *handle, int status,
                                  const kvs_xfer_block_src *src);

/* Completes a put_end_async that returned 0: status (0 or a negative KVS_E*)
 * and *reply (copied; NULL: zeroed) are sent to the client as put_end's
 * would be, unless its session has closed meanwhile. Any thread; handle is
 * invalid afterwards. */
void kvs_xfer_server_put_done(kvs_xfer_server *s, void *handle, int status,
                              const kvs_xfer_put_reply *reply);

/* Completes a put_begin_async that returned 0: status and buf, ref and
 * *reply as put_begin would return and fill them (reply copied; NULL:
 * zeroed). Status 0 with buf (len writable bytes) and ref: the bytes land in
 * buf, and put_end (or put_end_async) follows as for put_begin, with
 * KVS_ECANCELED when the session closed meanwhile; a negative KVS_E* refuses
 * the put, and *reply goes to the client with it (put_end is not called).
 * Any thread; handle is invalid afterwards. With opts.isolate, a put begun
 * for a session that has ended meanwhile is ended (put_end, KVS_ECANCELED)
 * inside this call: call it holding nothing put_end takes. */
void kvs_xfer_server_put_begun(kvs_xfer_server *s, void *handle, int status, void *buf, void *ref,
                               const kvs_xfer_put_reply *reply);

/* Memory for a block the store builds only to lend it (a rendered format):
 * with opts.isolate it lies in the child's bounce memory, so a block provided
 * from it is sent in place instead of copied there first; otherwise it is
 * heap memory. NULL when none is left (the store may then use its own). Any
 * thread; free it with kvs_xfer_server_buffer_free (len as given), e.g. in
 * release. */
void *kvs_xfer_server_buffer(kvs_xfer_server *s, uint64_t len);
void kvs_xfer_server_buffer_free(kvs_xfer_server *s, void *buf, uint64_t len);

/* Closes a session: its endpoint is closed, operations in flight fail and
 * their blocks are released before this returns. KVS_ENOTFOUND for an
 * unknown id. */
int kvs_xfer_server_session_close(kvs_xfer_server *s, uint64_t id);

/* A consistent snapshot of the counters. */
int kvs_xfer_server_stats_get(kvs_xfer_server *s, kvs_xfer_server_stats *st);

/* Closes every session (releasing every block) and stops the thread. NULL ok. */
void kvs_xfer_server_destroy(kvs_xfer_server *s);

/* ---- client ------------------------------------------------------------ */

typedef struct kvs_xfer_client kvs_xfer_client;

typedef struct kvs_xfer_client_opts {
    kvs_xfer_err_mode err_mode;
    uint32_t timeout_ms; /* 0: 30000. An operation older than this fails the
                          * connection with KVS_ETIMEDOUT */
    uint32_t spin;       /* as kvs_xfer_server_opts.spin */
    const char *net_devices; /* as kvs_xfer_server_opts.net_devices */
    const char *tls;         /* as kvs_xfer_server_opts.tls */
} kvs_xfer_client_opts;

int kvs_xfer_client_create(const kvs_xfer_client_opts *o, kvs_xfer_client **out);

/* The worker address to give to the server's Connect; valid until destroy. */
int kvs_xfer_client_address(kvs_xfer_client *c, const void **addr, size_t *len);

/* Connects to the server (its address from Connect, untrusted bytes) with
 * the session id and token it returned. Once per client. */
int kvs_xfer_client_connect(kvs_xfer_client *c, const void *server_addr, size_t len,
                            const kvs_xfer_session_info *session);

/* 0 while the connection is usable; else the status that broke it
 * (KVS_EUNAVAIL: peer failure, KVS_ETIMEDOUT: no progress in timeout_ms).
 * A broken client fails new operations at once with that status. */
int kvs_xfer_client_status(kvs_xfer_client *c);

/* One fetch destination, one per requested block. */
typedef struct kvs_xfer_dst {
    void *buf; /* cap bytes; host or device (mem); written by UCX */
    uint64_t cap;
    kvs_xfer_mem mem;
    /* Optional: room for the block's seal (kvs_xfer_block_src.seal). When
     * the server sends one it is copied here and seal_len set before the
     * block's layer 0 is reported; a seal longer than seal_cap fails the
     * block (KVS_ENOSPC). Host memory; NULL: a seal sent is ignored. */
    void *seal;
    uint32_t seal_cap;
    uint32_t seal_len; /* out: 0 when the server sent none */
    /* out, valid when on_block reported it: */
    uint64_t len; /* bytes of the block */
    uint32_t layers;
    int status; /* 0, or this block's failure */
} kvs_xfer_dst;

typedef struct kvs_xfer_fetch_req kvs_xfer_fetch_req;
struct kvs_xfer_fetch_req {
    uint32_t format;     /* KVS_XFER_FMT_* */
    uint32_t nblocks;    /* 1..KVS_XFER_MAX_BLOCKS */
    const uint8_t *keys; /* nblocks * KVS_XFER_KEY_LEN bytes; copied */
    kvs_xfer_dst *dst;   /* nblocks entries; borrowed until on_done */
    /* Layer `layer` of block `block` landed in dst[block].buf and passed its
     * checks. Per block, layers are reported in order 0, 1, ...; blocks
     * interleave. May be NULL. */
    void (*on_layer)(kvs_xfer_fetch_req *r, uint32_t block, uint32_t layer);
    /* Block finished: 0 after its last on_layer, or its failure (no more
     * on_layer for it). May be NULL. */
    void (*on_block)(kvs_xfer_fetch_req *r, uint32_t block, int status);
    /* Called once, last, when no UCX operation touches any dst any more:
     * status 0 when every block succeeded, else the first failure. Required. */
    void (*on_done)(kvs_xfer_fetch_req *r, int status);
    void *data; /* the caller's */
    uint32_t flags; /* KVS_XFER_FETCH_* */
    /* Opaque here: sent with the request and handed to the store's provide
     * with each of its blocks (libkvstash: random for a sealing session, so
     * kvstashd's seals answer this request only; docs/TRANSFER.md "Sealed
     * fetches"). Zero it when unused. */
    uint8_t nonce[KVS_XFER_NONCE_LEN];
    /* Optional, formats other than KVS_XFER_FMT_STORED whose layers lie at
     * fixed places (libkvstash's rendered formats: a head of head_bytes, then
     * each layer's layer_bytes). With layer_bytes > 0 a block must be
     * head_bytes + layers * layer_bytes bytes (else it is not one laid out
     * as the caller's: it fails with KVS_ENOTFOUND), and the message that
     * carries layers l..l+k-1 must bring exactly [head_bytes + l *
     * layer_bytes, head_bytes + (l + k) * layer_bytes), from 0 for layer 0
     * (it brings the head): a layer is then reported only once every byte
     * the caller reads it at has landed. A message that says otherwise fails
     * its block (KVS_EPROTO). Either before any of its bytes are written. 0:
     * the server's ranges as they come (they tile the block from 0 all the
     * same). */
    uint64_t head_bytes, layer_bytes;
};

/* kvs_xfer_fetch_req.flags: with KVS_XFER_FMT_STORED into host memory, a
 * reported layer has passed every check but its tiles' checksums
 * (kvs_tile_check_verified: the block header, the layer's place, each tile's
 * header and bounds); the caller must check each tile (kvs_tile_check, or a
 * dequantizer that does) before it uses the layer. That pass then runs on
 * the caller's thread instead of the progress thread, which moves every
 * fetch's bytes. On a 2-core machine that is slower (a third busy thread;
 * docs/TRANSFER.md "Where a fetch's CPU goes"), so libkvstash does not ask
 * for it; xfer_bench's XFER_BENCH_CHECKS=caller measures it where cores are
 * to spare. Ignored for other formats and for device memory (staged layers
 * are checked before their copy to the device). */
#define KVS_XFER_FETCH_CALLER_CHECKS 1u

/* Starts a fetch; req is borrowed until on_done. */
int kvs_xfer_fetch(kvs_xfer_client *c, kvs_xfer_fetch_req *req);

typedef struct kvs_xfer_put_req kvs_xfer_put_req;
struct kvs_xfer_put_req {
    uint8_t key[KVS_XFER_KEY_LEN];
    uint32_t format;
    const void *buf;   /* len host bytes, borrowed until on_done */
    uint64_t len;      /* 1.. */
    const void *meta;  /* meta_len bytes for the store's put_begin; copied */
    uint32_t meta_len; /* 0..KVS_XFER_MAX_META */
    /* The server's verdict (its put_end status, a refusal, or a transport
     * failure); after it UCX no longer reads buf. Required. */
    void (*on_done)(kvs_xfer_put_req *r, int status);
    void *data;
    /* out, valid in on_done: what the store's put_begin/put_end filled in
     * (the stored key and size); all zero when the server sent none (a
     * transport failure, or a server that predates it). */
    kvs_xfer_put_reply reply;
};

int kvs_xfer_put(kvs_xfer_client *c, kvs_xfer_put_req *req);

/* kvs_xfer_put, then waits for its verdict: the put's status (the one on_done
 * would get), or kvs_xfer_put's own error. req->on_done and req->data are
 * taken over (the caller's are ignored); req->reply is filled as for on_done.
 * req and buf need only outlive the call. Not from a callback of this client
 * (it would wait for its own progress thread). */
int kvs_xfer_put_wait(kvs_xfer_client *c, kvs_xfer_put_req *req);

/* Fails pending operations with KVS_ECANCELED (their callbacks run), closes
 * the endpoint and stops the thread. NULL ok. */
void kvs_xfer_client_destroy(kvs_xfer_client *c);

#ifdef __cplusplus
}
#endif

#endif /* KVS_XFER_H */
