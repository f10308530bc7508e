/*
 * liveness.c — the leader's "segment lost" decision (liveness.h has the rule in full).
 */
#include <stdio.h>
#include <string.h>

#include "actors/master/service/liveness.h"

const char *kvp_liveness_state_name(enum kvp_liveness_state st)
{
    switch (st) {
    case KVP_LIVENESS_LIVE: return "live";
    case KVP_LIVENESS_SUSPECT: return "suspect";
    case KVP_LIVENESS_LOST: return "lost";
    case KVP_LIVENESS_WITHHELD: return "withheld";
    }
    return "?";
}

void kvp_liveness_init(struct kvp_liveness *lv, uint64_t ttl_ms, uint64_t tick_gap_ms, uint64_t quorum_stale_ms,
                       uint64_t now_ms)
{
    memset(lv, 0, sizeof *lv);
    lv->ttl_ms = ttl_ms ? ttl_ms : 1;
    lv->tick_gap_ms = tick_gap_ms ? tick_gap_ms : (lv->ttl_ms / 2 < 1500 ? lv->ttl_ms / 2 : 1500);
    lv->quorum_stale_ms = quorum_stale_ms ? quorum_stale_ms : (lv->ttl_ms / 2 > 3000 ? lv->ttl_ms / 2 : 3000);
    lv->grace_from_ms = now_ms;
    lv->quorum_ok_ms = now_ms;
}

void kvp_liveness_restart(struct kvp_liveness *lv, uint64_t now_ms, const char *why)
{
    lv->grace_from_ms = now_ms;
    lv->last_tick_ms = now_ms;
    lv->quorum_ok_ms = now_ms;
    lv->withholding = false;
    lv->withheld_why[0] = '\0';
    snprintf(lv->blind_why, sizeof lv->blind_why, "%s", why ? why : "restart");
}

bool kvp_liveness_quorum_ok(struct kvp_liveness *lv, uint64_t now_ms)
{
    bool ended = now_ms > lv->quorum_ok_ms && now_ms - lv->quorum_ok_ms > lv->quorum_stale_ms;
    if (ended && lv->grace_from_ms > lv->quorum_ok_ms) {
        /* A tick gap inside the stale period already started a grace: the same blind period. */
        lv->grace_from_ms = now_ms;
        ended = false;
    } else if (ended) {
        lv->blind_periods++;
        lv->blind_at_ms = lv->quorum_ok_ms;
        lv->blind_len_ms = now_ms - lv->quorum_ok_ms;
        snprintf(lv->blind_why, sizeof lv->blind_why, "no confirmed quorum contact for %llu ms",
                 (unsigned long long)lv->blind_len_ms);
        lv->grace_from_ms = now_ms;
    }
    lv->quorum_ok_ms = now_ms;
    return ended;
}

/* The silences of rule 3 for one segment. */
static uint64_t with_period(uint64_t base, uint64_t gap)
{
    return gap + gap / 2 > base ? gap + gap / 2 : base;
}

/* Rule 4's window: a segment heard within it proves the master can hear. */
static uint64_t heard_window(uint64_t ttl, uint64_t gap)
{
    uint64_t w = ttl / 2;
    if (2 * gap > w)
        w = 2 * gap;
    return w < ttl ? w : ttl;
}

enum cand_kind { CAND_NONE = 0, CAND_SILENCE, CAND_WITNESSED };

/* Segments heard well after segment c fell silent: a heartbeat later than c's last one (or the
 * grace start) by more than 1.25 periods and by more than `after_ms`. Segments cut off at the
 * same moment as c are not: their last heartbeats lie within one period of c's. With after_ms
 * the silence that made c a candidate, neither are segments cut off a moment later (a partition
 * that lands host by host): a heartbeat counts only when it arrived after c had become one. */
static unsigned heard_after(const struct kvp_liveness *lv, const struct kvp_liveness_seg *segs, size_t n, size_t c,
                            uint64_t after_ms)
{
    uint64_t since_c = segs[c].last_hb_ms > lv->grace_from_ms ? segs[c].last_hb_ms : lv->grace_from_ms;
    unsigned k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == c)
            continue;
        uint64_t p = segs[i].hb_gap_ms > segs[c].hb_gap_ms ? segs[i].hb_gap_ms : segs[c].hb_gap_ms;
        if (p == 0)
            p = lv->ttl_ms / 4;
        uint64_t after = p + p / 4 > after_ms ? p + p / 4 : after_ms;
        if (segs[i].last_hb_ms > since_c + after)
            k++;
    }
    return k;
}

