/*
 * mount_dedupe.h — the leader answers one MountSegment call once, however many times the
 * caller's session sends it.
 *
 * Why: a master session moves a call to the next master when an attempt is not answered within
 * its per-attempt timeout (300 ms, doubling; actors/session/msession.c). A loaded leader that
 * is still committing the first attempt's MountSegment gets the same call again once the
 * follower's "not leader" sends it back. Committed twice, the second mount of the same name,
 * endpoint and host reads to the state machine as a restart: the segment the first one created
 * is declared lost and the process, holding the first id, is told NOT_FOUND and remounts (seen
 * in the nemesis suite under load: healthy segments counted lost right after start-up).
 *
 * The record: the last KVP_MOUNT_RECENT calls this leader proposed, as (hash of the caller's
 * ZeroMQ identity, call sequence = req_id >> 8, the time). An attempt whose identity and sequence
 * match a record younger than KVP_MOUNT_RECENT_MS is a repeat: the leader drops it, and the
 * session takes the first attempt's answer (it accepts any attempt's reply). Leader-only soft
 * state, cleared on every leadership change: a call first proposed under another leader is
 * proposed again, as before. Pure logic, no I/O.
 */
#ifndef KVP_MASTER_MOUNT_DEDUPE_H
#define KVP_MASTER_MOUNT_DEDUPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_MOUNT_RECENT 32
#define KVP_MOUNT_RECENT_MS 30000u /* longer than any mount call's deadline */

struct kvp_mount_recent {
    struct {
        uint64_t id_hash; /* XXH3 of the identity bytes; 0 = empty slot */
        uint64_t seq;
        uint64_t at_ms;   /* monotonic ms when proposed */
    } e[KVP_MOUNT_RECENT];
    unsigned next; /* slot the next record overwrites (oldest first) */
};

/* Is (identity, req_id) a repeat of a call proposed within KVP_MOUNT_RECENT_MS before now_ms?
 * If not, it is recorded (the oldest record makes room) and false is returned. identity may be
 * NULL or empty: such calls are never called repeats and not recorded. */
bool kvp_mount_recent_repeat(struct kvp_mount_recent *r, const void *identity, size_t id_len, uint64_t req_id,
                             uint64_t now_ms);

/* Forget every record (a leadership change). */
void kvp_mount_recent_clear(struct kvp_mount_recent *r);

#endif
