/* api_config.c — the public config API of include/kvpool.h over config/ (CLIENT key table). */
#include <stdlib.h>

#include "actors/client/api_config.h"
#include "runtime/log.h"

int kvp_config_new(kvp_config **out)
{
    if (!out) {
        kvp_log_error("config", "kvp_config_new: out is NULL");
        return KVP_ERR_INVALID;
    }
    kvp_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        return KVP_ERR_NOMEM;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &cfg->c);
    *out = cfg;
    return KVP_OK;
}

int kvp_config_set(kvp_config *cfg, const char *key, const char *value)
{
    if (!cfg || !key || !value) {
        kvp_log_error("config", "kvp_config_set: NULL %s", !cfg ? "cfg" : !key ? "key" : "value");
        return KVP_ERR_INVALID;
    }
    return kvp_cfg_set(KVP_CFG_CLIENT, &cfg->c, key, value);
}

int kvp_config_load_file(kvp_config *cfg, const char *path)
{
    if (!cfg || !path) {
        kvp_log_error("config", "kvp_config_load_file: NULL %s", !cfg ? "cfg" : "path");
        return KVP_ERR_INVALID;
    }
    return kvp_cfg_load_file(KVP_CFG_CLIENT, &cfg->c, path);
}

int kvp_config_load_env(kvp_config *cfg)
{
    if (!cfg) {
        kvp_log_error("config", "kvp_config_load_env: NULL cfg");
        return KVP_ERR_INVALID;
    }
    return kvp_cfg_load_env(KVP_CFG_CLIENT, &cfg->c);
}

char *kvp_config_to_json(const kvp_config *cfg)
{
    return cfg ? kvp_cfg_to_json(KVP_CFG_CLIENT, &cfg->c) : NULL;
}

void kvp_config_destroy(kvp_config **cfg)
{
    if (!cfg || !*cfg)
        return;
    free(*cfg);
    *cfg = NULL;
}
