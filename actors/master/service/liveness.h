/*
 * liveness.h — the leader's decision "this segment is lost" (DESIGN.md "Core flows: Segments",
 * "Known failures we must never have" 3; docs/operations.md "How a segment is declared lost").
 *
 * Pure logic: no I/O, no clock reads, no logging. The master service (service_soft.c) feeds it
 * the times it observed (heartbeats, clients' reports, probe results, its own ticks, confirmed
 * quorum contact, leadership changes) and asks it, once per liveness tick, which segments are
 * lost. Every decision comes with its evidence as a sentence the caller logs.
 *
 * The rule, in full:
 *  1. Blind periods do not count. A gap between two ticks longer than tick_gap_ms (the leader's
 *     own loop did not run: a pause, a VM freeze, a stall), a leadership change, and the end of
 *     a period without confirmed quorum contact (longer than quorum_stale_ms), and the end of a
 *     withheld episode (rule 4: the master suspected itself, so the silence in it says nothing;
 *     segments heard again one by one after a heal must not get the later ones dropped) each
 *     start a fresh grace: every segment's silence is measured from that moment at the earliest.
 *     While an episode lasts, a candidate whose evidence holds is kept SUSPECT, not LOST.
 *  2. While quorum contact is stale, no decision is made at all (withheld).
 *  3. A segment is a candidate when (a) silent for more than client_ttl_ms, or (b) reported
 *     unreachable by a client within client_ttl_ms, a probe from this master failed after its
 *     last heartbeat, and it is silent for more than max(min(ttl, 1 s), 1.5 × its period), or
 *     (c) reported and silent for more than max(min(ttl, 3 s), 1.5 × its period).
 *  4. Evidence that the master can hear: H = segments heard within max(ttl / 2, 2 × their
 *     period) (capped at ttl). Candidates by silence alone (a) are declared lost only when
 *     H >= 1 and H >= the number of candidates; candidates witnessed by a client report (b, c)
 *     only when H >= 1. Both kinds also need some other segment heard after the candidate fell
 *     silent (a heartbeat more than 1.25 periods after its last one): with 1 s heartbeats and a
 *     2 s ttl, segments cut off together still count as heard and must not vouch. Otherwise the
 *     master suspects itself: the decision is withheld (one episode, reported once) and nothing
 *     is dropped. And the vouching heartbeat must have arrived after the candidate's silence
 *     passed what made it a candidate (ttl for (a), 3(b)/(c)'s silence for the others): a
 *     partition that lands host by host (rule sets applied one after another, 1.4 s apart
 *     under load) cuts the first segment off a moment before the last, and the last one,
 *     silent itself by then, must not vouch for the first. Until such a heartbeat arrives the
 *     candidate is SUSPECT (no episode: a dead segment's live neighbours vouch within a period).
 *  5. Data-plane witnesses: a candidate that a client wrote to or read from after its last
 *     heartbeat (PutEnd written_segments, GetReplicaList read_segments), or whose data plane
 *     answered the leader's probe (sent once a segment is silent for ttl / 2), within the last
 *     ttl / 2, is not lost (the master cannot hear it, clients can reach it): it stays
 *     SUSPECT while clients keep succeeding, and is decided by 3 and 4 once they stop.
 *  6. A successor: a candidate whose name a new process on its host asked to mount after its
 *     last heartbeat, within ttl, is lost without rule 4's evidence: that mount reached this
 *     master from the segment's host, so the master hears that host while the old process is
 *     silent (a supervisor restarted it on a new port; with every segment restarted at once,
 *     nothing else would ever be heard).
 *
 * Thread: one owner (the service thread); not thread-safe.
 */
#ifndef KVP_MASTER_LIVENESS_H
#define KVP_MASTER_LIVENESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** What the caller knows of one segment (times monotonic ms; 0 = never / none). */
struct kvp_liveness_seg {
    uint32_t id;
    uint64_t last_hb_ms;        /* last heartbeat or mount heard by this leader */
    uint64_t hb_gap_ms;         /* its heartbeat period as seen here (last two), 0 = unknown */
    uint64_t reported_ms;       /* last client ReportUnreachable */
    uint64_t probe_failed_ms;   /* last failed data-plane probe from this master */
    uint64_t client_wrote_ms;   /* last data-plane witness: a put wrote to it (PutEnd written_segments),
                                 * a get read from it (GetReplicaList read_segments), or the leader's
                                 * probe of a silent segment was answered */
    uint64_t successor_ms;      /* last mount under its name from its host, refused (rule 6) */
};

