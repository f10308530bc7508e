/*
 * api_config.h — the public kvp_config (include/kvpool.h) is a struct kvp_cfg_client
 * (config/config.h). The client reads cfg->c; the public kvp_config_* functions in
 * api_config.c fill it through the CLIENT key table.
 */
#ifndef KVP_CLIENT_API_CONFIG_H
#define KVP_CLIENT_API_CONFIG_H

#include "config/config.h"
#include "kvpool.h"

struct kvp_config {
    struct kvp_cfg_client c; /* the effective client settings; defaults after kvp_config_new() */
};

/**
 * Apply every KVPOOL_<KEY> environment variable that names a client key (e.g.
 * KVPOOL_MASTER_SERVER_ADDRESS, KVPOOL_TRANSFER_TIMEOUT). Call it after kvp_config_load_file()
 * and before kvp_config_set() of command-line values to get defaults < file < env < flags.
 * Errors: KVP_ERR_INVALID (NULL cfg, or a bad value: logged, cfg unchanged).
 * Proposed for include/kvpool.h.
 */
int kvp_config_load_env(kvp_config *cfg);

/** The effective config as JSON (malloc'd; free()). NULL on NULL cfg or out of memory. */
char *kvp_config_to_json(const kvp_config *cfg);

#endif
