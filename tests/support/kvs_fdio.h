/*
 * kvs_fdio.h — whole-buffer read and write on a file descriptor (pipes between a
 * test or benchmark and the child processes it forks). Header-only so programs
 * that do not link the CUnit support library can use it too.
 */
#ifndef KVS_FDIO_H
#define KVS_FDIO_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* Reads exactly n bytes, retrying on EINTR. 0, or -1 on error or end of file. */
static inline int kvs_read_full(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Writes exactly n bytes, retrying on EINTR. 0, or -1 on error. */
static inline int kvs_write_full(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t r = write(fd, b, n);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

#endif /* KVS_FDIO_H */
