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
 * Environment (parsed once, when the process starts its fault owner: at the first engine start or
 * the first kvp_xfer_fault_* call, whichever comes first): KVP_XFER_FAULT="rule;rule;..." with a rule
 * "action[,key=value]..." and keys transport=tcp|local, op=read|write, segment=ID,
 * endpoint=HOST:PORT, ms=N, count=N (0 = every match). Example:
 *   KVP_XFER_FAULT="late,op=read,ms=500;fail,transport=tcp,op=write,segment=3,count=1"
 */
#ifndef KVP_XFER_FAULT_H
#define KVP_XFER_FAULT_H

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
struct kvp_rt_actor;

struct xfer_fault_hit {
    uint8_t action;
    uint32_t ms;
};

#ifdef KVP_FAULT_INJECTION
/*
 * The rules are owned by one runtime actor per process, "xfer-fault" (fault.c), started at the
 * first fault call or the first fault transport's open. Each fault transport (xfer_fault.c) holds
 * a port: a sink the owner pushes rule tables and releases into, and the transport's own copy of
 * the rules, read only on its transfer actor's thread. A count-limited rule is decided by the
 * owner (xfer_fault_port_ask); every other rule is matched on the copy. Hits, the end of a held
 * piece and late WRITE frames are reported to the owner by message; the owner keeps the counts,
 * the outstanding pieces (kvp_xfer_fault_quiesce) and sends the late frames.
 */
#define XFER_FAULT_MAX_RULES 16
#define XFER_FAULT_EP_MAX 128

struct xfer_fault_rule_slot {
    struct kvp_xfer_fault_rule r; /* r.endpoint is NULL: the endpoint is below */
    char endpoint[XFER_FAULT_EP_MAX];
    uint32_t left;                /* count left (owner only; r.count > 0) */
    bool spent;                   /* a count-limited rule that hit its count */
};

struct xfer_fault_port {
    struct kvp_rt_actor *sink;    /* the owner pushes into it; drained on the transport's thread */
    unsigned n;                   /* rules in the copy */
    struct xfer_fault_rule_slot rules[XFER_FAULT_MAX_RULES];
    unsigned long gen;            /* releases seen */
};

enum { XFER_FAULT_NONE = 0, XFER_FAULT_HIT = 1, XFER_FAULT_ASK = 2 };

/* Register with the owner and take its rules (on the transfer actor's thread, at open). NULL when
 * the owner could not be reached (logged; the transport then never faults). */
struct xfer_fault_port *xfer_fault_port_open(void);
/* Unregister (pieces it still counted as outstanding are forgotten by the owner) and free. */
void xfer_fault_port_close(struct xfer_fault_port *p);
/* Apply what the owner pushed: rule tables, releases (p->gen), and answers to asks, which go to
 * on_answer(arg, ask_id, hit or NULL for no fault). Cheap when nothing came (one sink check). */
void xfer_fault_port_sync(struct xfer_fault_port *p,
                          void (*on_answer)(void *arg, uint64_t ask_id, const struct xfer_fault_hit *hit),
                          void *arg);
/* Match on the copy: XFER_FAULT_NONE, XFER_FAULT_HIT (*out set; report it with _hit), or
 * XFER_FAULT_ASK (a count-limited rule comes first: ask the owner with _ask). */
int xfer_fault_port_match(const struct xfer_fault_port *p, uint8_t transport, uint8_t op,
                          uint32_t segment_id, const char *endpoint, struct xfer_fault_hit *out);
/* Ask the owner to match (and consume a count): the answer comes through _sync. */
int xfer_fault_port_ask(struct xfer_fault_port *p, uint64_t ask_id, uint8_t transport, uint8_t op,
                        uint32_t segment_id, const char *endpoint);
/* A local match hit a piece (counted; outstanding unless FAIL) / a piece that was outstanding is over. */
void xfer_fault_port_hit(struct xfer_fault_port *p, uint8_t action);
void xfer_fault_port_done(struct xfer_fault_port *p);
/* Send a copy of a WRITE frame after ms (or at release) on a connection of its own (the owner's). */
void xfer_fault_port_late_write(struct xfer_fault_port *p, const struct sockaddr_storage *addr,
                                unsigned addr_len, const uint8_t *hdr, const uint8_t *payload,
                                uint64_t len, uint32_t ms);
#endif

#endif
