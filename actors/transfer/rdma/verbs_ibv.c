/*
 * verbs_ibv.c — kvp_verbs_ops over the real libibverbs (see verbs_ops.h).
 *
 * Each wrapper is one call: the inline verbs (post_send, poll_cq, req_notify_cq) and the macros
 * (ibv_query_port, ibv_reg_mr) are expanded here, once, against the installed rdma-core headers;
 * the rest are plain pointers to the library functions where the signatures already match.
 */
#include "actors/transfer/rdma/verbs_ops.h"

#include <stdatomic.h>

static struct ibv_device **ibv_w_get_device_list(const struct kvp_verbs_ops *ops, int *num)
{
    (void)ops;
    return ibv_get_device_list(num);
}

static void ibv_w_free_device_list(const struct kvp_verbs_ops *ops, struct ibv_device **list)
{
    (void)ops;
    ibv_free_device_list(list);
}

static const char *ibv_w_get_device_name(struct ibv_device *dev)
{
    return ibv_get_device_name(dev);
}

static int ibv_w_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
    return ibv_query_port(ctx, port, attr);
}

static struct ibv_mr *ibv_w_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr(pd, addr, length, access);
}

static int ibv_w_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    return ibv_poll_cq(cq, num_entries, wc);
}

static int ibv_w_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return ibv_req_notify_cq(cq, solicited_only);
}

static int ibv_w_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    return ibv_post_send(qp, wr, bad_wr);
}

static int ibv_w_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    return ibv_post_recv(qp, wr, bad_wr);
}

static int ibv_w_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    return ibv_query_gid(ctx, port, index, gid);
}

static int ibv_w_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                              struct ibv_gid_entry *entry, uint32_t flags)
{
    return ibv_query_gid_ex(ctx, port, index, entry, flags);
}

static const struct kvp_verbs_ops ibv_ops = {
    .name = "ibv",
    .impl = NULL,
    .get_device_list = ibv_w_get_device_list,
    .free_device_list = ibv_w_free_device_list,
    .get_device_name = ibv_w_get_device_name,
    .open_device = ibv_open_device,
    .close_device = ibv_close_device,
    .query_device = ibv_query_device,
    .query_port = ibv_w_query_port,
    .query_gid = ibv_w_query_gid,
    .query_gid_ex = ibv_w_query_gid_ex,
    .get_async_event = ibv_get_async_event,
    .ack_async_event = ibv_ack_async_event,
    .alloc_pd = ibv_alloc_pd,
    .dealloc_pd = ibv_dealloc_pd,
    .reg_mr = ibv_w_reg_mr,
    .reg_dmabuf_mr = ibv_reg_dmabuf_mr,
    .dereg_mr = ibv_dereg_mr,
    .create_comp_channel = ibv_create_comp_channel,
    .destroy_comp_channel = ibv_destroy_comp_channel,
    .create_cq = ibv_create_cq,
    .destroy_cq = ibv_destroy_cq,
    .poll_cq = ibv_w_poll_cq,
    .req_notify_cq = ibv_w_req_notify_cq,
    .get_cq_event = ibv_get_cq_event,
    .ack_cq_events = ibv_ack_cq_events,
    .create_qp = ibv_create_qp,
    .modify_qp = ibv_modify_qp,
    .query_qp = ibv_query_qp,
    .destroy_qp = ibv_destroy_qp,
    .post_send = ibv_w_post_send,
    .post_recv = ibv_w_post_recv,
};

#ifdef KVP_FAULT_INJECTION
/* Test builds only: the table a test installed in place of libibverbs (kvp_verbs_ops_set_test).
 * Atomic rather than a message: it is read once by each transport open, from whichever actor
 * opens one (client open, segment open), and set once by the test before any of them exists;
 * there is no actor that owns "which verbs library this process uses". */
static _Atomic(const struct kvp_verbs_ops *) g_test_ops;

void kvp_verbs_ops_set_test(const struct kvp_verbs_ops *ops)
{
    atomic_store(&g_test_ops, ops);
}
#endif

const struct kvp_verbs_ops *kvp_verbs_ops_ibv(void)
{
#ifdef KVP_FAULT_INJECTION
    const struct kvp_verbs_ops *t = atomic_load(&g_test_ops);
    if (t)
        return t;
#endif
    return &ibv_ops;
}
