/*
 * actor_harness.h — run an actor's handlers synchronously on the test thread and capture
 * what it sends.
 *
 * The actor under test is a manual actor (kvp_rt_spawn_manual) whose parent is the harness
 * `probe`, a sink: anything the actor sends to th->probe (give it th->probe as its peer in
 * the spec's state), requests it makes to th->probe, and supervision reports
 * (KVP_RT_FAILED) land there and are read with kvp_th_take(). A fake clock is installed for
 * the harness's lifetime; kvp_th_advance_ms() moves it and fires due timers and deadlines.
 * Every call runs on the test thread; after kvp_th_send/request/advance returns, the actor
 * has handled everything that was due.
 */
#ifndef KVP_TESTLIB_ACTOR_HARNESS_H
#define KVP_TESTLIB_ACTOR_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/actor.h"
#include "tests/lib/fake_clock.h"

struct kvp_th {
    struct kvp_rt_actor *actor; /* the actor under test (manual) */
    struct kvp_rt_actor *probe; /* sink capturing its output and its failure reports */
    struct kvp_fake_clock clock;
    uint64_t next_corr;
};

/** Install the fake clock, create the probe, spawn the actor (its init runs now). */
int kvp_th_init(struct kvp_th *th, const struct kvp_rt_spec *spec);
/** Stop the actor (close, finis), drop captured messages, restore the real clock. Returns
 * kvp_rt_stop's result (the actor's failure, if any). */
int kvp_th_fini(struct kvp_th *th);

/** Send a one-way message to the actor (or hosted `hid`) and run it. Returns messages run. */
int kvp_th_send(struct kvp_th *th, uint64_t hid, uint32_t type, uint64_t arg, void **payload,
                kvp_rt_free_fn free_fn);
/** Send a request from the probe and run it; the reply, when made, lands in the probe with
 * corr_id *corr. Returns messages run or a negative error. */
int kvp_th_request(struct kvp_th *th, uint64_t hid, uint32_t type, uint64_t arg, void **payload,
                   kvp_rt_free_fn free_fn, uint64_t *corr);
/** Advance the fake clock and run what became due. Returns messages/timers run. */
int kvp_th_advance_ms(struct kvp_th *th, uint64_t ms);
/** Run whatever is queued for the actor (e.g. after a reply was pushed to it). */
int kvp_th_run(struct kvp_th *th);

/** Take the oldest captured message (caller frees with kvp_rt_msg_destroy, or answers a
 * captured request with kvp_rt_msg_reply). KVP_ERR_TIMEOUT when there is none. */
int kvp_th_take(struct kvp_th *th, struct kvp_rt_msg **msg);
/** Number of captured messages not taken yet. */
size_t kvp_th_captured(struct kvp_th *th);

#endif
