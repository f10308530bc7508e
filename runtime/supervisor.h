/*
 * supervisor.h — a supervisor actor (kvp_rt_sup_*): it owns threaded child actors, restarts a
 * child that fails, and gives up after too many failures in a row.
 *
 * A child fails when one of its handlers returns a negative kvp_err (actor.h "Supervision"):
 * the runtime closes it and sends its parent, the supervisor, a KVP_RT_FAILED report. The
 * supervisor logs it (WARN, naming the child and the error), stops the failed child (its fini
 * runs) and starts it again with the same start function, so the child begins from fresh state.
 * When a child fails more than `max_restarts` times within `window_ms`, the supervisor gives up
 * on it: it logs at ERROR and calls the policy's give_up, whose default stops the process
 * (kill(getpid(), SIGTERM): the process's own signal path stops its actors; a daemon exits).
 *
 * Threads: every child is started and stopped on the supervisor's thread (it is their owner).
 * kvp_rt_sup_add / kvp_rt_sup_stop_child / kvp_rt_sup_restarts block the calling thread until
 * the supervisor answered; call them from a thread that is not an actor (the supervisor's
 * owner). Stop the supervisor with kvp_rt_destroy: its children stop first, newest first.
 */
#ifndef KVP_RUNTIME_SUPERVISOR_H
#define KVP_RUNTIME_SUPERVISOR_H

#include <stdint.h>

#include "runtime/actor.h"

/**
 * Starts one child: spawn a threaded actor with `parent` as its parent (kvp_rt_spawn(out, spec,
 * parent)) and fresh state built from `arg`. Runs on the supervisor's thread, at the first start
 * and at every restart. Returns KVP_OK, or a negative kvp_err (then *out is untouched).
 */
typedef int (*kvp_rt_sup_start_fn)(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out);

/** What a supervisor does with failing children. */
struct kvp_rt_sup_policy {
    uint32_t max_restarts; /* restarts allowed per child within window_ms; 0 = give up at once */
    uint32_t window_ms;    /* failures older than this are forgotten; 0 = 60000 */
    /**
     * Called on the supervisor's thread when it gives up on `child` (which stays stopped), after
     * the ERROR line. NULL = stop the process: kill(getpid(), SIGTERM).
     */
    void (*give_up)(void *arg, const char *child, int err);
    void *give_up_arg;
};

/**
 * Spawn a supervisor named `name` (NULL policy = 3 restarts per 60 s, then stop the process).
 * Errors: as kvp_rt_spawn.
 */
int kvp_rt_sup_new(struct kvp_rt_actor **out, const char *name, const struct kvp_rt_sup_policy *policy);

/**
 * Start a child named `child` (<= KVP_RT_NAME_MAX bytes, unique in this supervisor) with
 * start(arg, supervisor, &actor) on the supervisor's thread; arg must outlive the supervisor.
 * Blocks until it ran. Errors: start's error, KVP_ERR_EXISTS (name taken), KVP_ERR_NOMEM,
 * KVP_ERR_INVALID, KVP_ERR_CLOSED.
 */
int kvp_rt_sup_add(struct kvp_rt_actor *sup, const char *child, kvp_rt_sup_start_fn start, void *arg);

/**
 * Stop child `child` for good (no restart; its fini runs on its thread before this returns).
 * Errors: KVP_ERR_NOT_FOUND (no such child, or already stopped), KVP_ERR_CLOSED.
 */
int kvp_rt_sup_stop_child(struct kvp_rt_actor *sup, const char *child);

/**
 * How many times child `child` was restarted, and whether it runs (*running may be NULL).
 * Errors: KVP_ERR_NOT_FOUND, KVP_ERR_CLOSED.
 */
int kvp_rt_sup_restarts(struct kvp_rt_actor *sup, const char *child, uint32_t *restarts, int *running);

#endif
