/*
 * kvs_server_proc.h — black-box test harness: run a real kvstashd as a child.
 *
 * kvs_server_proc_start() forks and execs kvstashd with
 * "--listen 127.0.0.1:0 --port-file <tmpdir>/port" plus the caller's extra
 * arguments, and waits (up to 10 s) for the server to write its port. The
 * child is created with PR_SET_PDEATHSIG=SIGKILL, so even a test binary that
 * crashes leaves no server behind; every failure path kills -9 and reaps.
 *
 * Not thread-safe: start and stop servers from the test's main thread (the
 * death signal follows the thread that forked).
 */
#ifndef KVS_SERVER_PROC_H
#define KVS_SERVER_PROC_H

#include <stddef.h>
#include <sys/types.h>

#define KVS_SERVER_PROC_ADDR_LEN 64

typedef struct kvs_server_proc {
    pid_t pid;                            /* 0 when not running */
    int port;                             /* the port the server bound */
    char addr[KVS_SERVER_PROC_ADDR_LEN];  /* "127.0.0.1:<port>" */
    char dir[64];                         /* private temp dir holding the port file */
} kvs_server_proc;

/* Starts kvstashd_path with extra_args (NULL-terminated, may be NULL).
 * Returns 0 and fills *p, or -1 with a reason in err (KVS_ERR_LEN bytes)
 * and no process left running. */
int kvs_server_proc_start(const char *kvstashd_path, const char *const *extra_args,
                          kvs_server_proc *p, char *err);

/* Sends sig (SIGTERM for a clean stop) and waits up to timeout_ms for the
 * child to exit. On exit: returns 0, *wait_status gets the waitpid() status
 * and *elapsed_ms the time from the signal to the reap. When it does not exit
 * in time: kills it with SIGKILL, reaps it and returns -1. Either way the
 * process is gone and the temp dir removed afterwards. NULL out-params are
 * allowed; a p with pid 0 is a no-op returning 0 with *wait_status 0. */
int kvs_server_proc_stop(kvs_server_proc *p, int sig, int timeout_ms, int *wait_status,
                         double *elapsed_ms);

/* SIGKILL + reap + cleanup; safe on a stopped or never-started p. */
void kvs_server_proc_kill(kvs_server_proc *p);

/* Monotonic milliseconds, for tests that time things. */
double kvs_test_now_ms(void);

/* kvstashd pid's data plane process (kvstash-xferd, ucx_isolate = on): its
 * child whose /proc comm starts with "kvstash-xferd", or 0 when none. */
pid_t kvs_server_proc_xferd(pid_t pid);

#endif /* KVS_SERVER_PROC_H */
