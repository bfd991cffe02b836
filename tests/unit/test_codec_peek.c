/*
 * test_codec_peek.c — kvs_codec_peek_scheme (service/codec.h): a block's
 * scheme from the 64 header bytes kvs_store_lookup_leased_info copies, as
 * kvstashd's Lookup reads it.
 *
 * Blocks made by kvs_codec_begin (the header and scheme table a Put writes):
 * with the whole table in the peek (2 layers) the answer and every refusal are
 * kvs_codec_block_info's, checksum included; with a table longer than the
 * peek (25, 40 and 1016 layers) the scheme still equals kvs_codec_block_info's on
 * the whole block, and a damaged field, scheme byte or bound within the peek
 * is KVS_EFORMAT. Short or NULL input is KVS_EFORMAT. Then 20000 random
 * mutations of peeks: never a crash (the ASan build reads every byte), and
 * every accepted one names a scheme 1..4 that its layer 0 byte holds.
 */
#include "codec.h"
#include "kv_block.h"
#include "kvs_error.h"
#include "kvs_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PEEK 64

/* A block's header and table for L layers (schemes[l]); the caller frees. */
static uint8_t *mk_block(uint32_t L, const uint8_t *schemes, size_t *size)
{
    kvs_codec_layout lay = {L, 1, 16, 16, 1, 0, 0, 0, 0, schemes, NULL, NULL, 0};
    char err[KVS_ERR_LEN] = "";
    *size = kvs_codec_block_size(&lay, err);
    CU_ASSERT_FATAL(*size > 0);
    uint8_t *blk = aligned_alloc(64, (*size + 63) & ~(size_t)63);
    CU_ASSERT_PTR_NOT_NULL_FATAL(blk);
    memset(blk, 0, *size);
    CU_ASSERT_EQUAL_FATAL(kvs_codec_begin(&lay, blk, *size, err), 0);
    return blk;
}

static int peek(const uint8_t *blk, size_t len, unsigned *scheme)
{
    uint8_t copy[PEEK]; /* exactly len bytes, as the store hands them over */
    memcpy(copy, blk, len);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_codec_peek_scheme(copy, len, scheme, err);
    if (rc)
        CU_ASSERT(err[0] != '\0');
    return rc;
}

static void test_whole_table(void)
{
    uint8_t sch[2] = {4, 1};
    size_t size;
    uint8_t *blk = mk_block(2, sch, &size);
    unsigned s = 0;
    CU_ASSERT_EQUAL(peek(blk, PEEK, &s), 0);
    CU_ASSERT_EQUAL(s, 4);
    CU_ASSERT_EQUAL(peek(blk, 48, &s), 0); /* 40 + align16(2): just the table */
    kvs_codec_info ci;
    CU_ASSERT_EQUAL(kvs_codec_block_info(blk, size, &ci, NULL), 0);
    CU_ASSERT_EQUAL(ci.scheme, 4);
    /* The header checksum is checked here: a changed bound or scheme is refused. */
    uint8_t bad[PEEK];
    memcpy(bad, blk, PEEK);
    bad[12] ^= 1; /* head_dim 16 -> 17: valid, but not what the checksum covered */
    CU_ASSERT_EQUAL(peek(bad, PEEK, &s), KVS_EFORMAT);
    memcpy(bad, blk, PEEK);
    bad[40] = 2; /* layer 0's scheme, a valid one: only the checksum tells */
    CU_ASSERT_EQUAL(peek(bad, PEEK, &s), KVS_EFORMAT);
    free(blk);
}

