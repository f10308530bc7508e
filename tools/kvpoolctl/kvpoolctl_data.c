/*
 * kvpoolctl_data.c — kvpoolctl put/get/exists/rm/size: one key at a time through the public
 * client API (include/kvpool.h), as any application would use it. See tools/kvpoolctl/kvpoolctl.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "actors/client/api_config.h" /* kvp_config_load_env: proposed for kvpool.h */
#include "kvpool.h"
#include "tools/kvpoolctl/kvpoolctl.h"

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

struct data_args {
    const char *cmd;
    const char *key;
    const char *file;       /* put: FILE or "-" */
    const char *output;     /* get: -o FILE */
    bool force;             /* rm */
    bool soft_pin;          /* put */
    const char *preferred;  /* put */
    bool help;
    bool json;              /* --json: one JSON object on stdout per command */
};

void kvpctl_data_usage(FILE *out)
{
    fprintf(out,
            "  kvpoolctl put KEY FILE|-        store FILE (or stdin) under KEY\n"
            "                                  [--replica-num N] [--soft-pin] [--preferred-segment NAME]\n"
            "  kvpoolctl get KEY [-o FILE|FILE] write the object to stdout or FILE\n"
            "  kvpoolctl exists KEY            exit 0 if KEY exists, 1 if not, 2 on error\n"
            "  kvpoolctl rm KEY [--force]      remove KEY (--force: even under a read lease)\n"
            "  kvpoolctl size KEY              print the object's size in bytes\n"
            "  data command flags: --masters host:port,... | --cluster DIR[/cluster.json],\n"
            "    --config FILE (client JSON), --timeout MS, --json (a JSON object on stdout),\n"
            "    any client key as --key=value (docs/config.md);\n"
            "    environment KVPOOL_MASTER_SERVER_ADDRESS etc. (flags > env > file > defaults)\n");
}

static void errmsg(const char *cmd, const char *key, const char *what, int err)
{
    fprintf(stderr, "kvpoolctl %s%s%s: %s%s%s (%s)\n", cmd, key ? " " : "", key ? key : "", what ? what : "",
            what ? ": " : "", kvp_strerror(err), kvp_errname(err));
}

/* --json: print {"command", "key", <field>: <value>} on stdout; takes ownership of value. */
static void json_result(const struct data_args *a, const char *field, json_t *value)
{
    json_t *o = json_object();
    json_object_set_new(o, "command", json_string(a->cmd));
    json_object_set_new(o, "key", json_string(a->key));
    if (field)
        json_object_set_new(o, field, value);
    else
        json_decref(value);
    char *js = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (js)
        printf("%s\n", js);
    free(js);
    json_decref(o);
}

/* An operation failed: text on stderr, and with --json an error object on stdout. */
static void op_error(const struct data_args *a, const char *what, int err)
{
    errmsg(a->cmd, a->key, what, err);
    if (a->json) {
        json_t *e = json_object();
        json_object_set_new(e, "code", json_integer(err));
        json_object_set_new(e, "name", json_string(kvp_errname(err)));
        json_object_set_new(e, "message", json_string(kvp_strerror(err)));
        json_result(a, "error", e);
    }
}

/* "--name=value" / "--name value" / "-o value": value of a flag or NULL (usage error). */
static const char *flag_value(int argc, char **argv, int *i, const char *eq)
{
    if (eq)
        return eq + 1;
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

static bool is_flag(const char *a, const char *name, size_t len)
{
    size_t nl = strlen(name);
    if (nl != len)
        return false;
    for (size_t i = 0; i < len; i++) {
        char x = a[i] == '-' ? '_' : a[i], y = name[i] == '-' ? '_' : name[i];
        if (x != y)
            return false;
    }
    return true;
}

/* --cluster accepts DIR (then DIR/cluster.json) or the file itself. */
static int set_cluster(kvp_config *cfg, const char *path)
{
    struct stat st;
    char buf[1100];
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(buf, sizeof buf, "%s/cluster.json", path);
        path = buf;
    }
    int rc = kvp_config_set(cfg, "cluster_file", path);
    if (rc == KVP_OK)
        rc = kvp_config_set(cfg, "master_server_address", ""); /* the flag beats the environment */
    return rc;
}

/*
 * Build the config and the arguments. Two passes: --config files first (lowest layer above
 * the defaults), then the environment, then every other flag in order.
 */
