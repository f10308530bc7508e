/*
 * memcg.c — the memory cgroup limits of this process, for segment_prefault's guard and the
 * start-up check of global_segment_size (segment_internal.h).
 *
 * An inference server usually runs in a container whose memory cgroup has a limit far below the
 * host's memory. Populating a region past that limit does not fail: the cgroup's OOM killer
 * kills a process of the container (the segment, or the inference server embedding it). The
 * host-wide guard (/proc/meminfo) does not see the limit, so the prefault also stops before the
 * tightest cgroup limit of the process.
 *
 * Sources: /proc/self/cgroup (man 7 cgroups: "hierarchy-ID:controller-list:cgroup-path"; the
 * cgroup v2 line is "0::path"), then for the process's cgroup and each ancestor:
 *  - v2: <root><path>/memory.max ("max" = none) and memory.current, also under <root>/unified
 *    (the hybrid layout, where the v2 hierarchy is mounted there);
 *  - v1: the line whose controller list has "memory": <root>/memory<path>/memory.limit_in_bytes
 *    (a value >= 2^62 means none: the kernel prints PAGE_COUNTER_MAX pages) and
 *    memory.usage_in_bytes.
 * Usage includes the cgroup's page cache, which the kernel can reclaim; so the guard errs on the
 * side of stopping early (the rest of the region then faults on first write, as without a
 * prefault), never of running into the limit.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/segment/segment_internal.h"

#define MEMCG_FLOOR_MIN (512ull << 20)
#define MEMCG_UNLIMITED (1ull << 62)

/* The first line of a file as an unsigned number. 1: a number (*v); 0: "max" (no limit);
 * -1: missing or not a number. */
static int read_u64(const char *path, uint64_t *v)
{
    FILE *fp = fopen(path, "re");
    if (!fp)
        return -1;
    char buf[64];
    int rc = -1;
    if (fgets(buf, sizeof buf, fp)) {
        buf[strcspn(buf, "\n")] = 0;
        char *end;
        if (!strcmp(buf, "max")) {
            rc = 0;
        } else if (buf[0] >= '0' && buf[0] <= '9') {
            unsigned long long x = strtoull(buf, &end, 10);
            if (!*end) {
                *v = x;
                rc = 1;
            }
        }
    }
    fclose(fp);
    return rc;
}

/* Visit dir and its ancestors down to (and including) `top`, keeping the tightest limit. */
static void walk(const char *top, const char *cgpath, const char *limit_file, const char *usage_file,
                 struct kvp_seg_memcg *out)
{
    char dir[1024];
    if (snprintf(dir, sizeof dir, "%s%s", top, cgpath) >= (int)sizeof dir)
        return;
    size_t toplen = strlen(top);
    for (;;) {
        size_t len = strlen(dir);
        while (len > toplen && dir[len - 1] == '/') /* "a/b/" → "a/b" */
            dir[--len] = 0;
        char lp[1100], up[1100];
        uint64_t limit = 0, usage = 0;
        snprintf(lp, sizeof lp, "%s/%s", dir, limit_file);
        snprintf(up, sizeof up, "%s/%s", dir, usage_file);
        if (read_u64(lp, &limit) == 1 && limit < MEMCG_UNLIMITED && read_u64(up, &usage) == 1) {
            uint64_t room = usage < limit ? limit - usage : 0;
            if (!out->found || room < (out->usage < out->limit ? out->limit - out->usage : 0)) {
                out->found = true;
                out->limit = limit;
                out->usage = usage;
                snprintf(out->path, sizeof out->path, "%s", dir);
            }
        }
        if (len <= toplen)
            break;
        char *slash = strrchr(dir + toplen, '/');
        if (!slash)
            break;
        *slash = 0; /* parent; "top" itself when the slash was the first one */
    }
}

bool kvp_seg_memcg_read(const char *proc_cgroup, const char *root, struct kvp_seg_memcg *out)
{
    memset(out, 0, sizeof *out);
    if (!proc_cgroup || !root)
        return false;
    char top[512];
    for (const char *line = proc_cgroup; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        char buf[1024];
        if (n < sizeof buf) {
            memcpy(buf, line, n);
            buf[n] = 0;
            char *c1 = strchr(buf, ':');
            char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2 && c2[1] == '/') {
                *c1 = *c2 = 0;
                const char *ctrl = c1 + 1, *path = c2 + 1;
                if (!strcmp(buf, "0") && !*ctrl) { /* cgroup v2 */
                    walk(root, path, "memory.max", "memory.current", out);
                    if (snprintf(top, sizeof top, "%s/unified", root) < (int)sizeof top)
                        walk(top, path, "memory.max", "memory.current", out);
                } else {
                    bool memory = false; /* v1: is "memory" in the comma-separated list? */
                    char *save = NULL;
                    for (char *tok = strtok_r(c1 + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                        memory |= !strcmp(tok, "memory");
                    if (memory && snprintf(top, sizeof top, "%s/memory", root) < (int)sizeof top)
                        walk(top, path, "memory.limit_in_bytes", "memory.usage_in_bytes", out);
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return out->found;
}

uint64_t kvp_seg_memcg_allow(const struct kvp_seg_memcg *m, uint64_t want)
{
    if (!m || !m->found)
        return want;
    uint64_t floor = m->limit / 10 > MEMCG_FLOOR_MIN ? m->limit / 10 : MEMCG_FLOOR_MIN;
    if (m->usage >= m->limit || m->limit - m->usage <= floor)
        return 0;
    uint64_t room = m->limit - m->usage - floor;
    return room < want ? room : want;
}