static void test_long_table(void)
{
    /* Not 1017..1024: kernels/block/kv_block.c header_checksum copies the
     * 16-aligned table into a buffer sized for 1024 unpadded bytes (an 8-byte
     * stack overflow under ASan; reported, not this module's to fix). */
    static const uint32_t Ls[] = {25, 40, 1016};
    for (size_t t = 0; t < sizeof Ls / sizeof Ls[0]; t++) {
        uint32_t L = Ls[t];
        uint8_t *sch = malloc(L);
        for (uint32_t l = 0; l < L; l++)
            sch[l] = l == L - 1 ? 1 : 2; /* last layer fp16 (beyond any peek) */
        size_t size;
        uint8_t *blk = mk_block(L, sch, &size);
        kvs_codec_info ci;
        CU_ASSERT_EQUAL(kvs_codec_block_info(blk, size, &ci, NULL), 0);
        unsigned s = 0;
        CU_ASSERT_EQUAL(peek(blk, PEEK, &s), 0);
        CU_ASSERT_EQUAL(s, ci.scheme);
        CU_ASSERT_EQUAL(s, 2);
        CU_ASSERT_EQUAL(peek(blk, 41, &s), 0); /* layer 0's byte is enough */
        CU_ASSERT_EQUAL(s, 2);
        CU_ASSERT_EQUAL(peek(blk, 40, &s), KVS_EFORMAT);
        uint8_t bad[PEEK];
        const struct {
            size_t off;
            uint8_t val;
        } dmg[] = {
            {0, 0x4a}, /* magic */
            {4, 1},    /* version 1, the old format */
            {5, 0x80}, /* unknown flag */
            {6, 9},    /* src dtype */
            {7, 1},    /* reserved0 */
            {10, 0},   /* heads 0 (low byte; high byte is 0) */
            {14, 3},   /* block_tokens 3 */
            {40, 0},   /* layer 0: no scheme */
            {40, 5},   /* layer 0: unknown scheme */
            {63, 7},   /* a later layer within the peek */
        };
        for (size_t d = 0; d < sizeof dmg / sizeof dmg[0]; d++) {
            memcpy(bad, blk, PEEK);
            bad[dmg[d].off] = dmg[d].val;
            CU_ASSERT_EQUAL(peek(bad, PEEK, &s), KVS_EFORMAT);
        }
        memcpy(bad, blk, PEEK);
        bad[8] = 0; /* num_layers 0 */
        bad[9] = 0;
        CU_ASSERT_EQUAL(peek(bad, PEEK, &s), KVS_EFORMAT);
        memcpy(bad, blk, PEEK);
        bad[9] = 0x50; /* num_layers > 1024 */
        CU_ASSERT_EQUAL(peek(bad, PEEK, &s), KVS_EFORMAT);
        free(blk);
        free(sch);
    }
}

static void test_short(void)
{
    unsigned s = 0;
    CU_ASSERT_EQUAL(kvs_codec_peek_scheme(NULL, 64, &s, NULL), KVS_EFORMAT);
    uint8_t z[PEEK] = {0};
    for (size_t len = 0; len <= PEEK; len++)
        CU_ASSERT_EQUAL(kvs_codec_peek_scheme(z, len, &s, NULL), KVS_EFORMAT);
}

static void test_random(void)
{
    uint8_t sch[40];
    memset(sch, 4, sizeof sch);
    size_t size;
    uint8_t *b40 = mk_block(40, sch, &size);
    uint8_t *b2 = mk_block(2, sch, &size);
    uint32_t x = 12345;
    int accepted = 0, ok = 1;
    for (int r = 0; r < 20000; r++) {
        const uint8_t *src = r & 1 ? b40 : b2;
        uint8_t *buf = malloc(PEEK);
        memcpy(buf, src, PEEK);
        int flips = 1 + r % 3;
        for (int f = 0; f < flips; f++) {
            x = x * 1664525u + 1013904223u;
            buf[(x >> 8) % PEEK] = (uint8_t)(x >> 20);
        }
        x = x * 1664525u + 1013904223u;
        size_t len = 40 + (x >> 8) % (PEEK - 39);
        unsigned s = 99;
        int rc = kvs_codec_peek_scheme(buf, len, &s, NULL);
        if (rc == 0) {
            accepted++;
            ok &= s >= 1 && s <= 4 && s == buf[40];
        } else {
            ok &= rc == KVS_EFORMAT && s == 99;
        }
        free(buf);
    }
    CU_ASSERT(ok);
    CU_ASSERT(accepted > 0); /* flips that land on unchecked bytes of the 40-layer head */
    free(b40);
    free(b2);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"whole_table_checksummed", test_whole_table},
        {"long_table_fields_checked", test_long_table},
        {"short_or_null", test_short},
        {"random_mutations", test_random},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"codec_peek", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
