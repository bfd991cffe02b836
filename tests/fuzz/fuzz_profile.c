/*
 * fuzz_profile.c — libFuzzer target for calibration profiles
 * (kvs_profile_parse, the strict reader of `kvstash calibrate`'s text output):
 * the input is the text.
 *
 * Invariants (abort when broken):
 *   - a refused text gets KVS_EFORMAT or KVS_EINVAL (or KVS_ENOMEM) with a
 *     message, and no profile;
 *   - an accepted profile passes kvs_profile_check;
 *   - printing it and parsing the print gives a profile that prints to the
 *     same bytes (the text form is stable);
 *   - the static-scale accessors answer in range and refuse out of range.
 */
#include "fuzz_target.h"
#include "kvq_calib.h"
#include "kvs_error.h"

#include <stdlib.h>
#include <string.h>

unsigned long kvs_fuzz_accepted;

#define REQUIRE(c, what) kvs_fuzz_require((c), "fuzz_profile", (what))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KVS_ERR_LEN] = "";
    kvs_profile *p = NULL;
    int rc = kvs_profile_parse((const char *)data, size, &p, err);
    if (rc != 0) {
        REQUIRE(p == NULL, "a refused profile was returned");
        REQUIRE(rc == KVS_EFORMAT || rc == KVS_EINVAL || rc == KVS_ENOMEM,
                "refused with an unexpected status");
        REQUIRE(err[0] != '\0', "refused without a message");
        return 0;
    }
    kvs_fuzz_accepted++;
    REQUIRE(kvs_profile_check(p, err) == 0, "accepted profile fails kvs_profile_check");

    char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    REQUIRE(kvs_fuzz_profile_text(p, &a, &alen) == 0, "print failed");
    kvs_profile *q = NULL;
    REQUIRE(kvs_profile_parse(a, alen, &q, err) == 0, "printed profile does not parse");
    REQUIRE(kvs_fuzz_profile_text(q, &b, &blen) == 0, "second print failed");
    REQUIRE(alen == blen && memcmp(a, b, alen) == 0, "print -> parse -> print changed the text");

    const uint32_t L = p->num_layers, H = p->num_kv_heads;
    REQUIRE(kvs_profile_k_scales(p, L - 1, H - 1) != NULL, "k scales of the last head missing");
    REQUIRE(kvs_profile_k_scales(p, L, 0) == NULL, "k scales past the last layer");
    float v[4];
    REQUIRE(kvs_profile_v_scales_fill(p, L - 1, H - 1, 4, v) == 0, "v scales refused");
    REQUIRE(kvs_profile_v_scales_fill(p, 0, H, 4, v) == KVS_EINVAL, "v scales past the heads");
    free(a);
    free(b);
    kvs_profile_free(q);
    kvs_profile_free(p);
    return 0;
}
