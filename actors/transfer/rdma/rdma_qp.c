/* rdma_qp.c — RC QP bring-up and RoCE v2 GID selection; see rdma_qp.h. */
#include "actors/transfer/rdma/rdma_qp.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

#define ACTOR "rdma"
#define PSN_MAX 0xffffffu

void kvp_rdma_qp_attrs_default(struct kvp_rdma_qp_attrs *a)
{
    memset(a, 0, sizeof *a);
    a->timeout = 14;
    a->retry_cnt = 7;
    a->rnr_retry = 6;
    a->min_rnr_timer = 12;
    a->max_rd_atomic = 16;
    a->max_send_wr = 256;
    a->max_inline = 64;
}

static bool ipv4_mapped(const union ibv_gid *g)
{
    static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, pre, sizeof pre) == 0;
}

int kvp_rdma_gid_select(const struct kvp_verbs_ops *ops, struct ibv_context *ctx, uint8_t port,
                        int override_index, int *index, union ibv_gid *gid)
{
    if (!ops || !ctx || !index || !gid || port == 0) {
        kvp_log_error(ACTOR, "gid select: bad arguments");
        return KVP_ERR_INVALID;
    }
    struct ibv_port_attr pa;
    int err = ops->query_port(ctx, port, &pa);
    if (err) {
        kvp_log_error(ACTOR, "gid select: query_port %u failed: %s", port, strerror(err));
        return KVP_ERR_IO;
    }
    if (pa.link_layer != IBV_LINK_LAYER_ETHERNET) {
        *index = -1;
        return ops->query_gid(ctx, port, 0, gid) ? KVP_ERR_IO : KVP_OK;
    }
    struct ibv_gid_entry e;
    if (override_index >= 0) {
        if (override_index >= pa.gid_tbl_len ||
            ops->query_gid_ex(ctx, port, (uint32_t)override_index, &e, 0) != 0) {
            kvp_log_error(ACTOR, "gid select: configured gid_index %d is empty or beyond the "
                                 "table (%d entries) of port %u", override_index, pa.gid_tbl_len, port);
            return KVP_ERR_UNSUPPORTED;
        }
        *index = override_index;
        *gid = e.gid;
        return KVP_OK;
    }
    int first_v2 = -1;
    union ibv_gid first_gid;
    memset(&first_gid, 0, sizeof first_gid);
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        if (ops->query_gid_ex(ctx, port, (uint32_t)i, &e, 0) != 0 ||
            e.gid_type != IBV_GID_TYPE_ROCE_V2)
            continue;
        if (ipv4_mapped(&e.gid)) {
            *index = i;
            *gid = e.gid;
            return KVP_OK;
        }
        if (first_v2 < 0) {
            first_v2 = i;
            first_gid = e.gid;
        }
    }
    if (first_v2 < 0) {
        kvp_log_error(ACTOR, "gid select: no suitable GID: port %u has no RoCE v2 entry in its "
                             "%d-entry table (set gid_index to override)", port, pa.gid_tbl_len);
        return KVP_ERR_UNSUPPORTED;
    }
    *index = first_v2;
    *gid = first_gid;
    return KVP_OK;
}

