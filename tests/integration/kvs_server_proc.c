/*
 * kvs_server_proc.c — see kvs_server_proc.h.
 *
 * The port file is the readiness signal: kvstashd writes "<port>\n" only once
 * it listens, so a file without its newline is still being written and we keep
 * polling. While polling we also reap the child with WNOHANG so a server that
 * dies at start fails the test at once with its exit status, not after 10 s.
 */
#include "kvs_server_proc.h"

#include "kvs_error.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_TIMEOUT_MS 10000
#define POLL_MS 10

double kvs_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void port_file_path(const kvs_server_proc *p, char *buf, size_t n)
{
    snprintf(buf, n, "%s/port", p->dir);
}

static void remove_dir(kvs_server_proc *p)
{
    if (p->dir[0] == '\0')
        return;
    char path[128];
    port_file_path(p, path, sizeof path);
    unlink(path);
    rmdir(p->dir);
    p->dir[0] = '\0';
}

/* Reads "<port>\n"; returns the port, 0 while the file is absent or partial,
 * -1 when it holds something else. */
static int read_port(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char buf[32] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n == 0 || buf[n - 1] != '\n')
        return 0;
    char *end;
    long port = strtol(buf, &end, 10);
    if (end == buf || *end != '\n' || port <= 0 || port > 65535)
        return -1;
    return (int)port;
}

void kvs_server_proc_kill(kvs_server_proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR)
            ;
        p->pid = 0;
    }
    remove_dir(p);
}

int kvs_server_proc_start(const char *kvstashd_path, const char *const *extra_args,
                          kvs_server_proc *p, char *err)
{
    memset(p, 0, sizeof *p);
    if (kvstashd_path == NULL || access(kvstashd_path, X_OK) != 0) {
        (void)kvs_fail(err, 0, "kvstashd '%s' is not an executable",
                       kvstashd_path ? kvstashd_path : "(null)");
        return -1;
    }
    snprintf(p->dir, sizeof p->dir, "/tmp/kvs-test-XXXXXX");
    if (mkdtemp(p->dir) == NULL) {
        (void)kvs_fail(err, 0, "mkdtemp: %s", strerror(errno));
        p->dir[0] = '\0';
        return -1;
    }
    char port_path[128];
    port_file_path(p, port_path, sizeof port_path);

    size_t n_extra = 0;
    while (extra_args != NULL && extra_args[n_extra] != NULL)
        n_extra++;
    const char **argv = calloc(n_extra + 6, sizeof *argv);
    if (argv == NULL) {
        (void)kvs_fail(err, 0, "out of memory");
        remove_dir(p);
        return -1;
    }
    size_t k = 0;
    argv[k++] = kvstashd_path;
    argv[k++] = "--listen";
    argv[k++] = "127.0.0.1:0";
    argv[k++] = "--port-file";
    argv[k++] = port_path;
    for (size_t i = 0; i < n_extra; i++)
        argv[k++] = extra_args[i];
    argv[k] = NULL;

    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        (void)kvs_fail(err, 0, "fork: %s", strerror(errno));
        free(argv);
        remove_dir(p);
        return -1;
    }
    if (pid == 0) {
        /* Child: die with the parent; start from a clean signal state. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        execv(kvstashd_path, (char *const *)argv);
        fprintf(stderr, "execv %s: %s\n", kvstashd_path, strerror(errno));
        _exit(127);
    }
    free(argv);
    p->pid = pid;

    double t0 = kvs_test_now_ms();
    for (;;) {
        int port = read_port(port_path);
        if (port > 0) {
            p->port = port;
            snprintf(p->addr, sizeof p->addr, "127.0.0.1:%d", port);
            return 0;
        }
        if (port < 0) {
            (void)kvs_fail(err, 0, "port file %s holds no port number", port_path);
            break;
        }
        int status;
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            p->pid = 0;
            if (WIFEXITED(status))
                (void)kvs_fail(err, 0, "kvstashd exited with status %d before listening",
                               WEXITSTATUS(status));
            else
                (void)kvs_fail(err, 0, "kvstashd died of signal %d before listening",
                               WIFSIGNALED(status) ? WTERMSIG(status) : -1);
            break;
        }
        if (kvs_test_now_ms() - t0 > START_TIMEOUT_MS) {
            (void)kvs_fail(err, 0, "kvstashd wrote no port file within %d ms", START_TIMEOUT_MS);
            break;
        }
        sleep_ms(POLL_MS);
    }
    kvs_server_proc_kill(p);
    return -1;
}

int kvs_server_proc_stop(kvs_server_proc *p, int sig, int timeout_ms, int *wait_status,
                         double *elapsed_ms)
{
    if (wait_status != NULL)
        *wait_status = 0;
    if (elapsed_ms != NULL)
        *elapsed_ms = 0;
    if (p->pid <= 0) {
        remove_dir(p);
        return 0;
    }
    double t0 = kvs_test_now_ms();
    kill(p->pid, sig);
    int rc = -1;
    for (;;) {
        int status;
        pid_t w = waitpid(p->pid, &status, WNOHANG);
        if (w == p->pid) {
            if (wait_status != NULL)
                *wait_status = status;
            p->pid = 0;
            rc = 0;
            break;
        }
        if (w < 0 && errno != EINTR) {
            p->pid = 0; /* not our child any more: nothing to reap */
            break;
        }
        if (kvs_test_now_ms() - t0 > timeout_ms)
            break;
        sleep_ms(2);
    }
    if (elapsed_ms != NULL)
        *elapsed_ms = kvs_test_now_ms() - t0;
    kvs_server_proc_kill(p);
    return rc;
}

pid_t kvs_server_proc_xferd(pid_t pid)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    pid_t found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char cp[384];
        snprintf(cp, sizeof cp, "%s/%s/children", path, e->d_name);
        FILE *f = fopen(cp, "r");
        int c;
        while (f && !found && fscanf(f, "%d", &c) == 1) {
            char comm[64] = "", pp[64];
            snprintf(pp, sizeof pp, "/proc/%d/comm", c);
            FILE *g = fopen(pp, "r");
            if (g && fgets(comm, sizeof comm, g) && strncmp(comm, "kvstash-xferd", 13) == 0)
                found = c;
            if (g)
                fclose(g);
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}
