/*
 * fuzz_config.c — libFuzzer target for kvstashd's config file
 * (kvs_config_load_file: INI through inih, [kvstashd], [model.PATTERN] and
 * [tenant.NAME] sections): the input is the file, handed over as a memfd.
 *
 * Invariants (abort when broken):
 *   - a refused file gets KVS_EINVAL with a message and leaves the config
 *     exactly as it was;
 *   - after an accepted file, every setting's text form (kvs_config_format)
 *     is accepted again by kvs_config_set and formats to the same text (what
 *     GetConfig shows, SetConfig takes back).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include "config.h"
#include "fuzz_target.h"
#include "kvs_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

unsigned long kvs_fuzz_accepted;

#define REQUIRE(c, what) kvs_fuzz_require((c), "fuzz_config", (what))

static void round_trip(const kvs_config *c)
{
    static char a[8192], b[8192];
    char err[KVS_ERR_LEN];
    for (size_t i = 0; i < kvs_config_count(); i++) {
        const kvs_config_def *d = kvs_config_at(i);
        kvs_config_format(c, d, a, sizeof a);
        kvs_config fresh;
        kvs_config_defaults(&fresh);
        if (kvs_config_set(&fresh, d, a, err) != 0) {
            fprintf(stderr, "fuzz_config: %s = '%s': %s\n", kvs_config_def_name(d), a, err);
            REQUIRE(0, "a formatted setting is refused by kvs_config_set");
        }
        kvs_config_format(&fresh, d, b, sizeof b);
        REQUIRE(strcmp(a, b) == 0, "format -> set -> format changed a setting");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("kvstashd.ini", 0);
    REQUIRE(fd >= 0, "memfd_create failed");
    REQUIRE(size == 0 || write(fd, data, size) == (ssize_t)size, "memfd write failed");
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    static kvs_config c, before;
    kvs_config_defaults(&c);
    memcpy(&before, &c, sizeof c);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_config_load_file(&c, path, err);
    close(fd);
    if (rc != 0) {
        REQUIRE(rc == KVS_EINVAL || rc == KVS_ENOMEM, "refused with an unexpected status");
        REQUIRE(err[0] != '\0', "refused without a message");
        REQUIRE(memcmp(&c, &before, sizeof c) == 0, "a refused file changed the config");
        return 0;
    }
    kvs_fuzz_accepted++;
    round_trip(&c);
    return 0;
}