static int parse(int argc, char **argv, kvp_config *cfg, struct data_args *a)
{
    a->cmd = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--") == 0)
            break;
        if (s[0] != '-' || s[1] == '\0')
            continue;
        const char *name = s + (s[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        if (is_flag(name, "config", eq ? (size_t)(eq - name) : strlen(name))) {
            const char *v = flag_value(argc, argv, &i, eq);
            if (!v) {
                fprintf(stderr, "kvpoolctl %s: --config needs a file\n", a->cmd);
                return EXIT_USAGE;
            }
            int rc = kvp_config_load_file(cfg, v);
            if (rc != KVP_OK) {
                errmsg(a->cmd, NULL, v, rc);
                return EXIT_USAGE;
            }
        }
    }
    int rc = kvp_config_load_env(cfg);
    if (rc != KVP_OK) {
        errmsg(a->cmd, NULL, "environment", rc);
        return EXIT_USAGE;
    }

    const char *pos[3];
    int npos = 0;
    bool only_pos = false, masters_given = false;
    const char *cluster = NULL;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (only_pos || s[0] != '-' || strcmp(s, "-") == 0) {
            if (npos >= 3) {
                fprintf(stderr, "kvpoolctl %s: unexpected argument '%s'\n", a->cmd, s);
                return EXIT_USAGE;
            }
            pos[npos++] = s;
            continue;
        }
        if (strcmp(s, "--") == 0) {
            only_pos = true;
            continue;
        }
        const char *name = s + (s[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const char *v = NULL;
        if (is_flag(name, "config", len)) {
            if (!eq)
                i++; /* applied above */
            continue;
        }
        if (is_flag(name, "h", len) || is_flag(name, "help", len)) {
            a->help = true;
            continue;
        }
        if (is_flag(name, "force", len) && !eq) {
            a->force = true;
            continue;
        }
        if (is_flag(name, "json", len) && !eq) {
            a->json = true;
            continue;
        }
        if (is_flag(name, "soft-pin", len) && !eq) {
            a->soft_pin = true;
            continue;
        }
        bool needs_value = is_flag(name, "o", len) || is_flag(name, "output", len) || is_flag(name, "timeout", len) ||
                           is_flag(name, "masters", len) || is_flag(name, "cluster", len) ||
                           is_flag(name, "preferred-segment", len);
        if (!needs_value && s[1] != '-') {
            fprintf(stderr, "kvpoolctl %s: unknown flag '%s'\n", a->cmd, s);
            return EXIT_USAGE;
        }
        v = flag_value(argc, argv, &i, eq);
        if (!v) {
            fprintf(stderr, "kvpoolctl %s: %s: unknown flag or missing value\n", a->cmd, s);
            return EXIT_USAGE;
        }
        if (is_flag(name, "o", len) || is_flag(name, "output", len)) {
            a->output = v;
        } else if (is_flag(name, "preferred-segment", len)) {
            a->preferred = v;
        } else if (is_flag(name, "cluster", len)) {
            cluster = v;
        } else if (is_flag(name, "timeout", len)) {
            /* kvpoolctl's global --timeout MS: the call timeout and the master RPC timeout
             * (transfer_timeout's plain number is seconds, Mooncake's unit: say ms) */
            char ms[64];
            snprintf(ms, sizeof ms, "%sms", v);
            rc = strspn(v, "0123456789") == strlen(v) ? kvp_config_set(cfg, "transfer_timeout", ms)
                                                     : kvp_config_set(cfg, "transfer_timeout", v);
            if (rc == KVP_OK)
                rc = kvp_config_set(cfg, "rpc_timeout_ms", v);
            if (rc != KVP_OK) {
                errmsg(a->cmd, NULL, s, rc);
                return EXIT_USAGE;
            }
        } else {
            /* --masters, or any client config key (--replica-num 2, --transfer-timeout=30s) */
            char key[128];
            if (is_flag(name, "masters", len)) {
                snprintf(key, sizeof key, "master_server_address");
                masters_given = true;
            } else {
                snprintf(key, sizeof key, "%.*s", (int)(len < sizeof key ? len : sizeof key - 1), name);
            }
            rc = kvp_config_set(cfg, key, v);
            if (rc != KVP_OK) {
                errmsg(a->cmd, NULL, s, rc);
                return EXIT_USAGE;
            }
        }
    }
    if (cluster && !masters_given) {
        rc = set_cluster(cfg, cluster);
        if (rc != KVP_OK) {
            errmsg(a->cmd, NULL, "--cluster", rc);
            return EXIT_USAGE;
        }
    }
    if (a->help)
        return EXIT_OK;

    bool is_put = strcmp(a->cmd, "put") == 0, is_get = strcmp(a->cmd, "get") == 0;
    if (is_get && npos == 2 && !a->output) {
        a->output = pos[1]; /* get KEY FILE, same as get KEY -o FILE */
        npos = 1;
    }
    int want = is_put ? 2 : 1;
    if (npos != want) {
        fprintf(stderr, "kvpoolctl %s: expected %s\n", a->cmd,
                is_put ? "KEY FILE|-" : is_get ? "KEY [-o FILE]" : "KEY");
        return EXIT_USAGE;
    }
    a->key = pos[0];
    a->file = want == 2 ? pos[1] : NULL;
    if ((a->output && strcmp(a->cmd, "get") != 0) || (a->force && strcmp(a->cmd, "rm") != 0) ||
        ((a->soft_pin || a->preferred) && strcmp(a->cmd, "put") != 0)) {
        fprintf(stderr, "kvpoolctl %s: flag not valid for this command\n", a->cmd);
        return EXIT_USAGE;
    }
    size_t klen = strlen(a->key);
    if (klen == 0 || klen > KVP_MAX_KEY_BYTES) {
        fprintf(stderr, "kvpoolctl %s: KEY must be 1..%d bytes\n", a->cmd, KVP_MAX_KEY_BYTES);
        return EXIT_USAGE;
    }
    const struct kvp_cfg_client *c = &cfg->c;
    if (!c->master_server_address[0] && !c->cluster_file[0]) {
        fprintf(stderr, "kvpoolctl %s: no masters: use --masters host:port,... or --cluster DIR/cluster.json "
                        "(or set KVPOOL_MASTER_SERVER_ADDRESS)\n", a->cmd);
        return EXIT_USAGE;
    }
    return -1; /* go on */
}

/* Read all of fd into a malloc'd buffer. */
static int read_all(int fd, uint8_t **out, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
        cap = (size_t)st.st_size + 1;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return KVP_ERR_NOMEM;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap * 2;
            uint8_t *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                free(buf);
                return KVP_ERR_NOMEM;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r == 0)
            break;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            free(buf);
            return KVP_ERR_IO;
        }
        n += (size_t)r;
    }
    *out = buf;
    *len = n;
    return KVP_OK;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int cmd_put(kvp_client *cl, const struct data_args *a)
{
    int fd = strcmp(a->file, "-") == 0 ? STDIN_FILENO : open(a->file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "kvpoolctl put %s: %s: %s\n", a->key, a->file, strerror(errno));
        return EXIT_FAIL;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = read_all(fd, &buf, &len);
    if (fd != STDIN_FILENO)
        close(fd);
    if (rc != KVP_OK) {
        op_error(a, a->file, rc);
        return EXIT_FAIL;
    }
    if (len == 0) {
        fprintf(stderr, "kvpoolctl put %s: %s is empty (objects are 1 byte or larger)\n", a->key, a->file);
        free(buf);
        return EXIT_FAIL;
    }
    kvp_put_opts opts = {.replica_num = 0, .soft_pin = a->soft_pin, .preferred_segment = a->preferred,
                         .timeout_ms = 0};
    rc = kvp_put(cl, a->key, buf, len, &opts);
    free(buf);
    if (rc != KVP_OK) {
        op_error(a, NULL, rc);
        return EXIT_FAIL;
    }
    if (a->json)
        json_result(a, "bytes", json_integer((json_int_t)len));
    else
        printf("put %s: %zu bytes\n", a->key, len);
    return EXIT_OK;
}