unsigned kvp_liveness_check(struct kvp_liveness *lv, uint64_t now_ms, const struct kvp_liveness_seg *segs,
                            size_t n, struct kvp_liveness_verdict *out, struct kvp_liveness_events *ev)
{
    memset(ev, 0, sizeof *ev);
    uint64_t ttl = lv->ttl_ms;
    /* Rule 1: a gap in our own ticks is a blind period. */
    if (lv->last_tick_ms && now_ms > lv->last_tick_ms && now_ms - lv->last_tick_ms > lv->tick_gap_ms &&
        lv->blind_periods && lv->blind_at_ms + lv->blind_len_ms > lv->last_tick_ms) {
        /* A quorum blind period that ended after our last tick was counted already: the same one. */
        lv->grace_from_ms = now_ms;
    } else if (lv->last_tick_ms && now_ms > lv->last_tick_ms && now_ms - lv->last_tick_ms > lv->tick_gap_ms) {
        lv->blind_periods++;
        lv->blind_at_ms = lv->last_tick_ms;
        lv->blind_len_ms = now_ms - lv->last_tick_ms;
        snprintf(lv->blind_why, sizeof lv->blind_why, "the leader's loop did not run for %llu ms",
                 (unsigned long long)lv->blind_len_ms);
        lv->grace_from_ms = now_ms;
        ev->blind_detected = true;
    }
    lv->last_tick_ms = now_ms;
    bool quorum_stale = now_ms > lv->quorum_ok_ms && now_ms - lv->quorum_ok_ms > lv->quorum_stale_ms;

    unsigned heard = 0, n_silence = 0, n_witnessed = 0;
    for (size_t i = 0; i < n; i++) {
        const struct kvp_liveness_seg *g = &segs[i];
        struct kvp_liveness_verdict *v = &out[i];
        memset(v, 0, sizeof *v);
        v->id = g->id;
        uint64_t since = g->last_hb_ms > lv->grace_from_ms ? g->last_hb_ms : lv->grace_from_ms;
        uint64_t silent = now_ms > since ? now_ms - since : 0;
        v->silent_ms = silent;
        bool reported = g->reported_ms && now_ms - g->reported_ms < ttl;
        bool probe_failed = g->probe_failed_ms > since && now_ms - g->probe_failed_ms < ttl;
        uint64_t probe_silence = with_period(ttl < 1000 ? ttl : 1000, g->hb_gap_ms);
        uint64_t report_silence = with_period(ttl < 3000 ? ttl : 3000, g->hb_gap_ms);
        bool clients_write = g->client_wrote_ms > since && now_ms - g->client_wrote_ms <= ttl / 2;
        if (clients_write && (silent > ttl || (reported && silent > probe_silence))) {
            v->state = KVP_LIVENESS_SUSPECT; /* rule 5 */
            snprintf(v->why, sizeof v->why, "no heartbeat for %llu ms, but a client wrote to it %llu ms ago: kept",
                     (unsigned long long)silent, (unsigned long long)(now_ms - g->client_wrote_ms));
        } else if (silent > ttl) {
            out[i].candidate = CAND_SILENCE;
            v->candidate_after_ms = ttl;
            snprintf(v->why, sizeof v->why, "no heartbeat for %llu ms (client_ttl %llu ms)",
                     (unsigned long long)silent, (unsigned long long)ttl);
        } else if (reported && probe_failed && silent > probe_silence) {
            out[i].candidate = CAND_WITNESSED;
            v->candidate_after_ms = probe_silence;
            snprintf(v->why, sizeof v->why, "reported unreachable by a client, probe failed, no heartbeat for %llu ms",
                     (unsigned long long)silent);
        } else if (reported && silent > report_silence) {
            out[i].candidate = CAND_WITNESSED;
            v->candidate_after_ms = report_silence;
            snprintf(v->why, sizeof v->why, "reported unreachable by a client, no heartbeat for %llu ms",
                     (unsigned long long)silent);
        } else if (silent <= heard_window(ttl, g->hb_gap_ms)) {
            heard++;
            if (reported) {
                v->state = KVP_LIVENESS_SUSPECT;
                snprintf(v->why, sizeof v->why, "reported unreachable by a client%s; heard %llu ms ago",
                         probe_failed ? ", probe failed" : "", (unsigned long long)silent);
            }
        } else {
            v->state = KVP_LIVENESS_SUSPECT;
            snprintf(v->why, sizeof v->why, "no heartbeat for %llu ms%s", (unsigned long long)silent,
                     reported ? ", reported unreachable by a client" : "");
        }
        if (out[i].candidate == CAND_SILENCE)
            n_silence++;
        else if (out[i].candidate == CAND_WITNESSED)
            n_witnessed++;
    }
    lv->heard = heard;
    lv->total = (unsigned)n;
    lv->candidates = n_silence + n_witnessed;

    /* Rule 2 and 4: decide, or suspect ourselves. */
    char why[160] = "";
    bool allow_silence = false, allow_witnessed = false;
    if (quorum_stale) {
        snprintf(why, sizeof why, "no confirmed quorum contact for %llu ms",
                 (unsigned long long)(now_ms - lv->quorum_ok_ms));
    } else {
        allow_witnessed = heard >= 1; /* and, per segment, someone heard after it fell silent */
        allow_silence = heard >= 1 && heard >= n_silence + n_witnessed;
        if (!allow_silence)
            snprintf(why, sizeof why, "the master hears only %u of %u segments (%u silent): it suspects itself",
                     heard, (unsigned)n, n_silence + n_witnessed);
    }
    /* An episode in progress when this check began: its end is decided below. */
    bool episode = lv->withholding;
    for (size_t i = 0; i < n; i++) {
        struct kvp_liveness_verdict *v = &out[i];
        if (out[i].candidate == CAND_NONE)
            continue;
        bool count_ok = out[i].candidate == CAND_SILENCE ? allow_silence : allow_witnessed;
        /* Both kinds need a segment heard well after this one fell silent: one cut off at the same
         * moment (a partition of the master from every segment) may still count as "heard" when
         * its period is long against client_ttl (1 s heartbeats, client_ttl 2 s), and must not
         * vouch for the master's hearing. Nor may one cut off a moment later (a partition that
         * lands host by host): only a segment heard after this one had become a candidate
         * vouches; until one is, it stays SUSPECT (no episode: a dead segment's neighbours
         * vouch within a period). */
        bool vouched_loose = heard_after(lv, segs, n, i, 0) >= 1;
        bool vouched = vouched_loose && heard_after(lv, segs, n, i, v->candidate_after_ms) >= 1;
        bool allow = count_ok && vouched && !episode;
        uint64_t since = segs[i].last_hb_ms > lv->grace_from_ms ? segs[i].last_hb_ms : lv->grace_from_ms;
        bool successor = !quorum_stale && segs[i].successor_ms > since && now_ms - segs[i].successor_ms < ttl;
        if (!allow && successor) { /* rule 6 */
            allow = true;
            size_t len = strlen(v->why);
            snprintf(v->why + len, sizeof v->why - len, "; a new process under its name on its host asked to mount "
                     "%llu ms ago", (unsigned long long)(now_ms - segs[i].successor_ms));
        }
        size_t len = strlen(v->why);
        if (allow) {
            v->state = KVP_LIVENESS_LOST;
            snprintf(v->why + len, sizeof v->why - len, "; heard %u of %u segments", heard, (unsigned)n);
            ev->n_lost++;
        } else if (!count_ok || !vouched_loose) {
            v->state = KVP_LIVENESS_WITHHELD;
            snprintf(v->why + len, sizeof v->why - len, "; withheld: %s",
                     why[0] && !count_ok ? why : "no segment heard since it fell silent: the master suspects itself");
            ev->n_withheld++;
        } else if (!vouched) {
            v->state = KVP_LIVENESS_SUSPECT;
            snprintf(v->why + len, sizeof v->why - len, "; no other segment heard since it became a candidate");
        } else {
            /* Rule 1: the silence ran through an episode in which the master suspected itself. */
            v->state = KVP_LIVENESS_SUSPECT;
            snprintf(v->why + len, sizeof v->why - len, "; the master suspected itself until now: its silence is "
                     "counted from the end of that episode");
        }
    }
    if (ev->n_withheld > 0 && !lv->withholding) {
        lv->withholding = true;
        lv->withheld_since_ms = now_ms;
        lv->withheld_episodes++;
        snprintf(lv->withheld_why, sizeof lv->withheld_why, "%s",
                 why[0] ? why : "no segment heard since the silent ones fell silent: the master suspects itself");
        ev->withhold_began = true;
    } else if (ev->n_withheld > 0) {
        if (why[0])
            snprintf(lv->withheld_why, sizeof lv->withheld_why, "%s", why);
    } else if (lv->withholding) {
        /* Rule 1: the end of a withheld episode is the end of a blind period (the master could not
         * hear, so the silence in it says nothing): every segment gets a fresh grace. Segments
         * heard again one by one after a heal must not see the later ones dropped. */
        lv->withholding = false;
        lv->grace_from_ms = now_ms;
        ev->withhold_ended = true;
    }
    return ev->n_lost;
}
