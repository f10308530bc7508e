/* rdma_hello.c — see rdma_hello.h. */
#include "wire/rdma_hello.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "wire/envelope.h"

#define U24 (1u << 24)

static int bad(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t cap, const char *fmt, ...)
{
    if (why && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return KVP_ERR_MALFORMED;
}

int kvp_rdma_hello_check(const struct kvp_rdma_hello *h, char *why, size_t why_cap)
{
    if (!h)
        return bad(why, why_cap, "no message");
    if (h->conn_generation == 0)
        return bad(why, why_cap, "conn_generation 0");
    size_t nl = strnlen(h->nic, sizeof h->nic);
    if (nl == sizeof h->nic)
        return bad(why, why_cap, "nic name not terminated");
    for (size_t i = 0; i < nl; i++)
        if (h->nic[i] < 0x21 || h->nic[i] > 0x7e)
            return bad(why, why_cap, "nic name byte %zu not printable", i);
    if (h->port == 0)
        return bad(why, why_cap, "port 0");
    if (h->gid_index < -1 || h->gid_index > 255)
        return bad(why, why_cap, "gid_index %d out of [-1, 255]", (int)h->gid_index);
    if (h->mtu < 1 || h->mtu > 5)
        return bad(why, why_cap, "mtu %u out of [1, 5]", (unsigned)h->mtu);
    if (h->max_rd_atomic < 1 || h->max_rd_atomic > 16)
        return bad(why, why_cap, "max_rd_atomic %u out of [1, 16]", (unsigned)h->max_rd_atomic);
    if (h->status > 0)
        return bad(why, why_cap, "status %d positive", (int)h->status);
    /* A refusal (status < 0) carries no QPs; an offer or acceptance carries 1..16. */
    if (h->status == 0 && (h->n_qps < 1 || h->n_qps > KVP_RDMA_HELLO_MAX_QPS))
        return bad(why, why_cap, "%u QPs, want 1..%u", h->n_qps, KVP_RDMA_HELLO_MAX_QPS);
    if (h->n_qps > KVP_RDMA_HELLO_MAX_QPS)
        return bad(why, why_cap, "%u QPs, want at most %u", h->n_qps, KVP_RDMA_HELLO_MAX_QPS);
    for (uint32_t i = 0; i < h->n_qps; i++) {
        if (h->qps[i].qpn == 0 || h->qps[i].qpn >= U24)
            return bad(why, why_cap, "qp %u: qpn %u not 24-bit non-zero", i, h->qps[i].qpn);
        if (h->qps[i].psn >= U24)
            return bad(why, why_cap, "qp %u: psn %u not 24-bit", i, h->qps[i].psn);
    }
    if (h->n_chunks > KVP_RDMA_HELLO_MAX_CHUNKS)
        return bad(why, why_cap, "%zu chunks, at most %u", h->n_chunks, KVP_RDMA_HELLO_MAX_CHUNKS);
    if (h->n_chunks && !h->chunks)
        return bad(why, why_cap, "chunk table missing");
    for (size_t i = 0; i < h->n_chunks; i++) {
        const struct kvp_rdma_hello_chunk *c = &h->chunks[i];
        if (c->len == 0)
            return bad(why, why_cap, "chunk %zu empty", i);
        if (c->base + c->len < c->base)
            return bad(why, why_cap, "chunk %zu wraps the address space", i);
        if (i && c->base != h->chunks[i - 1].base + h->chunks[i - 1].len)
            return bad(why, why_cap, "chunk %zu does not follow chunk %zu", i, i - 1);
    }
    return KVP_OK;
}

int kvp_rdma_hello_encode(const struct kvp_rdma_hello *h, uint8_t **out, size_t *out_len)
{
    if (!h || !out || !out_len || kvp_rdma_hello_check(h, NULL, 0) != KVP_OK)
        return KVP_ERR_INVALID;
    Kvp__RdmaHello m = KVP__RDMA_HELLO__INIT;
    Kvp__RdmaQp qv[KVP_RDMA_HELLO_MAX_QPS], *qp[KVP_RDMA_HELLO_MAX_QPS];
    m.version = h->version ? h->version : KVP_RDMA_HELLO_VERSION;
    m.conn_generation = h->conn_generation;
    m.segment_id = h->segment_id;
    m.client_id = h->client_id;
    m.nic = (char *)h->nic;
    m.port = h->port;
    m.lid = h->lid;
    m.gid.data = (uint8_t *)h->gid;
    m.gid.len = sizeof h->gid;
    m.gid_index = h->gid_index;
    m.mtu = h->mtu;
    m.max_rd_atomic = h->max_rd_atomic;
    m.status = h->status;
    for (uint32_t i = 0; i < h->n_qps; i++) {
        kvp__rdma_qp__init(&qv[i]);
        qv[i].qpn = h->qps[i].qpn;
        qv[i].psn = h->qps[i].psn;
        qp[i] = &qv[i];
    }
    m.n_qps = h->n_qps;
    m.qps = qp;
    Kvp__RdmaChunk *cv = NULL, **cp = NULL;
    if (h->n_chunks) {
        cv = calloc(h->n_chunks, sizeof *cv);
        cp = calloc(h->n_chunks, sizeof *cp);
        if (!cv || !cp) {
            free(cv);
            free(cp);
            return KVP_ERR_NOMEM;
        }
        for (size_t i = 0; i < h->n_chunks; i++) {
            kvp__rdma_chunk__init(&cv[i]);
            cv[i].addr = h->chunks[i].base;
            cv[i].len = h->chunks[i].len;
            cv[i].rkey = h->chunks[i].rkey;
            cp[i] = &cv[i];
        }
    }
    m.n_chunks = h->n_chunks;
    m.chunks = cp;
    int rc = kvp_wire_encode(KVP_MSG_RDMA_HELLO, (const ProtobufCMessage *)&m, out, out_len);
    free(cv);
    free(cp);
    return rc;
}

int kvp_rdma_hello_decode(const uint8_t *buf, size_t len, struct kvp_rdma_hello *out, char *why,
                          size_t why_cap)
{
    if (!out)
        return KVP_ERR_INVALID;
    memset(out, 0, sizeof *out);
    Kvp__RdmaHello *m = NULL;
    int rc = kvp_wire_decode(KVP_MSG_RDMA_HELLO, buf, len, (ProtobufCMessage **)&m);
    if (rc != KVP_OK) {
        bad(why, why_cap, "envelope or protobuf body refused");
        return rc == KVP_ERR_VERSION ? rc : KVP_ERR_MALFORMED;
    }
    if (m->version != KVP_RDMA_HELLO_VERSION) {
        bad(why, why_cap, "hello version %u, this build speaks %u", m->version, KVP_RDMA_HELLO_VERSION);
        rc = KVP_ERR_VERSION;
        goto done;
    }
    rc = KVP_ERR_MALFORMED;
    /* Field widths first: the C struct is narrower than protobuf's uint32. */
    if (m->port > 255 || m->lid > 0xffff || m->mtu > 255 || m->max_rd_atomic > 255) {
        bad(why, why_cap, "port/lid/mtu/max_rd_atomic wider than its field");
        goto done;
    }
    if (m->gid.len != sizeof out->gid) {
        bad(why, why_cap, "gid of %zu bytes, want 16", m->gid.len);
        goto done;
    }
    size_t nl = m->nic ? strlen(m->nic) : 0;
    if (nl >= sizeof out->nic) {
        bad(why, why_cap, "nic name of %zu bytes, at most %u", nl, KVP_RDMA_HELLO_NIC_BYTES - 1);
        goto done;
    }
    if (m->n_qps > KVP_RDMA_HELLO_MAX_QPS) {
        bad(why, why_cap, "%zu QPs, at most %u", m->n_qps, KVP_RDMA_HELLO_MAX_QPS);
        goto done;
    }
    if (m->n_chunks > KVP_RDMA_HELLO_MAX_CHUNKS) {
        bad(why, why_cap, "%zu chunks, at most %u", m->n_chunks, KVP_RDMA_HELLO_MAX_CHUNKS);
        goto done;
    }
    out->version = m->version;
    out->conn_generation = m->conn_generation;
    out->segment_id = m->segment_id;
    out->client_id = m->client_id;
    if (nl)
        memcpy(out->nic, m->nic, nl);
    out->port = (uint8_t)m->port;
    out->lid = (uint16_t)m->lid;
    memcpy(out->gid, m->gid.data, sizeof out->gid);
    out->gid_index = m->gid_index;
    out->mtu = (uint8_t)m->mtu;
    out->max_rd_atomic = (uint8_t)m->max_rd_atomic;
    out->status = m->status;
    out->n_qps = (uint32_t)m->n_qps;
    for (size_t i = 0; i < m->n_qps; i++) {
        out->qps[i].qpn = m->qps[i]->qpn;
        out->qps[i].psn = m->qps[i]->psn;
    }
    if (m->n_chunks) {
        out->chunks = calloc(m->n_chunks, sizeof *out->chunks);
        if (!out->chunks) {
            rc = KVP_ERR_NOMEM;
            goto done;
        }
        out->n_chunks = m->n_chunks;
        for (size_t i = 0; i < m->n_chunks; i++) {
            out->chunks[i].base = m->chunks[i]->addr;
            out->chunks[i].len = m->chunks[i]->len;
            out->chunks[i].rkey = m->chunks[i]->rkey;
        }
    }
    rc = kvp_rdma_hello_check(out, why, why_cap);
done:
    protobuf_c_message_free_unpacked((ProtobufCMessage *)m, NULL);
    return rc;
}

void kvp_rdma_hello_free(struct kvp_rdma_hello *h)
{
    if (!h)
        return;
    free(h->chunks);
    h->chunks = NULL;
    h->n_chunks = 0;
}
