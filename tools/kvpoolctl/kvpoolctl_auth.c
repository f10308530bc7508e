/*
 * kvpoolctl_auth.c — keys for kvpoolctl (docs/security.md):
 *   kvpoolctl keygen PATH [--name NAME] [--role client|segment|admin|master] [--tenant T]
 *                         [--address HOST:PORT]
 * writes PATH (public: copy it into the masters' allowed-keys directory) and PATH_secret, and
 * the CURVE session of the admin commands: the cluster file's admin key, or KVPOOL_AUTH,
 * KVPOOL_AUTH_KEY and KVPOOL_AUTH_MASTER_KEYS from the environment.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "actors/session/msession.h"
#include "auth/auth.h"
#include "kvpool.h"
#include "tools/kvpoolctl/kvpoolctl_ctl.h"

int ctl_cmd_keygen(struct ctl *c, int argc, char **argv)
{
    const char *path = NULL, *name = NULL, *role = "client", *tenant = "", *address = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = strcmp(a, "--name") == 0      ? &name
                           : strcmp(a, "--role") == 0    ? &role
                           : strcmp(a, "--tenant") == 0  ? &tenant
                           : strcmp(a, "--address") == 0 ? &address
                                                         : NULL;
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvpoolctl keygen: %s needs a value\n", a);
                return 2;
            }
            *dst = argv[++i];
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "kvpoolctl keygen: unexpected '%s'\n", a);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: kvpoolctl keygen PATH [--name NAME] [--role client|segment|admin|master] "
                        "[--tenant T] [--address HOST:PORT]\n");
        return 2;
    }
    if (!name) {
        const char *b = strrchr(path, '/');
        name = b ? b + 1 : path;
    }
    int rc = kvp_auth_keygen(path, name, role, tenant, address);
    if (rc != KVP_OK) {
        fprintf(stderr, "kvpoolctl keygen: %s\n", kvp_strerror(rc));
        return rc == KVP_ERR_INVALID || rc == KVP_ERR_EXISTS ? 2 : 1;
    }
    if (c->json)
        printf("{\"public\":\"%s\",\"secret\":\"%s_secret\",\"role\":\"%s\",\"tenant\":\"%s\"}\n", path, path, role,
               tenant);
    else
        printf("wrote %s (public: copy into the masters' allowed-keys directory) and %s_secret (keep private)\n",
               path, path);
    return 0;
}

int ctl_msession_open(struct ctl *c)
{
    const char *file = c->cluster_file;
    if (!c->masters_arg && !file)
        file = getenv("KVPOOL_CLUSTER_FILE");
    char path[1100] = "";
    struct stat sb;
    if (file && *file && stat(file, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(path, sizeof path, "%s/cluster.json", file);
    else if (file)
        snprintf(path, sizeof path, "%s", file);
    struct kvp_auth_client *auth = NULL;
    int rc = kvp_auth_client_load(&auth, getenv("KVPOOL_AUTH"), getenv("KVPOOL_AUTH_KEY"),
                                  getenv("KVPOOL_AUTH_MASTER_KEYS"), path, "admin_key", "kvpoolctl");
    if (rc != KVP_OK) {
        fprintf(stderr, "kvpoolctl: no usable keys (the cluster file's \"auth\" section, or KVPOOL_AUTH_KEY and "
                        "KVPOOL_AUTH_MASTER_KEYS; KVPOOL_AUTH=none without authentication)\n");
        return rc;
    }
    rc = kvp_msession_new_auth(&c->ms, (const char *const *)c->masters, c->n_masters, "kvpoolctl", &auth);
    kvp_auth_client_destroy(&auth);
    return rc;
}

/* ------------------------------------------------------------------ cluster up */

