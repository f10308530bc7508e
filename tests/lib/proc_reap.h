/*
 * proc_reap.h — children a test forked never outlive it.
 *
 * A failed cmocka assert leaves the test function at once (longjmp), past the lines that would
 * have stopped the processes it forked: a kvpool-segment child then kept draining toward masters
 * that the group teardown had already stopped (seen after a failed test_drain_edge run). A test
 * tracks each long-lived child right after fork(); its teardown (and, as a last resort, the
 * process's exit) kills and reaps those still running.
 */
#ifndef KVP_TEST_PROC_REAP_H
#define KVP_TEST_PROC_REAP_H

#include <sys/types.h>

/* Remember pid (a child of this process, from fork()) so that kvp_test_children_kill stops
 * it. The first call also registers kvp_test_children_kill with atexit (it acts only in the
 * process that tracked: a forked child that calls exit() signals nothing). Up to 64 children
 * are tracked at once; pid <= 0 is ignored. */
void kvp_test_child_track(pid_t pid);

/* SIGKILL and reap every tracked child that has not been reaped yet, then forget them all.
 * A child the test already reaped is skipped (waitpid answers ECHILD), so a pid the kernel has
 * since given to an unrelated process is never signalled. Returns the number killed. */
int kvp_test_children_kill(void);

/* The same as a cmocka teardown (state unused; always 0), for tests whose children are forked
 * inside the test: cmocka_unit_test_teardown(test, kvp_test_children_teardown). */
int kvp_test_children_teardown(void **state);

#endif
