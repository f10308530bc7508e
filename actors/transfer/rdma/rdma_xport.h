/*
 * rdma_xport.h — the `rdma` transport (issue 20; ../shared/design/rdma.md; docs/rdma.md): RC
 * queue pairs over the verbs ops table, one-sided READ for gets and WRITE for puts, with the
 * fencing of the note §2.3 (requester) and §2.4 L2 (segment side).
 *
 * One kvp_rdma_xport is one process's RDMA state: its NICs (each a device context, PD, CQ with
 * credits and a completion channel), the MR cache of registered memory, the bounce pool for
 * unregistered host memory, and the endpoints. It is owned by one actor (the transfer actor, or
 * the segment's): single-threaded, no locks. Nothing here sleeps or reads a clock by itself:
 * time and waiting come from a kvp_rdma_env, which is the runtime's clock and the completion
 * channel's fd in production and the verbs double's virtual clock in tests, so the same code
 * runs both.
 *
 * Client side: kvp_rdma_ep_offer makes an endpoint (rdma_qps_per_peer RC QPs on the NIC nearest
 * the memory, random 24-bit PSNs, a new conn_generation) and its RdmaHello; the segment answers
 * with kvp_rdma_seg_accept; kvp_rdma_ep_complete brings the QPs to RTS and takes the segment's
 * MR chunk table. kvp_rdma_run moves a batch of slices and returns only when every work request
 * it posted has a polled completion, or its QPs were destroyed and its memory deregistered
 * (wedged provider): contract C2.
 *
 * Segment side: kvp_rdma_seg_register registers the region in chunks of at most max_mr_size
 * (LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE); kvp_rdma_seg_accept answers offers; and
 * kvp_rdma_seg_fence_writer moves every QP facing a writer to ERR and destroys it, after which
 * no packet of that writer can place a byte in the region (an Error QP answers no inbound
 * request): the segment-side fence the master waits for before reusing a revoked put's space
 * (contract C3; note §2.4 L2).
 */
#ifndef KVP_XFER_RDMA_XPORT_H
#define KVP_XFER_RDMA_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/transfer/rdma/rdma_chunk.h"
#include "actors/transfer/rdma/rdma_fence.h"
#include "actors/transfer/rdma/rdma_topo.h"
#include "actors/transfer/rdma/verbs_ops.h"

/* Time and waiting (see the file comment). */
struct kvp_rdma_env {
    uint64_t (*now_ns)(void *arg);
    /* Block until a completion may be ready or max_ns passed (production: poll() on the
     * completion channel fds of kvp_rdma_xport_fds; the double: advance its virtual clock). */
    void (*wait)(void *arg, uint64_t max_ns);
    void *arg;
};

/* GPU memory through dma-buf (note §5): the CUDA driver calls the transport needs, loaded by
 * the client (actors/client/devmem.c) or given by a test. All may be NULL: GPU memory then
 * goes to the caller's staging path (kvp_rdma_register answers KVP_ERR_UNSUPPORTED). */
struct kvp_rdma_cuda {
    /* cuMemGetAddressRange: the allocation holding ptr. 0 = success. */
    int (*addr_range)(void *arg, uint64_t ptr, uint64_t *base, uint64_t *size);
    /* cuMemGetHandleForAddressRange(DMA_BUF_FD, flags 0): a dma-buf fd for [base, base+size). */
    int (*dmabuf_fd)(void *arg, uint64_t base, uint64_t size, int *fd);
    /* close the fd once every NIC imported it */
    void (*close_fd)(void *arg, int fd);
    /* true when the device needs cuFlushGPUDirectRDMAWrites after READs land in its memory
     * (GPU_DIRECT_RDMA_WRITES_ORDERING below OWNER and FLUSH_WRITES_OPTIONS has HOST) */
    bool (*needs_flush)(void *arg, int ordinal);
    /* cuFlushGPUDirectRDMAWrites(TARGET_CURRENT_CTX, TO_OWNER). 0 = success. */
    int (*flush)(void *arg, int ordinal);
    void *arg;
};

