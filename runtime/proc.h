/*
 * proc.h — start-up helpers for daemons that are restarted by a supervisor: waiting until a
 * killed process is really gone, retrying a listen address that is still held, and the
 * exclusive lock of a data directory.
 *
 * Why "really gone" needs care (issue 15): after SIGKILL, /proc/PID/stat of a multi-threaded
 * process shows 'Z' as soon as its first thread (the thread group leader) has exited, while
 * its other threads are still exiting and still hold the process's sockets and locks (measured
 * here: 'Z' after 0.2-1.3 ms, the listen port held for another ~33 ms). A restart in that window
 * fails to bind. A pidfd (pidfd_open(2), Linux 5.3) polls readable only once the whole thread
 * group has exited; kvp_proc_wait_gone waits for that, never for a state letter or a fixed delay.
 * The fd table is released on the same exit path, a few microseconds apart, so a daemon still
 * retries its binds (kvp_retry_bind) for the last window.
 */
#ifndef KVP_RUNTIME_PROC_H
#define KVP_RUNTIME_PROC_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/**
 * Has every thread of process `pid` exited (the process is a zombie waiting for its parent, or
 * is gone)? Does not wait. A pid <= 0 counts as gone. Uses a pidfd; on a kernel without
 * pidfd_open it falls back to "the leader is a zombie and no other thread is listed in
 * /proc/PID/task". A zombie that is our own child is not reaped here (see kvp_proc_reap).
 */
bool kvp_proc_gone(pid_t pid);

/**
 * Wait up to timeout_ms (milliseconds) until kvp_proc_gone(pid). If pid is a child of this
 * process it is reaped as well. Returns 0 when gone, KVP_ERR_TIMEOUT when it still had a live
 * thread at the deadline. Blocks the calling thread (poll on the pidfd, no fixed sleep).
 */
int kvp_proc_wait_gone(pid_t pid, uint32_t timeout_ms);

/**
 * One attempt of a start-up step that can fail because a previous incarnation still holds a
 * resource: returns KVP_OK, KVP_ERR_BUSY (held: try again; `why` says by what, e.g.
 * "Address already in use"), or any other code (give up at once; `why` says why).
 */
typedef int (*kvp_retry_fn)(void *arg, char *why, size_t why_cap);

/**
 * Call `attempt` until it returns something other than KVP_ERR_BUSY or budget_ms
 * (milliseconds, the daemons' `bind_retry_ms`) has passed. Between tries it sleeps with
 * exponential backoff (25 ms doubling to 500 ms, never past the budget), and logs one WARN line
 * per retry naming `what` (e.g. "bind tcp://127.0.0.1:7101") and the reason; giving up, or an
 * attempt failing with another code, logs one ERROR line with the attempt's reason. budget_ms 0 means one try. Returns the last attempt's code (KVP_ERR_BUSY
 * after the budget). `actor` names the logging component.
 */
int kvp_retry_start(const char *actor, const char *what, uint32_t budget_ms, kvp_retry_fn attempt, void *arg);

/**
 * Bind and listen on a TCP "host:port" (IPv4, [IPv6] or a name; SO_REUSEADDR, so TIME-WAIT
 * entries of a previous incarnation do not block) and close it again at once: tells whether a
 * listener could take the address now. Returns KVP_OK, KVP_ERR_BUSY (EADDRINUSE),
 * KVP_ERR_INVALID (bad or unresolvable address), KVP_ERR_IO (other bind errors, in `why`).
 * Used for ports bound inside a library (the Raft transport) that cannot be retried in place.
 */
int kvp_probe_listen(const char *hostport, char *why, size_t why_cap);

/**
 * Take the exclusive lock of data directory `dir` (flock(2) on DIR/LOCK, created if missing;
 * the lock file then holds the holder's pid, for the next one's error message). Retries with
 * kvp_retry_start for budget_ms while another process holds it, so a supervisor's restart
 * waits out a dying previous incarnation; a second live daemon on the same directory gets
 * KVP_ERR_BUSY and an ERROR line naming the directory and the holder's pid, having changed
 * nothing in the directory (the lock file is only created when missing, and written only by
 * the holder). On success *fd_out is the open lock file (O_CLOEXEC); keep it open for the
 * process's life. Errors: KVP_ERR_BUSY, KVP_ERR_IO (cannot open: logged), KVP_ERR_INVALID.
 */
int kvp_datadir_lock(const char *actor, const char *dir, uint32_t budget_ms, int *fd_out);

#endif
