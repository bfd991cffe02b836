/*
 * xproc_sandbox.c — what the data plane process (kvstash-xferd) gives up
 * before it starts UCX, so that code running in it (a UCX bug taken over
 * by a peer) cannot reach the kvstashd that started it (docs/TRANSFER.md
 * "Isolation"):
 *
 *   - no new privileges (PR_SET_NO_NEW_PRIVS), and every capability dropped
 *     but CAP_SYS_PTRACE (see below; a root kvstashd's child would otherwise
 *     signal, read or write anything);
 *   - a seccomp filter (libseccomp) that refuses, with EPERM: ptrace;
 *     process_vm_readv / process_vm_writev on every process (itself
 *     included: UCX's cma transport then finds them refused and is not
 *     used; kvstashd's endpoints, with peer error handling, never use it
 *     anyway, docs/BENCHMARKS.md); signals to any
 *     process but itself (kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo
 *     with another pid; tkill; pidfd_open, pidfd_send_signal, pidfd_getfd);
 *     leaving its process group (setpgid, setsid), so the parent's
 *     kill(-pid) ends whatever it starts; naming who gets a descriptor's
 *     SIGIO (F_SETOWN, F_SETOWN_EX, FIOSETOWN, SIOCSPGRP: the kernel would
 *     signal kvstashd on its behalf); and TIOCSTI on the terminal it may
 *     share with kvstashd.
 *   - clone with CLONE_PARENT (its process would be kvstashd's child), and
 *     clone3 answers ENOSYS (glibc then uses clone).
 *   - Signals to the address-check helper it starts are refused too: that
 *     helper ends a wedged check by its own alarm (ucx_addrcheck_main.c).
 *   - process_vm_* on every pid, not the parent's alone: on the parent's
 *     only, the child could read and write any other process of its user
 *     (a worker's put key, its KV), as the kernel's ptrace check allows
 *     that (found by review, with a reproduction).
 *
 * Called first thing in main, before any thread: capabilities are dropped
 * for the calling thread only. kvstashd makes itself non-dumpable
 * (service/data_connect.c), which closes /proc/<kvstashd>/mem to a process
 * without CAP_SYS_PTRACE: to this one unless kvstashd runs as root.
 *
 * What is left to it: its own memory, the two regions it maps (the memory
 * tier read-only, the bounce memory read-write), its socket to the parent,
 * UCX's peers, and the file system as kvstashd's user (docs: "What it does
 * not change").
 */
#include "kvs_error.h"
#include "xproc.h"

#include <cap-ng.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <linux/sockios.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

/* Argument i's low 32 bits equal v. The kernel reads a pid, an fcntl
 * command or an ioctl request as 32 bits, so a caller could set the upper
 * ones to slip past a 64-bit compare (SCMP_A0_32 only narrows the datum).
 * The rules that refuse all but one value (kill: NE self) need no mask: a
 * value with upper bits set is refused there anyway. */
#define LOW32_EQ(i, v) SCMP_CMP((i), SCMP_CMP_MASKED_EQ, 0xffffffffu, (scmp_datum_t)(v))

static int fail(char *err, size_t n, const char *what, int e)
{
    snprintf(err, n, "%s: %s", what, strerror(e > 0 ? e : -e));
    return KVS_EINTERNAL;
}

int kvs__xp_sandbox(char *err, size_t n)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return fail(err, n, "PR_SET_NO_NEW_PRIVS", errno);
    if (capng_have_capabilities(CAPNG_SELECT_BOTH) != CAPNG_NONE) {
        /* All but CAP_SYS_PTRACE when it has it (kvstashd runs as root):
         * UCX's shared memory opens a peer's segment through
         * /proc/<pid>/fd, which needs it when the peer (a worker) runs as
         * root with capabilities. It is also what lets this process open a
         * root kvstashd's /proc/<pid>/mem: run kvstashd as its own user. */
        int ptrace_cap = capng_have_capability(CAPNG_EFFECTIVE, CAP_SYS_PTRACE);
        capng_clear(CAPNG_SELECT_BOTH);
        if (ptrace_cap)
            capng_update(CAPNG_ADD, CAPNG_EFFECTIVE | CAPNG_PERMITTED | CAPNG_BOUNDING_SET,
                         CAP_SYS_PTRACE);
        if (capng_apply(CAPNG_SELECT_BOTH) != 0)
            return fail(err, n, "dropping capabilities", EPERM);
    }
    scmp_filter_ctx f = seccomp_init(SCMP_ACT_ALLOW);
    if (!f)
        return fail(err, n, "seccomp_init", ENOMEM);
    /* every thread (the caller should have none yet: capabilities are per thread) */
    (void)seccomp_attr_set(f, SCMP_FLTATR_CTL_TSYNC, 1);
    const uint32_t no = SCMP_ACT_ERRNO(EPERM);
    const scmp_datum_t self = (scmp_datum_t)getpid();
    int rc = 0;
    rc |= seccomp_rule_add(f, no, SCMP_SYS(ptrace), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(process_vm_readv), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(process_vm_writev), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(kill), 1, SCMP_A0_32(SCMP_CMP_NE, self));
    rc |= seccomp_rule_add(f, no, SCMP_SYS(tgkill), 1, SCMP_A0_32(SCMP_CMP_NE, self));
    rc |= seccomp_rule_add(f, no, SCMP_SYS(rt_sigqueueinfo), 1, SCMP_A0_32(SCMP_CMP_NE, self));
    rc |= seccomp_rule_add(f, no, SCMP_SYS(rt_tgsigqueueinfo), 1, SCMP_A0_32(SCMP_CMP_NE, self));
    rc |= seccomp_rule_add(f, no, SCMP_SYS(tkill), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(pidfd_open), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(pidfd_send_signal), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(pidfd_getfd), 0);
    /* a process started with CLONE_PARENT would be kvstashd's child, whose
     * zombie kvstashd would have to reap; clone3's flags are behind a
     * pointer the filter cannot read: ENOSYS, and glibc falls back to clone */
    rc |= seccomp_rule_add(f, no, SCMP_SYS(clone), 1,
                           SCMP_CMP(0, SCMP_CMP_MASKED_EQ, CLONE_PARENT, CLONE_PARENT));
    rc |= seccomp_rule_add(f, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(setpgid), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(setsid), 0);
    rc |= seccomp_rule_add(f, no, SCMP_SYS(ioctl), 1, LOW32_EQ(1, TIOCSTI));
    /* SIGIO / SIGURG to a process or group of its choosing (the default
     * action of SIGIO ends a process): who gets a descriptor's signals */
    rc |= seccomp_rule_add(f, no, SCMP_SYS(fcntl), 1, LOW32_EQ(1, F_SETOWN));
    rc |= seccomp_rule_add(f, no, SCMP_SYS(fcntl), 1, LOW32_EQ(1, F_SETOWN_EX));
    rc |= seccomp_rule_add(f, no, SCMP_SYS(ioctl), 1, LOW32_EQ(1, FIOSETOWN));
    rc |= seccomp_rule_add(f, no, SCMP_SYS(ioctl), 1, LOW32_EQ(1, SIOCSPGRP));
    if (rc != 0) {
        seccomp_release(f);
        return fail(err, n, "seccomp_rule_add", EINVAL);
    }
    rc = seccomp_load(f);
    seccomp_release(f);
    if (rc != 0)
        return fail(err, n, "seccomp_load", rc);
    return 0;
}