static int cmd_get(kvp_client *cl, const struct data_args *a)
{
    uint8_t *buf = NULL;
    int64_t got = KVP_ERR_BUFFER_TOO_SMALL;
    /* The size can change between the two calls if the key is removed and put again. */
    for (int attempt = 0; attempt < 3 && got == KVP_ERR_BUFFER_TOO_SMALL; attempt++) {
        int64_t size = kvp_get_size(cl, a->key);
        if (size < 0) {
            op_error(a, NULL, (int)size);
            return EXIT_FAIL;
        }
        free(buf);
        buf = malloc(size > 0 ? (size_t)size : 1);
        if (!buf) {
            errmsg("get", a->key, NULL, KVP_ERR_NOMEM);
            return EXIT_FAIL;
        }
        got = kvp_get(cl, a->key, buf, (size_t)size, 0);
    }
    if (got < 0) {
        free(buf);
        op_error(a, NULL, (int)got);
        return EXIT_FAIL;
    }
    int status = EXIT_OK;
    if (!a->output || strcmp(a->output, "-") == 0) {
        if (write_all(STDOUT_FILENO, buf, (size_t)got) != 0) {
            fprintf(stderr, "kvpoolctl get %s: stdout: %s\n", a->key, strerror(errno));
            status = EXIT_FAIL;
        }
    } else {
        /* write FILE.tmp.PID whole, then rename: never a partial FILE */
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", a->output, (long)getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || write_all(fd, buf, (size_t)got) != 0 || fsync(fd) != 0 || close(fd) != 0 ||
            rename(tmp, a->output) != 0) {
            fprintf(stderr, "kvpoolctl get %s: %s: %s\n", a->key, a->output, strerror(errno));
            if (fd >= 0)
                unlink(tmp);
            status = EXIT_FAIL;
        } else {
            if (a->json)
                json_result(a, "bytes", json_integer((json_int_t)got));
            else
                fprintf(stderr, "get %s: %lld bytes -> %s\n", a->key, (long long)got, a->output);
        }
    }
    free(buf);
    return status;
}