int kvp_rdma_qp_create(const struct kvp_verbs_ops *ops, struct ibv_pd *pd, struct ibv_cq *cq,
                       const struct kvp_rdma_qp_attrs *a, struct ibv_qp **out)
{
    if (!ops || !pd || !cq || !a || !out || a->max_send_wr == 0) {
        kvp_log_error(ACTOR, "qp create: bad arguments");
        return KVP_ERR_INVALID;
    }
    struct ibv_device_attr da;
    int err = ops->query_device(pd->context, &da);
    if (err) {
        kvp_log_error(ACTOR, "qp create: query_device failed: %s", strerror(err));
        return KVP_ERR_IO;
    }
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.qp_type = IBV_QPT_RC;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap.max_send_wr = a->max_send_wr < (uint32_t)da.max_qp_wr ? a->max_send_wr
                                                                   : (uint32_t)da.max_qp_wr;
    ia.cap.max_recv_wr = 1; /* one-sided only: no receive WQEs are ever posted */
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = a->max_inline;
    ia.sq_sig_all = 0; /* every slice WR is signaled by kvp_rdma_post */
    errno = 0;
    *out = ops->create_qp(pd, &ia);
    if (!*out) {
        kvp_log_error(ACTOR, "qp create failed: %s", strerror(errno ? errno : EIO));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

static uint8_t min3(unsigned x, unsigned y, unsigned z)
{
    unsigned m = x < y ? x : y;
    return (uint8_t)(m < z ? m : z);
}

int kvp_rdma_qp_to_rts(const struct kvp_verbs_ops *ops, struct ibv_qp *qp,
                       const struct kvp_rdma_local *local, const struct kvp_rdma_peer *peer,
                       const struct kvp_rdma_qp_attrs *a)
{
    if (!ops || !qp || !local || !local->ctx || !peer || !a || local->port == 0 ||
        a->timeout == 0 || a->timeout > 31 || a->retry_cnt > 7 || a->rnr_retry > 7 ||
        a->max_rd_atomic == 0 || local->psn > PSN_MAX) {
        kvp_log_error(ACTOR, "qp connect: bad local arguments (timeout must be 1..31)");
        return KVP_ERR_INVALID;
    }
    if (peer->qpn == 0 || peer->qpn > PSN_MAX || peer->psn > PSN_MAX || peer->mtu < IBV_MTU_256 ||
        peer->mtu > IBV_MTU_4096 || peer->max_rd_atomic == 0 || peer->max_rd_atomic > 16) {
        kvp_log_warn(ACTOR, "qp connect: peer's handshake out of range (qpn %u, psn %u, mtu %u, "
                            "rd_atomic %u)", peer->qpn, peer->psn, peer->mtu, peer->max_rd_atomic);
        return KVP_ERR_INVALID;
    }
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    int err = ops->query_device(local->ctx, &da);
    if (!err)
        err = ops->query_port(local->ctx, local->port, &pa);
    if (err) {
        kvp_log_error(ACTOR, "qp connect: device/port query failed: %s", strerror(err));
        return KVP_ERR_IO;
    }
    bool roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    if (roce && local->gid_index < 0) {
        kvp_log_error(ACTOR, "qp connect: RoCE port without a GID index");
        return KVP_ERR_INVALID;
    }
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_INIT;
    at.pkey_index = 0;
    at.port_num = local->port;
    at.qp_access_flags = (unsigned)local->access;
    err = ops->modify_qp(qp, &at,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    const char *step = "INIT";
    if (!err) {
        memset(&at, 0, sizeof at);
        at.qp_state = IBV_QPS_RTR;
        unsigned mtu = pa.active_mtu < peer->mtu ? pa.active_mtu : peer->mtu;
        at.path_mtu = (enum ibv_mtu)(mtu < IBV_MTU_4096 ? mtu : IBV_MTU_4096);
        at.dest_qp_num = peer->qpn;
        at.rq_psn = peer->psn;
        at.max_dest_rd_atomic = min3(a->max_rd_atomic, (unsigned)da.max_qp_rd_atom, 16);
        at.min_rnr_timer = a->min_rnr_timer;
        at.ah_attr.port_num = local->port;
        at.ah_attr.dlid = peer->lid;
        if (roce || local->gid_index >= 0) {
            at.ah_attr.is_global = 1;
            at.ah_attr.grh.dgid = peer->gid;
            at.ah_attr.grh.sgid_index = (uint8_t)local->gid_index;
            at.ah_attr.grh.hop_limit = 64;
        }
        step = "RTR";
        err = ops->modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                          IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    }
    if (!err) {
        memset(&at, 0, sizeof at);
        at.qp_state = IBV_QPS_RTS;
        at.sq_psn = local->psn;
        at.timeout = a->timeout;
        at.retry_cnt = a->retry_cnt;
        at.rnr_retry = a->rnr_retry;
        at.max_rd_atomic = min3(a->max_rd_atomic, (unsigned)da.max_qp_init_rd_atom,
                                peer->max_rd_atomic);
        step = "RTS";
        err = ops->modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                          IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                          IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if (err) {
        kvp_log_error(ACTOR, "qp %u connect: modify to %s failed: %s", qp->qp_num, step,
                      strerror(err));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}