static int rm_tree_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static int keypair(const char *dir, const char *name, const char *role, const char *tenant, const char *address,
                   const char *const copy_dirs[])
{
    char path[1200], pub[1300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = kvp_auth_keygen(path, name, role, tenant, address);
    for (int i = 0; rc == KVP_OK && copy_dirs[i]; i++) {
        snprintf(pub, sizeof pub, "%s/%s", copy_dirs[i], name);
        rc = kvp_auth_export_public(path, pub);
    }
    return rc;
}

int ctl_cluster_keys(const char *dir, int n_masters, const char *const *master_addrs, bool auth_off, json_t *cl)
{
    json_t *a = json_object();
    json_object_set_new(cl, "auth", a);
    if (auth_off) {
        json_object_set_new(a, "mode", json_string("none"));
        return 0;
    }
    char keys[1100], allowed[1200], masters[1200];
    snprintf(keys, sizeof keys, "%s/keys", dir);
    snprintf(allowed, sizeof allowed, "%s/allowed", keys);
    snprintf(masters, sizeof masters, "%s/masters", keys);
    nftw(keys, rm_tree_entry, 16, FTW_DEPTH | FTW_PHYS); /* a fresh cluster gets fresh keys */
    if (mkdir(keys, 0700) != 0 || mkdir(allowed, 0755) != 0 || mkdir(masters, 0755) != 0) {
        fprintf(stderr, "kvpoolctl cluster up: cannot create %s: %s\n", keys, strerror(errno));
        return 1;
    }
    const char *to_allowed[] = {allowed, NULL};
    const char *to_both[] = {allowed, masters, NULL};
    int rc = KVP_OK;
    for (int i = 0; rc == KVP_OK && i < n_masters; i++) {
        char name[32];
        snprintf(name, sizeof name, "master-%d", i + 1);
        rc = keypair(keys, name, "master", "", master_addrs[i], to_both);
    }
    if (rc == KVP_OK)
        rc = keypair(keys, "client", "client", "", NULL, to_allowed);
    if (rc == KVP_OK)
        rc = keypair(keys, "segment", "segment", "", NULL, to_allowed);
    if (rc == KVP_OK)
        rc = keypair(keys, "admin", "admin", "", NULL, to_allowed);
    if (rc != KVP_OK) {
        fprintf(stderr, "kvpoolctl cluster up: cannot write keys in %s: %s\n", keys, kvp_strerror(rc));
        return 1;
    }
    char p[1300];
    json_object_set_new(a, "mode", json_string("curve"));
    json_object_set_new(a, "allowed_dir", json_string(allowed));
    json_object_set_new(a, "master_keys", json_string(masters));
    snprintf(p, sizeof p, "%s/client_secret", keys);
    json_object_set_new(a, "client_key", json_string(p));
    snprintf(p, sizeof p, "%s/segment_secret", keys);
    json_object_set_new(a, "segment_key", json_string(p));
    snprintf(p, sizeof p, "%s/admin_secret", keys);
    json_object_set_new(a, "admin_key", json_string(p));
    return 0;
}

size_t ctl_cluster_auth_args(json_t *cl, const char *role, int master_index, const char **cmd, size_t ncmd,
                             char *buf, size_t cap)
{
    json_t *a = json_object_get(cl, "auth");
    const char *mode = json_string_value(json_object_get(a, "mode"));
    if (mode && strcmp(mode, "none") == 0) {
        cmd[ncmd++] = "--auth";
        cmd[ncmd++] = "none";
        return ncmd;
    }
    if (strcmp(role, "master") == 0) {
        const char *allowed = json_string_value(json_object_get(a, "allowed_dir"));
        const char *mk = json_string_value(json_object_get(a, "master_keys"));
        snprintf(buf, cap, "%.*s/master-%d_secret", (int)(strlen(mk) - strlen("/masters")), mk, master_index + 1);
        cmd[ncmd++] = "--auth-key";
        cmd[ncmd++] = buf;
        cmd[ncmd++] = "--auth-allowed-dir";
        cmd[ncmd++] = allowed;
        cmd[ncmd++] = "--auth-master-keys";
        cmd[ncmd++] = mk;
    } else {
        cmd[ncmd++] = "--auth-key";
        cmd[ncmd++] = json_string_value(json_object_get(a, "segment_key"));
        cmd[ncmd++] = "--auth-master-keys";
        cmd[ncmd++] = json_string_value(json_object_get(a, "master_keys"));
    }
    return ncmd;
}
