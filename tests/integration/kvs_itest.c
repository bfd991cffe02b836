/*
 * kvs_itest.c — shared helpers of the C integration tests (see kvs_itest.h).
 * The raw call owns every gRPC object it creates and releases all of them
 * (channel, queue drained to shutdown, call, buffers, metadata) before it
 * returns, whatever the status.
 */
#include "kvs_itest.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int kvs_itest_open_client(const char *addr, const char *token, int ucx, int call_timeout_ms,
                          kvs_client **out)
{
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = addr;
    o.token = token;
    o.connect_timeout_ms = 5000;
    o.call_timeout_ms = call_timeout_ms;
    o.ucx = ucx;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_open(&o, out, err);
    if (rc != 0)
        fprintf(stderr, "kvs_client_open(%s): %s: %s\n", addr, kvs_strerror(rc), err);
    return rc;
}

int kvs_itest_write_config(char *dir_tmpl, char *path, size_t path_len, const char *text)
{
    if (mkdtemp(dir_tmpl) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, path_len, "%s/kvstashd.ini", dir_tmpl);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad)
        fprintf(stderr, "cannot write %s\n", path);
    return bad;
}

int kvs_itest_start(const char *kvstashd, const char *const *args, kvs_server_proc *p,
                    const char *what)
{
    char err[KVS_ERR_LEN] = "";
    if (kvs_server_proc_start(kvstashd, args, p, err) != 0) {
        fprintf(stderr, "cannot start kvstashd (%s): %s\n", what, err);
        return 1;
    }
    return 0;
}

int kvs_itest_stop(kvs_server_proc *p, int timeout_ms)
{
    int status = -1;
    double ms = 0;
    int rc = kvs_server_proc_stop(p, SIGTERM, timeout_ms, &status, &ms);
    if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "kvstashd did not exit cleanly: rc=%d status=0x%x after %.0f ms\n", rc,
                status, ms);
        return 1;
    }
    return 0;
}

grpc_status_code kvs_itest_raw_call(const char *addr, const char *token, const char *method,
                                    const void *payload, size_t len, int timeout_ms,
                                    uint8_t **reply, size_t *reply_len, char *details, size_t n)
{
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(addr, creds, NULL);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice path = grpc_slice_from_copied_string(method);
    grpc_call *call =
        grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, path, NULL, deadline, NULL);
    grpc_slice_unref(path);
    grpc_slice s = grpc_slice_from_copied_buffer(payload, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_metadata auth;
    memset(&auth, 0, sizeof auth);
    if (token != NULL) {
        char bearer[300];
        snprintf(bearer, sizeof bearer, "Bearer %s", token);
        auth.key = grpc_slice_from_static_string("authorization");
        auth.value = grpc_slice_from_copied_string(bearer);
    }
    grpc_metadata_array md_in, md_trail;
    grpc_metadata_array_init(&md_in);
    grpc_metadata_array_init(&md_trail);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice det = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = token != NULL ? 1 : 0;
    ops[0].data.send_initial_metadata.metadata = token != NULL ? &auth : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_in;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &md_trail;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &det;
    if (grpc_call_start_batch(call, ops, 6, ops, NULL) == GRPC_CALL_OK)
        grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (details != NULL)
        snprintf(details, n, "%.*s", (int)GRPC_SLICE_LENGTH(det),
                 (const char *)GRPC_SLICE_START_PTR(det));
    if (reply != NULL) {
        *reply = NULL;
        *reply_len = 0;
    }
    if (recv != NULL) {
        if (reply != NULL) {
            grpc_byte_buffer_reader rd;
            grpc_byte_buffer_reader_init(&rd, recv);
            grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
            *reply_len = GRPC_SLICE_LENGTH(all);
            *reply = malloc(*reply_len + 1);
            memcpy(*reply, GRPC_SLICE_START_PTR(all), *reply_len);
            grpc_slice_unref(all);
        }
        grpc_byte_buffer_destroy(recv);
    }
    if (token != NULL)
        grpc_slice_unref(auth.value);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(det);
    grpc_metadata_array_destroy(&md_in);
    grpc_metadata_array_destroy(&md_trail);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    return status;
}
