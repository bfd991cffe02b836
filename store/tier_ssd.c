/*
 * tier_ssd.c — the SSD tier: demoted blocks as files, one per block.
 *
 * The idea: a block leaving DRAM is written to <hex key>.kvb with a 64-byte
 * header (magic, key, size, XXH3-64 of the payload, XXH3-64 of the header
 * before it) and read back on a hit. Everything read is checked before it is
 * returned: a file that is short (torn write, truncated), foreign (another
 * key or size), or whose header or payload fails its checksum is KVS_EFORMAT,
 * and the store drops the block; its bytes are never served. The checksum is
 * XXH3 from libxxhash (the same family as the tile checksums).
 *
 * Invariants: put writes the whole file or removes it (no half-written copy
 * survives a failed put); get never reports success on bytes it has not
 * verified. Files are a cache: no fsync, nothing reloaded after a restart;
 * the store removes its files when blocks leave and at close.
 */
#include "kvs_error.h"
#include "tier.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define SSD_MAGIC "KVSSD001"
#define HDR       64

typedef struct ssd_hdr {
    char magic[8];
    uint8_t key[KVS_KEY_LEN];
    uint64_t size;
    uint64_t payload_hash;
    uint64_t hdr_hash; /* XXH3-64 of the 56 bytes before it */
} ssd_hdr;
static_assert(sizeof(ssd_hdr) == HDR, "SSD file header is 64 bytes");

typedef struct ssd {
    kvs_tier base;
    int dirfd;
} ssd;

void kvs_tier_ssd_name(const kvs_key *key, char name[69])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < KVS_KEY_LEN; i++) {
        name[2 * i] = hex[key->b[i] >> 4];
        name[2 * i + 1] = hex[key->b[i] & 15];
    }
    memcpy(name + 64, ".kvb", 5);
}

static int io_status(int e)
{
    return e == ENOSPC || e == EDQUOT ? KVS_ENOSPC : KVS_EIO;
}

static int write_all(int fd, const void *buf, size_t n, off_t off)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return io_status(w < 0 ? errno : ENOSPC);
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* 0, KVS_EFORMAT when the file ends early, KVS_EIO. */
static int read_all(int fd, void *buf, size_t n, off_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return KVS_EIO;
        if (r == 0)
            return KVS_EFORMAT;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static int s_put(kvs_tier *t, const kvs_key *key, const void *buf, uint64_t size)
{
    ssd *d = (ssd *)t;
    char name[69];
    kvs_tier_ssd_name(key, name);
    ssd_hdr h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SSD_MAGIC, 8);
    memcpy(h.key, key->b, KVS_KEY_LEN);
    h.size = size;
    h.payload_hash = XXH3_64bits(buf, (size_t)size);
    h.hdr_hash = XXH3_64bits(&h, offsetof(ssd_hdr, hdr_hash));
    int fd = openat(d->dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return io_status(errno);
    int rc = write_all(fd, &h, sizeof h, 0);
    if (!rc)
        rc = write_all(fd, buf, (size_t)size, HDR);
    if (close(fd) != 0 && !rc)
        rc = io_status(errno);
    if (rc)
        unlinkat(d->dirfd, name, 0);
    return rc;
}

static int s_get(kvs_tier *t, const kvs_key *key, void *buf, uint64_t size)
{
    ssd *d = (ssd *)t;
    char name[69];
    kvs_tier_ssd_name(key, name);
    int fd = openat(d->dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? KVS_EFORMAT : KVS_EIO; /* a lost copy is as bad as a torn one */
    ssd_hdr h;
    int rc = read_all(fd, &h, sizeof h, 0);
    if (!rc && (memcmp(h.magic, SSD_MAGIC, 8) != 0 || memcmp(h.key, key->b, KVS_KEY_LEN) != 0 ||
                h.size != size || h.hdr_hash != XXH3_64bits(&h, offsetof(ssd_hdr, hdr_hash))))
        rc = KVS_EFORMAT;
    if (!rc)
        rc = read_all(fd, buf, (size_t)size, HDR);
    if (!rc) {
        /* Anything past the payload means the file is not what we wrote. */
        struct stat st;
        if (fstat(fd, &st) != 0)
            rc = KVS_EIO;
        else if ((uint64_t)st.st_size != HDR + size)
            rc = KVS_EFORMAT;
    }
    if (!rc && XXH3_64bits(buf, (size_t)size) != h.payload_hash)
        rc = KVS_EFORMAT;
    close(fd);
    return rc;
}

static void s_drop(kvs_tier *t, const kvs_key *key)
{
    char name[69];
    kvs_tier_ssd_name(key, name);
    unlinkat(((ssd *)t)->dirfd, name, 0);
}

static void s_close(kvs_tier *t)
{
    close(((ssd *)t)->dirfd);
    free(t);
}

static const kvs_tier_methods g_ssd = {
    .name = "ssd",
    .kind = KVS_TIER_SSD,
    .put = s_put,
    .get = s_get,
    .drop = s_drop,
    .close = s_close,
};

int kvs_tier_ssd_open(const char *dir, kvs_tier **out)
{
    if (!out || !dir || !*dir)
        return KVS_EINVAL;
    *out = NULL;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR ? KVS_ENOTFOUND : KVS_EIO;
    if (faccessat(fd, ".", W_OK, 0) != 0) {
        close(fd);
        return KVS_EPERM;
    }
    ssd *d = calloc(1, sizeof *d);
    if (!d) {
        close(fd);
        return KVS_ENOMEM;
    }
    d->base.m = &g_ssd;
    d->dirfd = fd;
    *out = &d->base;
    return 0;
}
