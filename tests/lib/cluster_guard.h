/*
 * cluster_guard.h — daemons a test started through `kvpoolctl cluster up` never outlive it.
 *
 * `cluster up` starts kvpool-master and kvpool-segment in their own sessions (setsid): they are
 * not the test's children, so proc_reap does not see them, and ctest's timeout (which SIGKILLs
 * the test and the children it can find through their parent pid) leaves them running. A
 * cluster of a test killed that way was found still running after a run (stop 29).
 *
 * The guard works by a mark in the environment: the test sets KVP_TEST_OWNER=<pid>.<start time>
 * before it runs kvpoolctl, and every process started from there on (kvpoolctl, the daemons it
 * spawns, `cluster restart`) inherits it. A guard process, detached from the test (its own
 * session, reparented to init, so the timeout's kill of the test's process tree misses it),
 * waits on a pidfd of the test process; when the test is gone, however it went (normal exit,
 * failed assert, crash, ctest's timeout SIGKILL), it SIGKILLs every process whose
 * /proc/PID/environ carries that exact mark, and exits. After a clean teardown it finds none.
 *
 * Shell scripts and the Python tests use the same guard through tests/kvp_test_guard (see
 * tests/lib/guard/kvp_test_guard.c): `export KVP_TEST_OWNER=$("$KVP_BUILD_DIR"/tests/kvp_test_guard $$)`.
 */
#ifndef KVP_TEST_CLUSTER_GUARD_H
#define KVP_TEST_CLUSTER_GUARD_H

#include <stddef.h>
#include <sys/types.h>

/* Start a guard for process `owner` (> 0, alive) and write its mark ("<pid>.<start time in
 * clock ticks>", the value to export as KVP_TEST_OWNER) into token (cap bytes, 32 is enough).
 * The guard is detached at once; the call returns after it started. Returns 0, or -1 with a
 * line on stderr (owner not found, fork failed, token too small). */
int kvp_test_guard_start(pid_t owner, char *token, size_t cap);

/* Idempotent per process: start a guard for this process and set KVP_TEST_OWNER in its
 * environment (so processes it starts from now on carry the mark). Call before `kvpoolctl
 * cluster up`. Returns 0 or -1 (then the cluster runs unguarded; the test still works). */
int kvp_test_cluster_guard(void);

#endif
