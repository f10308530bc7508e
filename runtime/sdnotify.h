/*
 * sdnotify.h — readiness and stop notifications to a service manager (systemd's Type=notify,
 * sd_notify(3)'s protocol) without libsystemd: one datagram to the AF_UNIX socket that
 * $NOTIFY_SOCKET names. kvpool-master sends READY=1 once its control port is bound (a request
 * sent then is served), kvpool-segment once its segment is mounted; both send STOPPING=1 when
 * they begin to stop (packaging/systemd/, docs/operations.md "Running under systemd").
 */
#ifndef KVP_RUNTIME_SDNOTIFY_H
#define KVP_RUNTIME_SDNOTIFY_H

/**
 * Send `state` (newline-separated assignments such as "READY=1\nSTATUS=serving") as one
 * datagram to $NOTIFY_SOCKET: an absolute path, or "@name" for a socket in the abstract
 * namespace. Without NOTIFY_SOCKET (not started by a service manager) nothing is sent.
 * Returns 1 when sent, 0 when NOTIFY_SOCKET is unset or empty, KVP_ERR_INVALID when `state`
 * is NULL or NOTIFY_SOCKET is neither form (or longer than a socket path can be), KVP_ERR_IO
 * when the datagram could not be sent (no such socket, no receiver, ...). Each error is logged
 * as a WARN of `actor` naming the socket and the reason: the process goes on either way (the
 * service manager then times the start out, which says more than a crash would).
 * Never blocks (MSG_DONTWAIT); any thread may call it; reads the environment (getenv).
 */
int kvp_sd_notify(const char *actor, const char *state);

#endif
