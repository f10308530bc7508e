/* fv_conn.c — see fv_conn.h. */
#ifdef KVP_HAVE_VERBS

#include "tests/lib/fv_conn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/fakeverbs.h"

int fv_end_open(const struct kvp_verbs_ops *ops, int dev, int cqe, struct fv_end *e)
{
    memset(e, 0, sizeof *e);
    e->ops = ops;
    int num = 0;
    struct ibv_device **l = ops->get_device_list(ops, &num);
    if (!l)
        return errno ? errno : ENODEV;
    if (dev >= num) {
        ops->free_device_list(ops, l);
        return ENODEV;
    }
    e->ctx = ops->open_device(l[dev]);
    ops->free_device_list(ops, l);
    if (!e->ctx)
        return errno;
    e->pd = ops->alloc_pd(e->ctx);
    if (!e->pd)
        return errno;
    e->cq = ops->create_cq(e->ctx, cqe, NULL, NULL, 0);
    if (!e->cq)
        return errno;
    int rc = ops->query_gid(e->ctx, 1, 1, &e->gid);
    if (rc)
        return rc;
    struct ibv_port_attr pa;
    rc = ops->query_port(e->ctx, 1, &pa);
    if (rc)
        return rc;
    e->lid = pa.lid;
    return 0;
}

void fv_end_close(struct fv_end *e)
{
    if (e->cq)
        e->ops->destroy_cq(e->cq);
    if (e->pd)
        e->ops->dealloc_pd(e->pd);
    if (e->ctx)
        e->ops->close_device(e->ctx);
    memset(e, 0, sizeof *e);
}

static int to_init(struct fv_end *e, struct ibv_qp *qp, int access)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = (unsigned)access;
    return e->ops->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct fv_end *e, struct ibv_qp *qp, const struct fv_end *peer, uint32_t dqpn,
                  uint32_t rq_psn)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = dqpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.dlid = peer->lid;
    a.ah_attr.port_num = 1;
    return e->ops->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                         IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct fv_end *e, struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout,
                  uint8_t retry)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = timeout;
    a.retry_cnt = retry;
    a.rnr_retry = 6;
    a.max_rd_atomic = 16;
    return e->ops->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                         IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_MAX_QP_RD_ATOMIC);
}

int fv_connect(struct fv_end *a, struct fv_end *b, const struct fv_qp_params *p,
               struct ibv_qp **qa, struct ibv_qp **qb)
{
    struct fv_qp_params d;
    memset(&d, 0, sizeof d);
    if (p)
        d = *p;
    else
        d.access_b = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    if (!d.max_send_wr)
        d.max_send_wr = 256;
    if (!d.timeout && !d.timeout_zero)
        d.timeout = 14;
    if (!d.retry_cnt)
        d.retry_cnt = 7;
    d.psn_a &= 0xffffff;
    d.psn_b &= 0xffffff;
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = d.max_send_wr;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = 64;
    ia.send_cq = ia.recv_cq = a->cq;
    *qa = a->ops->create_qp(a->pd, &ia);
    if (!*qa)
        return errno;
    ia.send_cq = ia.recv_cq = b->cq;
    *qb = b->ops->create_qp(b->pd, &ia);
    if (!*qb)
        return errno;
    int rc;
    if ((rc = to_init(a, *qa, d.access_a)) || (rc = to_init(b, *qb, d.access_b)))
        return rc;
    if ((rc = to_rtr(a, *qa, b, (*qb)->qp_num, d.psn_b)) ||
        (rc = to_rtr(b, *qb, a, (*qa)->qp_num, d.psn_a)))
        return rc;
    if ((rc = to_rts(a, *qa, d.psn_a, d.timeout, d.retry_cnt)) ||
        (rc = to_rts(b, *qb, d.psn_b, d.timeout, d.retry_cnt)))
        return rc;
    return 0;
}

void fv_wr(struct ibv_send_wr *wr, struct ibv_sge *sge, enum ibv_wr_opcode op, uint64_t wr_id,
           void *local, uint32_t len, uint32_t lkey, uint64_t remote, uint32_t rkey)
{
    memset(wr, 0, sizeof *wr);
    memset(sge, 0, sizeof *sge);
    sge->addr = (uint64_t)(uintptr_t)local;
    sge->length = len;
    sge->lkey = lkey;
    wr->wr_id = wr_id;
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->opcode = op;
    wr->send_flags = IBV_SEND_SIGNALED;
    wr->wr.rdma.remote_addr = remote;
    wr->wr.rdma.rkey = rkey;
}

int fv_pair_up(struct fv_pair *x, const struct fv_config *fc, int flush_a,
               const struct fv_qp_params *p, size_t buf_len, size_t seg_len, int cqe)
{
    memset(x, 0, sizeof *x);
    int rc = fv_fabric_new(&x->f, fc);
    if (rc)
        return rc;
    struct fv_node_config ca = {.name = "client", .n_devices = 1, .flush = flush_a};
    struct fv_node_config cb = {.name = "segment", .n_devices = 1};
    if ((rc = fv_node_add(x->f, &ca, &x->na)) || (rc = fv_node_add(x->f, &cb, &x->nb)))
        return rc;
    if ((rc = fv_end_open(fv_node_ops(x->na), 0, cqe, &x->a)) ||
        (rc = fv_end_open(fv_node_ops(x->nb), 0, cqe, &x->b)))
        return rc;
    if ((rc = fv_connect(&x->a, &x->b, p, &x->qa, &x->qb)))
        return rc;
    x->buf_len = buf_len;
    x->seg_len = seg_len;
    x->buf = malloc(buf_len);
    x->seg = malloc(seg_len);
    if (!x->buf || !x->seg)
        return ENOMEM;
    for (size_t i = 0; i < buf_len; i++)
        x->buf[i] = (uint8_t)i;
    for (size_t i = 0; i < seg_len; i++)
        x->seg[i] = (uint8_t)(0x5a ^ (i * 7));
    x->buf_mr = x->a.ops->reg_mr(x->a.pd, x->buf, buf_len, IBV_ACCESS_LOCAL_WRITE);
    if (!x->buf_mr)
        return errno;
    x->seg_mr = x->b.ops->reg_mr(x->b.pd, x->seg, seg_len,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                     IBV_ACCESS_REMOTE_WRITE);
    if (!x->seg_mr)
        return errno;
    return 0;
}

void fv_pair_down(struct fv_pair *x)
{
    fv_fabric_destroy(&x->f);
    free(x->buf);
    free(x->seg);
    memset(x, 0, sizeof *x);
}

#else
typedef int kvp_fv_conn_unused;
#endif