struct kvp_rdma_cfg {
    const struct kvp_verbs_ops *ops;
    const char *who;            /* actor name for logs */
    const char *devices;        /* device_name / rdma_devices: comma list, NULL or "" = any */
    const char *sysfs_root;     /* NIC topology ("/sys"; NULL = "/sys") */
    int gid_index;              /* -1 = auto (config gid_index) */
    uint32_t qps_per_peer;      /* 1..16 (rdma_qps_per_peer); 0 = 2 */
    uint64_t slice_bytes;       /* bytes per WR (rdma_slice_bytes); 0 = 256 KiB */
    uint32_t fence_bound_ms;    /* rdma_fence_bound_ms; 0 = 1000 */
    uint32_t cq_size;           /* CQEs per NIC CQ; 0 = 4096 */
    uint32_t max_send_wr;       /* per QP; 0 = 256 */
    uint32_t bounce_slots;      /* bounce buffers of slice_bytes each; 0 = 16 */
    uint64_t psn_seed;          /* 0: PSNs from getrandom(); else a seeded generator (tests) */
    bool segment;               /* a segment: QPs grant REMOTE_READ | REMOTE_WRITE */
    int nodev_log_level;        /* level of the one "no RDMA" line (KVP_LOG_WARN when asked for) */
    const struct kvp_rdma_cuda *cuda; /* may be NULL */
};

struct kvp_rdma_xport;
struct kvp_rdma_ep;

/**
 * Open the transport: probe devices (NULL or 0 = no RDMA), apply cfg->devices, open each
 * allowed device with an ACTIVE port (context, PD, CQ, completion channel, GID selection).
 * Returns KVP_OK; KVP_ERR_UNSUPPORTED when no usable device exists (exactly one log line, at
 * cfg->nodev_log_level, saying TCP is used: the caller falls back to TCP); KVP_ERR_INVALID
 * (bad cfg, or a device list naming a device that is not there: logged); KVP_ERR_NOMEM;
 * KVP_ERR_IO (a verb failed; logged).
 */
int kvp_rdma_open(const struct kvp_rdma_cfg *cfg, const struct kvp_rdma_env *env,
                  struct kvp_rdma_xport **out);

/** Fence and free every endpoint, deregister everything, close the devices. NULL ok. */
void kvp_rdma_close(struct kvp_rdma_xport **x);

/** Number of open NICs and the name of NIC i ("" when out of range). */
size_t kvp_rdma_nics(const struct kvp_rdma_xport *x);
const char *kvp_rdma_nic_name(const struct kvp_rdma_xport *x, size_t i);
/** Completion channel fds of the NICs (production waits on them): up to cap, returns count. */
size_t kvp_rdma_fds(const struct kvp_rdma_xport *x, int *fds, size_t cap);

/* --------------------------------------------------------------- memory */
enum kvp_rdma_mem_kind { KVP_RDMA_MEM_HOST = 0, KVP_RDMA_MEM_CUDA = 1 };

struct kvp_rdma_mem {
    int kind;                   /* enum kvp_rdma_mem_kind */
    int ordinal;                /* CUDA device ordinal */
    int numa_node;              /* host memory's node, -1 unknown */
    const char *gpu_pci_path;   /* resolved sysfs path of the GPU, NULL unknown */
};

/**
 * Register caller memory [addr, addr+len) (kvp_register_buffer): LOCAL_WRITE only, so no peer
 * can read or write it through any key; in chunks of the device's max_mr_size; on the NIC
 * nearest the memory (rdma_topo.h). Overlapping and nested registrations share the MR cache:
 * a range inside an existing registration takes a reference on it; a range that overlaps one
 * registers the union once. CUDA memory goes through dma-buf (export once, import per NIC);
 * KVP_ERR_UNSUPPORTED when that route is unavailable (no cuda table, the driver refuses): the
 * caller then stages through host memory (actors/client/devstage.c). Errors: KVP_ERR_INVALID,
 * KVP_ERR_NOMEM (memlock), KVP_ERR_IO. Each call must be paired with kvp_rdma_unregister.
 */
int kvp_rdma_register(struct kvp_rdma_xport *x, void *addr, uint64_t len,
                      const struct kvp_rdma_mem *mem);
/** Drop one registration of exactly [addr, addr+len). KVP_ERR_NOT_FOUND when none. */
int kvp_rdma_unregister(struct kvp_rdma_xport *x, void *addr, uint64_t len);

/* --------------------------------------------------------------- client side */

/**
 * Start an endpoint to `segment_id` (0: whichever segment answers) for memory near `mem` (NULL: host, unknown node): QPs in
 * RESET with random PSNs, a new conn_generation for this (client_id, segment) pair, and the
 * offer in *hello (malloc'd, caller frees; send it to the segment). Errors: KVP_ERR_NOMEM,
 * KVP_ERR_IO (QP creation failed; logged), KVP_ERR_INVALID.
 */