enum kvp_liveness_state {
    KVP_LIVENESS_LIVE = 0,      /* heard recently enough */
    KVP_LIVENESS_SUSPECT,       /* silent for a while or reported, not (yet) a candidate */
    KVP_LIVENESS_LOST,          /* declare it lost now (evidence says why) */
    KVP_LIVENESS_WITHHELD,      /* would be a candidate, but the master suspects itself */
};

/** The verdict on one segment of a check. */
struct kvp_liveness_verdict {
    uint32_t id;
    enum kvp_liveness_state state;
    uint64_t silent_ms;         /* silence counted (blind periods excluded) */
    uint8_t candidate;          /* internal to the check: 0 none, 1 by silence, 2 witnessed by a report */
    uint64_t candidate_after_ms; /* internal to the check: the silence that made it a candidate */
    char why[224];              /* evidence (LOST), reason (WITHHELD, SUSPECT), "" when LIVE */
};

/** Events of one check, for the caller's log lines (one each). */
struct kvp_liveness_events {
    unsigned n_lost;
    unsigned n_withheld;
    bool blind_detected;        /* this check found a tick gap: fresh grace given */
    bool withhold_began;        /* first check of a withheld episode: WARN once */
    bool withhold_ended;        /* the episode is over (INFO) */
};

struct kvp_liveness {
    uint64_t ttl_ms;            /* client_ttl */
    uint64_t tick_gap_ms;       /* a longer gap between ticks is a blind period */
    uint64_t quorum_stale_ms;   /* no confirmed quorum contact for longer: blind */
    uint64_t grace_from_ms;     /* silence is counted from here at the earliest */
    uint64_t last_tick_ms;      /* previous check; 0 = none yet */
    uint64_t quorum_ok_ms;      /* last confirmed quorum contact */
    /* The last blind period, for status. */
    uint64_t blind_periods;
    uint64_t blind_at_ms;
    uint64_t blind_len_ms;
    char blind_why[128];
    /* The withheld episode. */
    bool withholding;
    uint64_t withheld_since_ms;
    uint64_t withheld_episodes;
    char withheld_why[224];
    /* Last check's counts, for status. */
    unsigned heard, total, candidates;
};

/** Initialise at `now_ms` (counts as a fresh grace). tick_gap_ms / quorum_stale_ms 0 = derived
 * defaults: min(1500, ttl / 2) and max(3000, ttl / 2). */
void kvp_liveness_init(struct kvp_liveness *lv, uint64_t ttl_ms, uint64_t tick_gap_ms, uint64_t quorum_stale_ms,
                       uint64_t now_ms);

/** A blind period the caller knows of ended at now_ms (leadership change: "became leader"):
 * fresh grace, quorum contact counted as confirmed, any withheld episode closed silently. */
void kvp_liveness_restart(struct kvp_liveness *lv, uint64_t now_ms, const char *why);

/** Quorum contact confirmed at now_ms (a query answered as leader). Ending a stale period
 * starts a fresh grace. Returns true when it ended one not already counted (by a tick gap). */
bool kvp_liveness_quorum_ok(struct kvp_liveness *lv, uint64_t now_ms);

/** One liveness tick at now_ms over the n segments the FSM holds as active or draining (not lost,
 * not already being declared lost). Fills out[0..n) (same order) and *ev. Returns the number of
 * LOST verdicts. */
unsigned kvp_liveness_check(struct kvp_liveness *lv, uint64_t now_ms, const struct kvp_liveness_seg *segs,
                            size_t n, struct kvp_liveness_verdict *out, struct kvp_liveness_events *ev);

const char *kvp_liveness_state_name(enum kvp_liveness_state st);

#endif
