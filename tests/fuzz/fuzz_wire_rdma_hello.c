/* fuzz_wire_rdma_hello.c — libFuzzer target for kvp_rdma_hello_decode() (the RDMA QP handshake,
 * wire/rdma_hello.h): any input either decodes into a hello that passes kvp_rdma_hello_check
 * (every QPN/PSN 24-bit, MTU/rd_atomic/GID/port in range, chunk table contiguous) or is refused
 * with KVP_ERR_MALFORMED / KVP_ERR_VERSION / KVP_ERR_NOMEM and an empty table; a decoded hello
 * re-encodes, decodes to the same fields, and re-encodes to the same bytes; every strict prefix
 * of that encoding is refused. */
#include "kvpool.h"
#include "tests/fuzz/fuzz_common.h"
#include "wire/rdma_hello.h"

unsigned long kvp_fuzz_decoded;

static int same(const struct kvp_rdma_hello *a, const struct kvp_rdma_hello *b)
{
    if (a->version != b->version || a->conn_generation != b->conn_generation ||
        a->segment_id != b->segment_id || a->client_id != b->client_id ||
        strcmp(a->nic, b->nic) != 0 || a->port != b->port || a->lid != b->lid ||
        memcmp(a->gid, b->gid, 16) != 0 || a->gid_index != b->gid_index || a->mtu != b->mtu ||
        a->max_rd_atomic != b->max_rd_atomic || a->status != b->status || a->n_qps != b->n_qps ||
        a->n_chunks != b->n_chunks)
        return 0;
    for (uint32_t i = 0; i < a->n_qps; i++)
        if (a->qps[i].qpn != b->qps[i].qpn || a->qps[i].psn != b->qps[i].psn)
            return 0;
    for (size_t i = 0; i < a->n_chunks; i++)
        if (a->chunks[i].base != b->chunks[i].base || a->chunks[i].len != b->chunks[i].len ||
            a->chunks[i].rkey != b->chunks[i].rkey)
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvp_rdma_hello h, h2;
    char why[160];
    int rc = kvp_rdma_hello_decode(data, size, &h, why, sizeof why);
    if (rc != KVP_OK) {
        FUZZ_CHECK(rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION || rc == KVP_ERR_NOMEM);
        kvp_rdma_hello_free(&h);
        FUZZ_CHECK(h.chunks == NULL && h.n_chunks == 0);
        return 0;
    }
    kvp_fuzz_decoded++;
    FUZZ_CHECK(kvp_rdma_hello_check(&h, NULL, 0) == KVP_OK);
    for (uint32_t i = 0; i < h.n_qps; i++)
        FUZZ_CHECK(h.qps[i].qpn > 0 && h.qps[i].qpn < (1u << 24) && h.qps[i].psn < (1u << 24));
    FUZZ_CHECK(h.mtu >= 1 && h.mtu <= 5 && h.max_rd_atomic >= 1 && h.max_rd_atomic <= 16);
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t l1 = 0, l2 = 0;
    FUZZ_CHECK(kvp_rdma_hello_encode(&h, &b1, &l1) == KVP_OK);
    FUZZ_CHECK(kvp_rdma_hello_decode(b1, l1, &h2, why, sizeof why) == KVP_OK);
    FUZZ_CHECK(same(&h, &h2));
    FUZZ_CHECK(kvp_rdma_hello_encode(&h2, &b2, &l2) == KVP_OK);
    FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    for (size_t cut = 0; cut < l1; cut += 1 + cut / 8) {
        struct kvp_rdma_hello t;
        FUZZ_CHECK(kvp_rdma_hello_decode(b1, cut, &t, NULL, 0) == KVP_ERR_MALFORMED);
        FUZZ_CHECK(t.chunks == NULL);
        kvp_rdma_hello_free(&t);
    }
    free(b1);
    free(b2);
    kvp_rdma_hello_free(&h);
    kvp_rdma_hello_free(&h2);
    return 0;
}
