/*
 * repair_pass.h — the repair driver's pass over the object table in slices (service_repair.c):
 * how one RepairScan slice's answer joins the pass in progress. Pure (no service state), so the
 * rules are unit-tested (tests/unit/test_repair_pass.c). Service thread only, like its caller.
 *
 * A pass is the slices from slot 0 until an answer's next_cursor is 0. Its sums are only a whole
 * table's when the table kept its layout across the slices:
 *  - its size changed (a growth swapped tables, a restore): the slots walked so far name other
 *    objects now, so the pass starts over at slot 0, and the answer that saw the change is not
 *    counted (it covered a slice of the new table from the old cursor);
 *  - objects moved between slots (a removal's backward shift, FSM table_moves): one may have
 *    moved from ahead of the cursor to behind it and been missed, so the pass is marked `moved`
 *    and its "no work" verdict must not be trusted for long (service_repair.c bounds it).
 *
 * Each slice query is sent with a ticket (struct repair_scan_ticket) and only the answer that
 * carries the awaited ticket may join the pass: one from before a reset (the node lost
 * leadership and won it again) was asked from the old pass's cursor and is dropped.
 */
#ifndef KVP_MASTER_SERVICE_REPAIR_PASS_H
#define KVP_MASTER_SERVICE_REPAIR_PASS_H

#include <stdbool.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

struct repair_pass {
    bool in_pass;
    bool full;            /* a slice's needs list reached the query's max */
    bool moved;           /* objects moved between slots within the pass (see above) */
    uint64_t cursor;      /* where the next slice starts */
    uint64_t slots;       /* the table's size the pass walks; 0 before its first answer */
    uint64_t moves;       /* the FSM's table_moves at the pass's first answer */
    Kvp__RepairScanResp sum; /* the counters summed over the pass's slices (needs not kept) */
};

enum repair_pass_step {
    REPAIR_PASS_MORE = 0,      /* counted; the pass goes on at p->cursor */
    REPAIR_PASS_DONE = 1,      /* counted; it was the pass's last slice (p->sum is the pass) */
    REPAIR_PASS_RESTARTED = 2, /* the table's size changed: not counted, the pass restarts at 0 */
};

/* Forget the pass: the next slice starts one at slot 0. */
static inline void repair_pass_reset(struct repair_pass *p)
{
    p->in_pass = p->full = p->moved = false;
    p->cursor = p->slots = p->moves = 0;
    kvp__repair_scan_resp__init(&p->sum);
}

/* Join slice answer b (asked with needs list bounded by max) to the pass. */
static inline enum repair_pass_step repair_pass_add(struct repair_pass *p, const Kvp__RepairScanResp *b,
                                                    uint32_t max)
{
    if (p->slots && b->table_slots != p->slots) {
        repair_pass_reset(p);
        p->in_pass = true;
        p->slots = b->table_slots;
        p->moves = b->table_moves;
        return REPAIR_PASS_RESTARTED;
    }
    if (!p->slots) {
        p->slots = b->table_slots;
        p->moves = b->table_moves;
    }
    p->moved |= b->table_moves != p->moves;
    p->sum.draining_objects += b->draining_objects;
    p->sum.draining_bytes += b->draining_bytes;
    p->sum.under_replicated += b->under_replicated;
    p->sum.in_flight += b->in_flight;
    p->sum.no_space += b->no_space;
    p->sum.lost_if_drained += b->lost_if_drained;
    p->sum.n_needs += b->n_needs;
    p->full |= b->n_needs >= max;
    p->cursor = b->next_cursor;
    if (b->next_cursor != 0)
        return REPAIR_PASS_MORE;
    p->in_pass = false;
    return REPAIR_PASS_DONE;
}

/* The RepairScan query awaited. Tickets are sequence numbers from 1 (0: none awaited). A reset
 * (svc_repair_reset, on leadership loss) forgets the awaited one but keeps counting, so the
 * answer to a query sent in an old term, arriving after the node leads again, does not match the
 * new leader's query: it is dropped, and it neither joins the new pass (it walked a slice from
 * the old pass's cursor) nor marks the new query answered (which would let a second one go). */
struct repair_scan_ticket {
    uint64_t last;    /* the last ticket handed out */
    uint64_t awaited; /* the ticket of the query in flight; 0 = none */
};

/* A query is about to be sent: its ticket (never 0), now the awaited one. */
static inline uint64_t repair_scan_send(struct repair_scan_ticket *t)
{
    if (++t->last == 0)
        t->last = 1;
    t->awaited = t->last;
    return t->awaited;
}

static inline bool repair_scan_in_flight(const struct repair_scan_ticket *t)
{
    return t->awaited != 0;
}

/* Forget the query in flight (a reset): its answer, when it comes, is dropped. */
static inline void repair_scan_forget(struct repair_scan_ticket *t)
{
    t->awaited = 0;
}

/* An answer (or failure) to the query sent with `ticket` came: true if it is the awaited one
 * (then none is awaited any more); false if stale, to be dropped without counting. */
static inline bool repair_scan_answered(struct repair_scan_ticket *t, uint64_t ticket)
{
    if (ticket == 0 || ticket != t->awaited)
        return false;
    t->awaited = 0;
    return true;
}

#endif
