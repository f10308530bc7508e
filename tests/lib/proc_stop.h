/*
 * proc_stop.h — stopping a process for a test and knowing that it is stopped.
 *
 * kill(pid, SIGSTOP) returns once the signal is queued, not once the process is stopped: the
 * kernel wakes one thread to take the signal and the other threads stop only when that thread
 * has started the group stop. On a loaded 2-core machine the woken thread may not run for tens
 * of milliseconds while the process's other threads keep serving requests (seen in CI: a
 * "stopped" segment answered 32 reads). Tests that need a silent process call this instead.
 */
#ifndef KVP_TEST_PROC_STOP_H
#define KVP_TEST_PROC_STOP_H

#include <stdbool.h>
#include <sys/types.h>

/* Send SIGSTOP to pid and wait until every thread of it is in state 'T' (stopped) or 't',
 * checking /proc/PID/task/TID/stat every millisecond for at most timeout_ms. Returns true once
 * all are stopped, false on a kill() error, a vanished process or the timeout. */
bool kvp_test_stop_process(pid_t pid, unsigned timeout_ms);

/* Is every thread of pid stopped now? false if the process has no /proc entry. */
bool kvp_test_process_stopped(pid_t pid);

#endif
