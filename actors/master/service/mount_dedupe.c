/*
 * mount_dedupe.c — repeats of one MountSegment call (mount_dedupe.h).
 */
#include "actors/master/service/mount_dedupe.h"

#include <string.h>

#include <xxhash.h>

bool kvp_mount_recent_repeat(struct kvp_mount_recent *r, const void *identity, size_t id_len, uint64_t req_id,
                             uint64_t now_ms)
{
    if (!r || !identity || id_len == 0)
        return false;
    uint64_t h = XXH3_64bits(identity, id_len);
    if (h == 0)
        h = 1; /* 0 marks an empty slot */
    uint64_t seq = req_id >> 8; /* the low byte is the attempt (msession.c) */
    for (unsigned i = 0; i < KVP_MOUNT_RECENT; i++)
        if (r->e[i].id_hash == h && r->e[i].seq == seq && now_ms - r->e[i].at_ms < KVP_MOUNT_RECENT_MS &&
            now_ms >= r->e[i].at_ms)
            return true;
    r->e[r->next].id_hash = h;
    r->e[r->next].seq = seq;
    r->e[r->next].at_ms = now_ms;
    r->next = (r->next + 1) % KVP_MOUNT_RECENT;
    return false;
}

void kvp_mount_recent_clear(struct kvp_mount_recent *r)
{
    if (r)
        memset(r, 0, sizeof *r);
}
