/*
 * fuzz_sample.c — libFuzzer target for KVSM sample files (kvs_sample_parse,
 * the reader behind `kvstash calibrate` and kvq_quality's real tiles). Byte 0
 * is the mode byte: bit 0 recomputes the file's checksum first, so mutants
 * reach the structural checks. An accepted sample goes through calibration
 * (kvs_calib_add) and, when a profile comes out, its text round trip.
 *
 * Invariants (abort when broken):
 *   - a refused file gets an error status and a message, and no sample;
 *   - an accepted sample passes kvs_sample_info_check, and its data is exactly
 *     kvs_sample_data_bytes long, the rest of the file;
 *   - calibration takes it (or runs out of memory), and a profile it makes
 *     passes kvs_profile_check and parses back from its own text.
 */
#include "fuzz_target.h"
#include "kvq.h"
#include "kvq_calib.h"
#include "kvs_error.h"

#include <stdlib.h>
#include <string.h>

unsigned long kvs_fuzz_accepted;

#define REQUIRE(c, what) kvs_fuzz_require((c), "fuzz_sample", (what))

static void calibrate(const kvs_sample *s)
{
    char err[KVS_ERR_LEN] = "";
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    o.block_tokens = 16;
    kvs_calib *c = NULL;
    REQUIRE(kvs_calib_create(&o, &c, err) == 0, "default calibration options refused");
    int rc = kvs_calib_add(c, s, err);
    REQUIRE(rc == 0 || rc == KVS_ENOMEM, "calibration refused an accepted sample");
    kvs_profile *p = NULL;
    if (rc == 0 && kvs_calib_profile(c, s->info.model[0] ? s->info.model : "-", &p, err) == 0) {
        REQUIRE(kvs_profile_check(p, err) == 0, "calibration made an invalid profile");
        char *text = NULL;
        size_t len = 0;
        REQUIRE(kvs_fuzz_profile_text(p, &text, &len) == 0, "profile print failed");
        kvs_profile *back = NULL;
        REQUIRE(kvs_profile_parse(text, len, &back, err) == 0, "profile text did not parse back");
        kvs_profile_free(back);
        free(text);
        kvs_profile_free(p);
    }
    kvs_calib_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const unsigned mode = data[0];
    const size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1); /* exact size: ASan sees overreads */
    REQUIRE(file != NULL, "out of memory");
    memcpy(file, data + 1, n);
    if ((mode & KVS_FUZZ_MODE_SEAL) && n >= KVS_SAMPLE_HDR_BYTES) {
        const size_t at = offsetof(kvs_sample_hdr, checksum);
        memset(file + at, 0, sizeof(uint64_t));
        uint64_t sum = kvs_tile_checksum(file, n);
        memcpy(file + at, &sum, sizeof sum);
    }
    char err[KVS_ERR_LEN] = "";
    kvs_sample *s = NULL;
    int rc = kvs_sample_parse(file, n, &s, err);
    if (rc != 0) {
        REQUIRE(s == NULL, "a refused sample was returned");
        REQUIRE(err[0] != '\0', "refused without a message");
        free(file);
        return 0;
    }
    kvs_fuzz_accepted++;
    REQUIRE(kvs_sample_info_check(&s->info, err) == 0, "accepted sample fails its info check");
    REQUIRE(s->data_bytes == kvs_sample_data_bytes(&s->info), "data size disagrees with info");
    REQUIRE(KVS_SAMPLE_HDR_BYTES + s->data_bytes == n, "accepted a file with trailing bytes");
    calibrate(s);
    kvs_sample_free(s);
    free(file);
    return 0;
}
