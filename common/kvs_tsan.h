/*
 * kvs_tsan.h — ThreadSanitizer happens-before annotations for orderings TSan
 * cannot see (a handle that travels through gRPC's completion queue, or
 * through another process). No-ops in other builds.
 */
#ifndef KVS_TSAN_H
#define KVS_TSAN_H

#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSAN_ACQUIRE(p) __tsan_acquire(p)
#define TSAN_RELEASE(p) __tsan_release(p)
#else
#define TSAN_ACQUIRE(p) ((void)(p))
#define TSAN_RELEASE(p) ((void)(p))
#endif

#endif
