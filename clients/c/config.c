/*
 * config.c — libkvstash: GetConfig / SetConfig and the plain kvs_config copy
 * of their replies.
 *
 * The server owns the one config table (STYLE.md); the client only carries
 * names and values as text, so adding a server setting needs no client change.
 * Atomicity of SetConfig is the server's promise: the client sends every
 * setting in one request.
 */
#include "client_int.h"

#include "kvstash/v1/kvstash.pb-c.h"

#include <stdlib.h>

void kvs_config_free(kvs_config *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < cfg->n; i++) {
        kvs_config_entry *e = &cfg->entries[i];
        free(e->name);
        free(e->value);
        free(e->type);
        free(e->help);
        free(e->min);
        free(e->max);
        free(e->default_value);
    }
    free(cfg->entries);
    free(cfg);
}

int kvs__config_from_pb(Kvstash__V1__ConfigEntry *const *entries, size_t n, kvs_config **out)
{
    *out = NULL;
    kvs_config *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL)
        return KVS_ENOMEM;
    if (n > 0 && (cfg->entries = calloc(n, sizeof *cfg->entries)) == NULL)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        const Kvstash__V1__ConfigEntry *pe = entries[i];
        kvs_config_entry *e = &cfg->entries[i];
        cfg->n = i + 1; /* so kvs_config_free frees what was copied */
        e->runtime = pe->runtime ? 1 : 0;
        e->name = kvs__strdup(pe->name);
        e->value = kvs__strdup(pe->value);
        e->type = kvs__strdup(pe->type);
        e->help = kvs__strdup(pe->help);
        e->min = kvs__strdup(pe->min);
        e->max = kvs__strdup(pe->max);
        e->default_value = kvs__strdup(pe->default_value);
        if (!e->name || !e->value || !e->type || !e->help || !e->min || !e->max ||
            !e->default_value)
            goto nomem;
    }
    *out = cfg;
    return 0;
nomem:
    kvs_config_free(cfg);
    return KVS_ENOMEM;
}

int kvs_client_get_config(kvs_client *c, const char *const *names, size_t n_names,
                          int timeout_ms, kvs_config **out, char *err)
{
    if (c == NULL || out == NULL || (n_names > 0 && names == NULL)) {
        kvs__set_err(err, "kvs_client_get_config: client, out and names are required");
        return KVS_EINVAL;
    }
    *out = NULL; /* on a failure from here on, a forked copy's included */
    if (kvs__forked(c, "kvs_client_get_config", err) != 0)
        return KVS_EPRECOND;
    for (size_t i = 0; i < n_names; i++) {
        if (names[i] == NULL) {
            kvs__set_err(err, "kvs_client_get_config: names[%zu] is NULL", i);
            return KVS_EINVAL;
        }
    }
    Kvstash__V1__GetConfigRequest req = KVSTASH__V1__GET_CONFIG_REQUEST__INIT;
    req.n_names = n_names;
    req.names = (char **)names; /* only read by pack */
    ProtobufCMessage *rep = NULL;
    int rc = kvs__call_pb(c, KVS__METHOD_GET_CONFIG, &req.base,
                          &kvstash__v1__get_config_response__descriptor, timeout_ms, &rep, err);
    if (rc != 0)
        return rc;
    const Kvstash__V1__GetConfigResponse *r = (const Kvstash__V1__GetConfigResponse *)rep;
    rc = kvs__config_from_pb(r->entries, r->n_entries, out);
    protobuf_c_message_free_unpacked(rep, NULL);
    if (rc != 0)
        kvs__set_err(err, "out of memory");
    return rc;
}

int kvs_client_set_config(kvs_client *c, const char *const *names, const char *const *values,
                          size_t n, int dry_run, int timeout_ms, kvs_config **out, char *err)
{
    if (out != NULL)
        *out = NULL;
    if (c == NULL || (n > 0 && (names == NULL || values == NULL))) {
        kvs__set_err(err, "kvs_client_set_config: client, names and values are required");
        return KVS_EINVAL;
    }
    if (kvs__forked(c, "kvs_client_set_config", err) != 0)
        return KVS_EPRECOND;
    for (size_t i = 0; i < n; i++) {
        if (names[i] == NULL || values[i] == NULL) {
            kvs__set_err(err, "kvs_client_set_config: setting %zu has a NULL name or value", i);
            return KVS_EINVAL;
        }
    }
    Kvstash__V1__ConfigSetting *settings = calloc(n ? n : 1, sizeof *settings);
    Kvstash__V1__ConfigSetting **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (settings == NULL || ptrs == NULL) {
        free(settings);
        free(ptrs);
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kvstash__v1__config_setting__init(&settings[i]);
        settings[i].name = (char *)names[i];
        settings[i].value = (char *)values[i];
        ptrs[i] = &settings[i];
    }
    Kvstash__V1__SetConfigRequest req = KVSTASH__V1__SET_CONFIG_REQUEST__INIT;
    req.n_settings = n;
    req.settings = ptrs;
    req.dry_run = dry_run ? 1 : 0;
    ProtobufCMessage *rep = NULL;
    int rc = kvs__call_pb(c, KVS__METHOD_SET_CONFIG, &req.base,
                          &kvstash__v1__set_config_response__descriptor, timeout_ms, &rep, err);
    free(ptrs);
    free(settings);
    if (rc != 0)
        return rc;
    if (out != NULL) {
        const Kvstash__V1__SetConfigResponse *r = (const Kvstash__V1__SetConfigResponse *)rep;
        rc = kvs__config_from_pb(r->entries, r->n_entries, out);
        if (rc != 0)
            kvs__set_err(err, "out of memory");
    }
    protobuf_c_message_free_unpacked(rep, NULL);
    return rc;
}
