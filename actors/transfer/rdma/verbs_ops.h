/*
 * verbs_ops.h — the internal verbs ops table (kvp_verbs_ops): the one seam between the rdma
 * transport and rdma-core, so that tests can swap in the verbs test double (tests/lib/fakeverbs.h).
 *
 * Why a table (docs/rdma.md, ../shared/design/rdma.md §0.5): ibv_post_send, ibv_poll_cq and
 * ibv_req_notify_cq are `static inline` in rdma-core's <infiniband/verbs.h> (they call through
 * the provider's context ops), so neither `-Wl,--wrap` nor LD_PRELOAD can intercept them. Every
 * verbs call the transport makes goes through this table instead; the transport holds a
 * `const struct kvp_verbs_ops *` (no global) and never calls ibv_* directly.
 *
 * Types: the table speaks rdma-core's own types (struct ibv_qp, ibv_send_wr, ibv_wc, ibv_qp_attr,
 * the IBV_* enums), so the transport is written against the documented verbs semantics and the
 * double models the man pages (attribute masks, WC status codes). Each entry has exactly the
 * signature, return convention and errno behaviour of the libibverbs function it names
 * (man 3 ibv_<name>, rdma-core 44): constructors return NULL and set errno; ibv_modify_qp,
 * ibv_post_send and friends return 0 or an errno value; poll_cq returns the number of
 * completions (>= 0) or a negative value when the CQ is in error. The only addition is the
 * first argument of get_device_list/free_device_list, the table itself, because the double
 * keeps one device list per simulated process and libibverbs' call has no context argument.
 *
 * Objects returned by one table may only be passed back to the same table (a fake ibv_qp is not
 * a real one). The tables are immutable once built; a table may be used from any thread that
 * the underlying implementation allows (libibverbs: any; the double: one thread only).
 */
#ifndef KVP_XFER_RDMA_VERBS_OPS_H
#define KVP_XFER_RDMA_VERBS_OPS_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_verbs_ops {
    /* "ibv" (rdma-core) or "fake" (the test double); for logs. */
    const char *name;
    /* Implementation state: NULL for libibverbs, the simulated process for the double. */
    void *impl;

    /* Devices. get_device_list: NULL (errno set; ENOSYS when the kernel has no RDMA support)
     * or a NULL-terminated array of *num devices (num may be 0), freed with free_device_list. */
    struct ibv_device **(*get_device_list)(const struct kvp_verbs_ops *ops, int *num);
    void (*free_device_list)(const struct kvp_verbs_ops *ops, struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    /* GID entry with its type (IBV_GID_TYPE_IB / _ROCE_V1 / _ROCE_V2): ibv_query_gid_ex, inline
     * in the headers. flags must be 0. */
    int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *entry, uint32_t flags);
    int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
    void (*ack_async_event)(struct ibv_async_event *ev);

    /* Protection domains and memory regions. reg_mr: access is a mask of enum ibv_access_flags;
     * REMOTE_WRITE requires LOCAL_WRITE (EINVAL otherwise). reg_dmabuf_mr registers `length`
     * bytes at `offset` of the dma-buf `fd`, addressed by peers as `iova` (same page offset as
     * offset). dereg_mr: after it returns the device can no longer reach the memory. */
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
                                    uint64_t iova, int fd, int access);
    int (*dereg_mr)(struct ibv_mr *mr);

    /* Completion queues and channels. create_cq: at least `cqe` entries (cq->cqe holds the real
     * size, which the transport's credits must not exceed). req_notify_cq arms the CQ once;
     * get_cq_event blocks on the channel's fd unless it is non-blocking. */
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *ch, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
    int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);

    /* Queue pairs (RC only in kvpool). modify_qp applies attr fields named by attr_mask
     * (enum ibv_qp_attr_mask) as in man 3 ibv_modify_qp. destroy_qp discards posted WRs without
     * completions: fence (ERR + drain) first, see rdma_fence.h. */
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *init);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                    struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
};

/**
 * The table over the real libibverbs (verbs_ibv.c). Returns a pointer to an immutable static
 * table; never NULL. Built only when the rdma-core headers and library were found at configure
 * time (KVP_HAVE_VERBS); without them the rdma transport is not compiled at all.
 */
const struct kvp_verbs_ops *kvp_verbs_ops_ibv(void);

#ifdef KVP_FAULT_INJECTION
/**
 * Test builds (KVP_FAULT_INJECTION) only: make kvp_verbs_ops_ibv() return `ops` (the verbs
 * double, tests/lib/fakeverbs_locked.h) from now on, so code that always asks for libibverbs
 * (kvp_client_open with protocol=rdma, kvpool-segment) runs on the double; NULL restores
 * libibverbs. Set it before opening anything that uses RDMA; `ops` must outlive every user.
 */
void kvp_verbs_ops_set_test(const struct kvp_verbs_ops *ops);
#endif

/** What kvp_verbs_probe() found. */
struct kvp_verbs_probe {
    int n_devices;      /* usable devices (>= 0) */
    int list_errno;     /* errno when the device list was NULL, else 0 */
    char first_name[64];/* name of the first device ("" when none) */
};

/**
 * Probe for RDMA devices through `ops`: NULL from get_device_list (this machine: ENOSYS) and a
 * list of 0 devices both mean "no RDMA". Writes what it found into *out (out may be NULL).
 * `who` names the actor for the log. Logs exactly one line: INFO with the device count and the
 * first device's name when devices exist; otherwise one line at `nodev_level` (kvp_log levels:
 * the transport passes WARN when the config asked for rdma, INFO otherwise) saying that RDMA is
 * unavailable and why. Returns KVP_OK when at least one device exists, KVP_ERR_UNSUPPORTED when
 * none, KVP_ERR_INVALID (logged) when ops or who is NULL. Does not block.
 */
int kvp_verbs_probe(const struct kvp_verbs_ops *ops, const char *who, int nodev_level,
                    struct kvp_verbs_probe *out);

#endif