int kvpctl_data_main(int argc, char **argv)
{
    if (argc < 1 || !argv || !argv[0]) {
        kvpctl_data_usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[0];
    if (strcmp(cmd, "put") != 0 && strcmp(cmd, "get") != 0 && strcmp(cmd, "exists") != 0 &&
        strcmp(cmd, "rm") != 0 && strcmp(cmd, "size") != 0) {
        fprintf(stderr, "kvpoolctl: unknown data command '%s'\n", cmd);
        kvpctl_data_usage(stderr);
        return EXIT_USAGE;
    }
    kvp_config *cfg = NULL;
    int rc = kvp_config_new(&cfg);
    if (rc != KVP_OK) {
        errmsg(cmd, NULL, "config", rc);
        return EXIT_USAGE;
    }
    struct data_args a;
    memset(&a, 0, sizeof a);
    int status = parse(argc, argv, cfg, &a);
    if (status >= 0) {
        if (a.help && status == EXIT_OK)
            kvpctl_data_usage(stdout);
        kvp_config_destroy(&cfg);
        return status;
    }

    kvp_client *cl = NULL;
    rc = kvp_client_open(cfg, &cl);
    if (rc != KVP_OK) {
        /* An operation that could not run: exit 1 (docs/operations.md), but `exists` keeps 1
         * for "no such key" and says 2 for every error. */
        op_error(&a, "cannot open the client (masters unreachable?)", rc);
        kvp_config_destroy(&cfg);
        return strcmp(cmd, "exists") == 0 ? EXIT_USAGE : EXIT_FAIL;
    }
    if (strcmp(cmd, "put") == 0) {
        status = cmd_put(cl, &a); /* replica_num, timeout: config defaults */
    } else if (strcmp(cmd, "get") == 0) {
        status = cmd_get(cl, &a);
    } else if (strcmp(cmd, "exists") == 0) {
        int r = kvp_exists(cl, a.key);
        if (r < 0) {
            op_error(&a, NULL, r);
            status = EXIT_USAGE;
        } else {
            if (a.json)
                json_result(&a, "exists", json_boolean(r == 1));
            else
                printf("%s: %s\n", a.key, r ? "exists" : "not found");
            status = r ? EXIT_OK : EXIT_FAIL;
        }
    } else if (strcmp(cmd, "rm") == 0) {
        rc = kvp_remove(cl, a.key, a.force);
        if (rc != KVP_OK) {
            op_error(&a, rc == KVP_ERR_LEASED ? "under a read lease, retry or use --force" : NULL, rc);
            status = EXIT_FAIL;
        } else {
            if (a.json)
                json_result(&a, "removed", json_true());
            else
                printf("rm %s: removed\n", a.key);
            status = EXIT_OK;
        }
    } else { /* size */
        int64_t sz = kvp_get_size(cl, a.key);
        if (sz < 0) {
            op_error(&a, NULL, (int)sz);
            status = EXIT_FAIL;
        } else {
            if (a.json)
                json_result(&a, "size", json_integer((json_int_t)sz));
            else
                printf("%lld\n", (long long)sz);
            status = EXIT_OK;
        }
    }
    fflush(stdout);
    kvp_client_close(&cl);
    kvp_config_destroy(&cfg);
    return status;
}