int kvp_rdma_ep_offer(struct kvp_rdma_xport *x, uint32_t segment_id, uint64_t client_id,
                      const struct kvp_rdma_mem *mem, struct kvp_rdma_ep **ep, uint8_t **hello,
                      size_t *hello_len);

/**
 * Take the segment's answer: decode and check it (a malformed answer is KVP_ERR_MALFORMED,
 * logged with the field), bring every QP to RTS facing the segment's, keep its chunk table.
 * A refusal answer returns its status. On error the endpoint stays unusable: free it.
 */
int kvp_rdma_ep_complete(struct kvp_rdma_ep *ep, const uint8_t *answer, size_t len);

/** The segment id the endpoint reaches (learnt from the answer when the offer named 0). */
uint32_t kvp_rdma_ep_segment(const struct kvp_rdma_ep *ep);

/** Consume and acknowledge completion-channel events and re-arm every CQ (production; a no-op
 *  under a test env). Call after progress, before waiting on kvp_rdma_fds. */
void kvp_rdma_arm(struct kvp_rdma_xport *x);

/** Fence (if live) and free an endpoint. NULL ok; sets *ep NULL. */
void kvp_rdma_ep_free(struct kvp_rdma_ep **ep);

/** True while the endpoint can take batches (connected, never fenced). */
bool kvp_rdma_ep_live(const struct kvp_rdma_ep *ep);
/** The endpoint's generation and local NIC name (status: transport and device per peer). */
uint64_t kvp_rdma_ep_generation(const struct kvp_rdma_ep *ep);
const char *kvp_rdma_ep_nic(const struct kvp_rdma_ep *ep);

enum kvp_rdma_op { KVP_RDMA_READ = 1, KVP_RDMA_WRITE = 2 };

struct kvp_rdma_slice {
    void *local;                /* READ destination / WRITE source */
    uint64_t len;               /* bytes >= 1 */
    uint64_t remote_offset;     /* inside the segment's region */
    uint8_t op;                 /* enum kvp_rdma_op */
    int status;                 /* out: KVP_OK, KVP_ERR_TIMEOUT (fenced), KVP_ERR_TRANSFER,
                                 * KVP_ERR_FENCE_FAILED (wedged: QPs destroyed, memory deregistered) */
};

/* ---- the non-blocking core (what the transport seam's post/poll/fence/abort drive) ----
 * Every submitted xslice gets exactly one report from kvp_rdma_progress, and once it is
 * reported no WR of it can touch its local memory (its CQE was polled, or its QP destroyed and
 * the MRs it used deregistered). */

/**
 * Queue one xslice of at most slice_bytes on ep: it is cut at MR chunk edges on both sides and
 * posted by kvp_rdma_progress as QP credits, CQ credits and bounce slots allow (never refused for
 * room). Local memory registered with kvp_rdma_register is used in place; other host memory
 * goes through the bounce pool (WRITE: copied in before posting; READ: copied out after its
 * completion, before it is reported). Errors (nothing queued): KVP_ERR_INVALID (length 0 or
 * above slice_bytes, bad op, a range outside the segment, an endpoint not live),
 * KVP_ERR_NOMEM.
 */
int kvp_rdma_submit(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, uint64_t id, uint8_t op,
                    void *local, uint64_t len, uint64_t remote_offset);
/**
 * As kvp_rdma_submit, with the WRITE's deadline: write_deadline_ms (wall-clock ms, CLOCK_REALTIME;
 * 0: none; READs ignore it) reached, the xslice is refused (KVP_ERR_TIMEOUT, nothing queued), and
 * a piece still waiting for room when it is reached is never posted (reported KVP_ERR_TIMEOUT).
 * An RDMA WRITE is one-sided: the segment cannot check a deadline (docs/fencing.md C3), so the
 * writer does not post past it; one posted before it is the segment-side fence's (FenceWriter).
 */
int kvp_rdma_submit_until(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, uint64_t id, uint8_t op,
                          void *local, uint64_t len, uint64_t remote_offset, uint64_t write_deadline_ms);

struct kvp_rdma_report {
    uint64_t id;
    int status;   /* KVP_OK, KVP_ERR_TRANSFER, the fence status, KVP_ERR_FENCE_FAILED */
};

/**
 * Post what has room, reap every NIC's CQ, advance fences, and write up to max reports.
 * Returns how many (call again while it returns max). Never blocks. An error completion fences
 * its endpoint (its other xslices fail with KVP_ERR_TRANSFER once flushed).
 */
