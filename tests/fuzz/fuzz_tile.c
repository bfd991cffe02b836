/*
 * fuzz_tile.c — libFuzzer target for the tile decoders: kvs_tile_check, then,
 * when it accepts, kvs_tile_dequantize_ref into an exactly sized destination
 * for every dtype, kvs_tile_amax and kvs_tile_requant_fp8; and the fast CPU
 * dequantizer (kvs_tile_dequantize) with each ISA this machine has, against
 * the reference.
 *
 * The input is copied into a buffer of exactly its size, so AddressSanitizer
 * sees any read past the tile; destinations are sized exactly to what the tile
 * header says ((T-1)·stride + D elements). Beyond "no crash, no out-of-bounds
 * access", the target checks invariants and aborts when one breaks:
 *   - a tile that passes kvs_tile_check decodes (to every dtype) with status 0;
 *   - a tile that fails it makes the dequantizers fail too, without writing;
 *   - the fast CPU dequantizer, every ISA, writes the reference's bytes (and
 *     nothing between the rows when the stride has slack);
 *   - sealing an accepted tile changes nothing (its checksum was right);
 *   - kvs_tile_check_verified accepts every tile kvs_tile_check accepts (same
 *     header), and whatever it accepts, checksum right or wrong, decodes with
 *     the _verified dequantizers (reference == fast CPU path) within bounds.
 */
#include "fuzz_target.h"
#include "kv_block.h"
#include "kvq.h"
#include "kvq_cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long kvs_fuzz_accepted;

static void require(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_tile: invariant broken: %s\n", what);
        abort();
    }
}

static size_t elem_size(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FP32 ? 4 : 2;
}

/* A tile that passes kvs_tile_check_verified (every check but the checksum,
 * so its checksum may be wrong) decodes with the _verified dequantizers into
 * an exactly sized fp32 destination, reference and fast CPU path alike: what
 * skipping the checksum must never cost is a read or write out of bounds. */
static void decode_verified(const void *tile, size_t len, const kvs_tile_hdr *h)
{
    const size_t bytes = (size_t)h->tokens * h->dim * sizeof(float);
    float *ref = malloc(bytes), *fast = malloc(bytes);
    require(ref != NULL && fast != NULL, "malloc");
    require(kvs_tile_dequantize_verified_ref(tile, len, KVS_DTYPE_FP32, ref, h->dim, NULL) == 0,
            "a tile kvs_tile_check_verified accepts fails the _verified reference decode");
    require(kvs_tile_dequantize_verified(tile, len, KVS_DTYPE_FP32, fast, h->dim, NULL) == 0,
            "a tile kvs_tile_check_verified accepts fails the _verified CPU decode");
    require(memcmp(ref, fast, bytes) == 0, "the _verified CPU decode disagrees with the reference");
    free(ref);
    free(fast);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const unsigned mode = data[0];
    const size_t len = size - 1;
    uint8_t *tile = malloc(len ? len : 1);
    if (tile == NULL)
        return 0;
    memcpy(tile, data + 1, len);
    if (mode & KVS_FUZZ_MODE_SEAL)
        (void)kvs_tile_seal(tile, len, NULL);

    kvs_tile_hdr hv;
    const int verified_ok = kvs_tile_check_verified(tile, len, &hv, NULL) == 0;
    if (verified_ok)
        decode_verified(tile, len, &hv);

    kvs_tile_hdr h;
    if (kvs_tile_check(tile, len, &h, NULL) != 0) {
        /* Rejected: the dequantizer must refuse it before touching dst, here a
         * single element that a write of row 1 or column 1 would overrun. */
        unsigned char one[4] = {0x5A, 0x5A, 0x5A, 0x5A};
        require(kvs_tile_dequantize_ref(tile, len, KVS_DTYPE_FP32, one, 1u << 20, NULL) != 0,
                "a rejected tile decodes");
        require(one[0] == 0x5A && one[3] == 0x5A, "a rejected tile wrote to dst");
        require(kvs_tile_dequantize(tile, len, KVS_DTYPE_FP32, one, 1u << 20, NULL) != 0,
                "a rejected tile decodes (CPU)");
        require(one[0] == 0x5A && one[3] == 0x5A, "a rejected tile wrote to dst (CPU)");
        float amax;
        require(kvs_tile_amax(tile, len, &amax, NULL) != 0, "amax of a rejected tile");
        free(tile);
        return 0;
    }

    require(verified_ok && memcmp(&hv, &h, sizeof h) == 0,
            "kvs_tile_check_verified refuses a tile kvs_tile_check accepts");
    const size_t stride = (size_t)h.dim + ((mode >> 1) & 3u);
    const size_t n = (size_t)(h.tokens - 1u) * stride + h.dim;
    for (int dt = KVS_DTYPE_FP16; dt <= KVS_DTYPE_FP32; dt++) {
        const size_t bytes = n * elem_size((kvs_dtype)dt);
        void *dst = malloc(bytes), *fast = malloc(bytes);
        require(dst != NULL && fast != NULL, "malloc");
        memset(dst, 0x5A, bytes);
        require(kvs_tile_dequantize_ref(tile, len, (kvs_dtype)dt, dst, stride, NULL) == 0,
                "an accepted tile fails to decode");
        for (int isa = KVS_CPU_PORTABLE; isa <= KVS_CPU_AVX512; isa++) {
            if (kvs_cpu_isa_force((kvs_cpu_isa)isa) != 0)
                continue;
            memset(fast, 0x5A, bytes);
            require(kvs_tile_dequantize(tile, len, (kvs_dtype)dt, fast, stride, NULL) == 0,
                    "an accepted tile fails to decode (CPU)");
            if (memcmp(fast, dst, bytes) != 0) {
                size_t i = 0;
                while (((unsigned char *)fast)[i] == ((unsigned char *)dst)[i])
                    i++;
                fprintf(stderr, "fuzz_tile: %s, dtype %d: byte %zu: 0x%02x, reference 0x%02x\n",
                        kvs_cpu_isa_name((kvs_cpu_isa)isa), dt, i, ((unsigned char *)fast)[i],
                        ((unsigned char *)dst)[i]);
                require(0, "the CPU dequantizer disagrees with the reference");
            }
        }
        free(dst);
        free(fast);
    }
    (void)kvs_cpu_isa_force(kvs_cpu_isa_detect());
    float amax = -1.0f;
    require(kvs_tile_amax(tile, len, &amax, NULL) == 0 && amax >= 0.0f, "amax");
    uint8_t *codes = malloc(n);
    require(codes != NULL, "malloc");
    float scale = (mode & 0x08u) ? 0.0f : amax / 448.0f;
    require(kvs_tile_requant_fp8(tile, len, scale, codes, stride, NULL) == 0, "requant");
    free(codes);

    uint8_t *again = malloc(len);
    require(again != NULL, "malloc");
    memcpy(again, tile, len);
    require(kvs_tile_seal(again, len, NULL) == 0 && memcmp(again, tile, len) == 0,
            "sealing an accepted tile changed it");
    free(again);
    free(tile);
    kvs_fuzz_accepted++;
    return 0;
}
