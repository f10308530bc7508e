/* config_masters.c — the master list of a client or segment: master_server_address or cluster_file. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "config/config_internal.h"
#include "kvpool.h"
#include "runtime/log.h"

#define ACTOR "config"

int kvp_cfg_parse_masters(const char *s, char **out, size_t cap, size_t *n, char *why, size_t why_cap)
{
    size_t count = 0;
    int rc = KVP_OK;
    if (!s || !n) {
        snprintf(why, why_cap, "no master list");
        return KVP_ERR_INVALID;
    }
    const char *p = s;
    while (rc == KVP_OK) {
        const char *comma = strchr(p, ',');
        const char *e = comma ? comma : p + strlen(p);
        const char *b = p;
        while (b < e && isspace((unsigned char)*b))
            b++;
        while (e > b && isspace((unsigned char)e[-1]))
            e--;
        if (e - b >= 6 && strncasecmp(b, "tcp://", 6) == 0)
            b += 6;
        size_t len = (size_t)(e - b);
        if (len > 0) {
            if (kvp_cfg_parse_hostport(b, len, NULL, 0, NULL) != KVP_OK) {
                snprintf(why, why_cap,
                         "entry '%.*s' is not host:port or [ipv6]:port (port 1-65535); expected "
                         "host:port[,host:port...], tcp:// prefix allowed",
                         (int)(len > 128 ? 128 : len), b);
                rc = KVP_ERR_INVALID;
            } else if (count >= cap) {
                snprintf(why, why_cap, "more than %zu masters", cap);
                rc = KVP_ERR_INVALID;
            } else {
                if (out) {
                    out[count] = strndup(b, len);
                    if (!out[count]) {
                        snprintf(why, why_cap, "out of memory");
                        rc = KVP_ERR_NOMEM;
                        break;
                    }
                }
                count++;
            }
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    if (rc == KVP_OK && count == 0) {
        snprintf(why, why_cap, "no master address given; expected host:port[,host:port...]");
        rc = KVP_ERR_INVALID;
    }
    if (rc != KVP_OK) {
        if (out)
            kvp_cfg_free_masters(out, count);
        count = 0;
    }
    *n = count;
    return rc;
}

static int masters_from_cluster_file(const char *path, char **out, size_t cap, size_t *n)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        kvp_log_error(ACTOR, "cluster_file=%s: cannot open: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    json_error_t jerr;
    json_t *root = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!root) {
        kvp_log_error(ACTOR, "cluster_file=%s:%d:%d: not valid JSON: %s", path, jerr.line, jerr.column,
                      jerr.text);
        return KVP_ERR_INVALID;
    }
    int rc = KVP_OK;
    char why[256];
    json_t *msa = json_object_get(root, "master_server_address");
    json_t *arr = json_object_get(root, "masters");
    if (json_is_string(msa)) {
        rc = kvp_cfg_parse_masters(json_string_value(msa), out, cap, n, why, sizeof why);
        if (rc != KVP_OK)
            kvp_log_error(ACTOR, "cluster_file=%s: master_server_address=%.256s: %s", path,
                          json_string_value(msa), why);
    } else if (json_is_array(arr) && json_array_size(arr) > 0) {
        /* fall back to masters[].address */
        size_t idx;
        json_t *m;
        char *list = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&list, &len);
        if (!mf) {
            json_decref(root);
            return KVP_ERR_NOMEM;
        }
        json_array_foreach(arr, idx, m) {
            json_t *a = json_object_get(m, "address");
            if (json_is_string(a))
                fprintf(mf, "%s%s", idx ? "," : "", json_string_value(a));
        }
        fclose(mf);
        rc = kvp_cfg_parse_masters(list ? list : "", out, cap, n, why, sizeof why);
        if (rc != KVP_OK)
            kvp_log_error(ACTOR, "cluster_file=%s: masters[].address: %s", path, why);
        free(list);
    } else {
        kvp_log_error(ACTOR, "cluster_file=%s: has no \"master_server_address\" string", path);
        rc = KVP_ERR_INVALID;
    }
    json_decref(root);
    return rc;
}

int kvp_cfg_masters(const char *master_server_address, const char *cluster_file, char **out,
                    size_t cap, size_t *n)
{
    if (!out || !n) {
        kvp_log_error(ACTOR, "masters: NULL argument");
        return KVP_ERR_INVALID;
    }
    *n = 0;
    if (master_server_address && *master_server_address) {
        char why[256];
        int rc = kvp_cfg_parse_masters(master_server_address, out, cap, n, why, sizeof why);
        if (rc != KVP_OK)
            kvp_log_error(ACTOR, "master_server_address=%.256s: %s", master_server_address, why);
        return rc;
    }
    if (cluster_file && *cluster_file)
        return masters_from_cluster_file(cluster_file, out, cap, n);
    kvp_log_error(ACTOR, "no masters: set master_server_address (host:port,...) or cluster_file");
    return KVP_ERR_INVALID;
}

void kvp_cfg_free_masters(char **list, size_t n)
{
    if (!list)
        return;
    for (size_t i = 0; i < n; i++) {
        free(list[i]);
        list[i] = NULL;
    }
}
