/*
 * kvs_tsan.h — ThreadSanitizer happens-before annotations for orderings TSan
 * cannot see (a handle that travels through gRPC's completion queue, or
 * through another process), and a thread whose races are the point. No-ops
 * in other builds.
 */
#ifndef KVS_TSAN_H
#define KVS_TSAN_H

#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void __tsan_ignore_thread_begin(void);
#define TSAN_ACQUIRE(p) __tsan_acquire(p)
#define TSAN_RELEASE(p) __tsan_release(p)
/* The calling thread's memory accesses are not reported from here on (a
 * test's deliberate racer). */
#define TSAN_IGNORE_THREAD() __tsan_ignore_thread_begin()
#else
#define TSAN_ACQUIRE(p) ((void)(p))
#define TSAN_RELEASE(p) ((void)(p))
#define TSAN_IGNORE_THREAD() ((void)0)
#endif

#endif
