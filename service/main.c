/*
 * main.c — kvstashd: parse the configuration, start the server, wait for
 * SIGTERM or SIGINT (SIGHUP: reload the configuration), stop cleanly, exit 0.
 *
 * Signals are blocked in every thread (the mask is set before any thread
 * starts) and taken synchronously with sigwait here, so no handler runs in an
 * arbitrary gRPC thread.
 */
#include "config.h"
#include "kvs_error.h"
#include "kvs_log.h"
#include "server.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

extern char **environ;

/* SIGHUP: read the file, environment and flags again and apply what changed. */
static void reload(kvs_server *srv, int argc, char **argv)
{
    char err[KVS_ERR_LEN] = "";
    if (kvs_server_reload(srv, argc, argv, environ, err) != 0)
        KVS_LOG_ERROR("main", "SIGHUP: configuration not reloaded, nothing changed: %s", err);
    else
        KVS_LOG_INFO("main", "SIGHUP: configuration reloaded");
}

int main(int argc, char **argv)
{
    kvs_config cfg;
    kvs_config_action action;
    char err[KVS_ERR_LEN] = "";
    if (kvs_config_from_args(&cfg, argc, argv, environ, &action, err) != 0) {
        fprintf(stderr, "kvstashd: %s\n", err);
        return 2;
    }
    switch (action) {
    case KVS_CONFIG_HELP:
        kvs_config_print_usage(stdout, "kvstashd");
        return 0;
    case KVS_CONFIG_HELP_MD:
        kvs_config_print_markdown(stdout);
        return 0;
    case KVS_CONFIG_VERSION:
        printf("%s\n", kvs_server_version());
        return 0;
    case KVS_CONFIG_RUN:
        break;
    }

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    kvs_server *srv;
    int rc = kvs_server_start(&cfg, &srv, err);
    if (rc != 0) {
        KVS_LOG_ERROR("main", "cannot start: %s", err);
        return 1;
    }
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGHUP) {
            reload(srv, argc, argv);
            continue;
        }
        KVS_LOG_INFO("main", "%s received, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        break;
    }
    return kvs_server_stop(srv) == 0 ? 0 : 1;
}
