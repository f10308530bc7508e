/*
 * fault.h — fault injection for the transfer engine (tests only; docs/fencing.md).
 *
 * Compiled in when KVP_FAULT_INJECTION is defined (CMake option, ON in test builds, OFF in
 * release builds: -DKVP_FAULT_INJECTION=OFF). Without it every kvp_xfer_fault_* call returns
 * KVP_ERR_UNSUPPORTED and the engine's hooks compile to nothing.
 *
 * A rule matches slices by transport (tcp/local), direction (READ/WRITE), segment id and
 * endpoint (0 / NULL = any) and applies an action to each matching piece (a slice is cut into
 * pieces of at most slice_bytes):
 *   STALL  the piece is held N ms before it goes on the wire (READ and WRITE); fenced while held,
 *          it is dropped. A rule with op 0 and an endpoint stalls a whole peer.
 *   LATE   the piece goes out, but its completion lands N ms late: READ: the connection stops
 *          reading when this piece's response is next (the bytes wait in the socket) and resumes
 *          after N ms whether or not the piece was fenced meanwhile; WRITE: the frame (header and
 *          a copy of the payload) is sent N ms later on a connection of its own even when the
 *          piece was fenced — what TCP retransmissions of bytes already handed to the kernel do.
 *   DROP   never sent, never answered: only a timeout ends the piece.
 *   FAIL   the piece fails at once with KVP_ERR_TRANSFER.
 *   WEDGE  the transport cannot fence the piece (a wedged RDMA QP): it is held until released;
 *          a timeout starts the fence bound, after which the engine tears down the transport and
 *          reports KVP_ERR_FENCE_FAILED.
 * Local transport: STALL/LATE sleep N ms in the caller before the copy (a copy that would end
 * after the deadline is not done: TIMEOUT), DROP waits for the deadline, FAIL fails, WEDGE waits
 * for the fence bound and reports KVP_ERR_FENCE_FAILED.
 *
 * Environment (parsed once, at the first engine start): KVP_XFER_FAULT="rule;rule;..." with a rule
 * "action[,key=value]..." and keys transport=tcp|local, op=read|write, segment=ID,
 * endpoint=HOST:PORT, ms=N, count=N (0 = every match). Example:
 *   KVP_XFER_FAULT="late,op=read,ms=500;fail,transport=tcp,op=write,segment=3,count=1"
 */
#ifndef KVP_XFER_FAULT_H
#define KVP_XFER_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum kvp_xfer_fault_action {
    KVP_FAULT_STALL = 1,
    KVP_FAULT_LATE = 2,
    KVP_FAULT_DROP = 3,
    KVP_FAULT_FAIL = 4,
    KVP_FAULT_WEDGE = 5,
};

enum kvp_xfer_fault_transport { KVP_FAULT_ANY = 0, KVP_FAULT_TCP = 1, KVP_FAULT_LOCAL = 2 };

struct kvp_xfer_fault_rule {
    uint8_t action;          /* enum kvp_xfer_fault_action */
    uint8_t transport;       /* enum kvp_xfer_fault_transport */
    uint8_t op;              /* KVP_XFER_READ / KVP_XFER_WRITE, 0 = both */
    uint32_t segment_id;     /* 0 = any */
    const char *endpoint;    /* NULL = any (copied) */
    uint32_t ms;             /* STALL / LATE length */
    uint32_t count;          /* pieces to hit, 0 = unlimited */
};

/** Add a rule. Returns KVP_OK, KVP_ERR_INVALID, KVP_ERR_NO_SPACE (16 rules), KVP_ERR_UNSUPPORTED. */
int kvp_xfer_fault_add(const struct kvp_xfer_fault_rule *r);
/** Remove every rule (pieces already hit keep their fault until released or expired). */
void kvp_xfer_fault_clear(void);
/** End every STALL, LATE and WEDGE now (held pieces go out, paused connections read, late frames are sent). */
void kvp_xfer_fault_release(void);
/**
 * Wait until no piece hit by a fault is outstanding anywhere (held, paused, late frame not yet
 * answered) — i.e. every late byte has landed wherever it lands. KVP_OK or KVP_ERR_TIMEOUT.
 */
int kvp_xfer_fault_quiesce(uint32_t timeout_ms);
/** Parse an environment-style spec (see above) and add its rules. KVP_ERR_INVALID on a bad rule (none added). */
int kvp_xfer_fault_parse(const char *spec);

struct kvp_xfer_fault_counts {
    uint64_t hits;          /* pieces a rule matched */
    uint64_t late_sent;     /* LATE WRITE frames sent after their delay */
    uint64_t late_refused;  /* ... answered with an error (a segment refused them) */
    uint64_t late_accepted; /* ... answered KVP_OK (landed in the region) */
};
void kvp_xfer_fault_counts(struct kvp_xfer_fault_counts *out);

/* ------------------------------------------------------------------ engine side (internal) */

struct sockaddr_storage;

struct xfer_fault_hit {
    uint8_t action;
    uint32_t ms;
};

#ifdef KVP_FAULT_INJECTION
extern atomic_uint xfer_fault_nrules;
extern atomic_ulong xfer_fault_gen;
bool xfer_fault_match_slow(uint8_t transport, uint8_t op, uint32_t segment_id, const char *endpoint,
                           struct xfer_fault_hit *out);
/* The hot-path check: one relaxed atomic load when no rule is set. */
static inline bool xfer_fault_match(uint8_t transport, uint8_t op, uint32_t segment_id,
                                    const char *endpoint, struct xfer_fault_hit *out)
{
    if (atomic_load_explicit(&xfer_fault_nrules, memory_order_relaxed) == 0)
        return false;
    return xfer_fault_match_slow(transport, op, segment_id, endpoint, out);
}
/* Whether any rule is set (one relaxed load). */
static inline bool xfer_fault_any(void)
{
    return atomic_load_explicit(&xfer_fault_nrules, memory_order_relaxed) != 0;
}
static inline unsigned long xfer_fault_generation(void)
{
    return atomic_load_explicit(&xfer_fault_gen, memory_order_acquire);
}
void xfer_fault_outstanding_add(int delta);
void xfer_fault_env_once(void);
/* Send a copy of a WRITE frame after ms (or at release) on a connection of its own. */
void xfer_fault_late_write(const struct sockaddr_storage *addr, unsigned addr_len, const uint8_t *hdr,
                           const uint8_t *payload, uint64_t len, uint32_t ms);
#else
static inline bool xfer_fault_match(uint8_t transport, uint8_t op, uint32_t segment_id,
                                    const char *endpoint, struct xfer_fault_hit *out)
{
    (void)transport, (void)op, (void)segment_id, (void)endpoint, (void)out;
    return false;
}
#endif

#endif