size_t kvp_rdma_progress(struct kvp_rdma_xport *x, struct kvp_rdma_report *out, size_t max);

/**
 * Fence the listed xslices (unknown ids ignored): unposted ones are reported with `status` at
 * the next progress; for posted ones every QP of their endpoint goes to ERR and they are
 * reported with `status` once a completion (success or flush) has been polled for each of their
 * WRs. A provider that never flushes leaves them unreported: then kvp_rdma_abort.
 */
void kvp_rdma_fence(struct kvp_rdma_xport *x, const uint64_t *ids, size_t n, int status);

/**
 * The fence that cannot wait: for each endpoint holding a listed, unreported xslice, its QPs
 * are destroyed now and every MR its posted WRs could reach (the MR-cache entries they used,
 * the bounce pool) is deregistered before this returns, so the NIC can no longer reach that
 * memory even if the provider never flushes; those chunks are then registered again under new
 * keys for later xslices. Every xslice of those endpoints not yet reported is reported with
 * KVP_ERR_FENCE_FAILED (listed) or KVP_ERR_TRANSFER (collateral).
 */
void kvp_rdma_abort(struct kvp_rdma_xport *x, const uint64_t *ids, size_t n);

/** Xslices submitted and not yet reported. */
size_t kvp_rdma_inflight(const struct kvp_rdma_xport *x);

/**
 * A blocking batch over the core, driven as the transfer engine drives a transport: submit every
 * slice (cut into xslices of slice_bytes), progress and wait until all are reported; at
 * timeout_ms (> 0) fence the rest with KVP_ERR_TIMEOUT; after fence_bound_ms more, abort what is
 * still unreported. Returns when every slice is terminal: KVP_OK or the first error; per-slice
 * status in s[i].status. KVP_ERR_INVALID (nothing ran) for a bad slice or an endpoint that is
 * not live. Used by tests and the benchmark; the engine uses the core through the seam.
 */
int kvp_rdma_run(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, struct kvp_rdma_slice *s,
                 size_t n, uint32_t timeout_ms);

/* --------------------------------------------------------------- segment side */

/**
 * Register the segment's region (once, at mount) in chunks of min(max_mr_size, 4 GiB) with
 * LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE on the NIC nearest `mem`. Errors as
 * kvp_rdma_region_register; KVP_ERR_BUSY when already registered.
 */
int kvp_rdma_seg_register(struct kvp_rdma_xport *x, uint32_t segment_id, void *base, uint64_t len,
                          const struct kvp_rdma_mem *mem);

/**
 * Answer a client's offer: check it, make as many QPs, bring them to RTS facing the client's,
 * and write the answer (our QPs and the chunk table) into *answer (malloc'd). An offer with a
 * newer generation from the same client first fences that client's older QPs. A bad offer gets
 * a refusal answer (status set) and the error is returned: KVP_ERR_MALFORMED (logged once with
 * the field), KVP_ERR_NOT_FOUND (wrong segment id), KVP_ERR_UNSUPPORTED (no region).
 */
int kvp_rdma_seg_accept(struct kvp_rdma_xport *x, const uint8_t *offer, size_t len,
                        uint8_t **answer, size_t *answer_len);

/**
 * The segment-side fence (FenceWriter{client, gen}): every QP facing client_id with a
 * generation <= gen goes to ERR and is destroyed; when this returns, no packet of that writer
 * places another byte in the region. Returns the number of QPs fenced (>= 0).
 */
int kvp_rdma_seg_fence_writer(struct kvp_rdma_xport *x, uint64_t client_id, uint64_t gen);

/* --------------------------------------------------------------- counters */
struct kvp_rdma_stats {
    uint64_t posted, completed;  /* WRs */
    uint64_t fenced_batches, wedged_batches;
    uint64_t late_ok, stale_wc;
    uint64_t bounce_bytes;       /* bytes staged through the bounce pool */
    uint64_t mr_regs, mr_cache_hits;
    uint64_t writers_fenced;     /* QPs destroyed by kvp_rdma_seg_fence_writer */
    uint32_t cq_high_water, cq_size;
    uint64_t gpu_flushes;
    uint64_t late_refused;       /* WRITE xslices/pieces not posted: their deadline had passed */
};
void kvp_rdma_stats(const struct kvp_rdma_xport *x, struct kvp_rdma_stats *out);

#endif
