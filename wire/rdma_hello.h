/*
 * rdma_hello.h — the RDMA queue-pair handshake message (issue 20; ../shared/design/rdma.md §1.1;
 * docs/rdma.md "Handshake"): Kvp__RdmaHello (wire/kvpool.proto) inside the control envelope
 * (wire/envelope.h, id KVP_MSG_RDMA_HELLO), and its checked C form.
 *
 * The bytes come from another process over the network, so kvp_rdma_hello_decode checks every
 * field against what a QP bring-up may take (24-bit QPNs and PSNs, MTU enum, rd_atomic, GID
 * length, port, LID) and the chunk table against what a transfer trusts (ascending,
 * contiguous, non-empty, no wrap, bounded count) before anything else sees it. It never logs
 * (a fuzzer calls it millions of times); on failure it names the first bad field in `why`, and
 * the caller logs that one line.
 *
 * No verbs types here: wire/ does not depend on rdma-core. Pure functions, any thread.
 */
#ifndef KVP_WIRE_RDMA_HELLO_H
#define KVP_WIRE_RDMA_HELLO_H

#include <stddef.h>
#include <stdint.h>

#define KVP_RDMA_HELLO_VERSION 1u
#define KVP_RDMA_HELLO_MAX_QPS 16u        /* rdma_qps_per_peer's upper bound */
#define KVP_RDMA_HELLO_MAX_CHUNKS 65536u  /* 256 TiB at 4 GiB chunks; 256 MiB at 4 KiB */
#define KVP_RDMA_HELLO_NIC_BYTES 64u      /* IBV_SYSFS_NAME_MAX */
/* RdmaHello.client_id of a client's transfer actors: the client's id in the high 32 bits, a
 * random non-zero low half per actor. This mask selects them all (PutRevokeReq.writer_mask,
 * WriterSelector; docs/rdma.md "Per-writer fence"). */
#define KVP_RDMA_WRITER_FAMILY_MASK 0xffffffff00000000ull

struct kvp_rdma_hello_qp {
    uint32_t qpn;   /* 1 .. 2^24-1 */
    uint32_t psn;   /* 0 .. 2^24-1 */
};

struct kvp_rdma_hello_chunk {
    uint64_t base;  /* iova of the first byte */
    uint64_t len;   /* > 0 */
    uint32_t rkey;
};

struct kvp_rdma_hello {
    uint32_t version;            /* KVP_RDMA_HELLO_VERSION (set by encode when 0) */
    uint64_t conn_generation;    /* >= 1 */
    uint32_t segment_id;
    uint64_t client_id;
    char nic[KVP_RDMA_HELLO_NIC_BYTES]; /* NUL-terminated, printable ASCII */
    uint8_t port;                /* 1..255 */
    uint16_t lid;
    uint8_t gid[16];
    int32_t gid_index;           /* -1 .. 255 */
    uint8_t mtu;                 /* enum ibv_mtu 1..5 */
    uint8_t max_rd_atomic;       /* 1..16 */
    uint32_t n_qps;              /* 1..KVP_RDMA_HELLO_MAX_QPS */
    struct kvp_rdma_hello_qp qps[KVP_RDMA_HELLO_MAX_QPS];
    size_t n_chunks;             /* 0..KVP_RDMA_HELLO_MAX_CHUNKS */
    struct kvp_rdma_hello_chunk *chunks; /* n_chunks; owned by the struct after decode */
    int32_t status;              /* 0 or a negative kvp_err */
};

/**
 * Check h as decode would (also before encoding our own). Returns KVP_OK, or KVP_ERR_MALFORMED
 * with the first bad field named in why (capacity why_cap; may be NULL).
 */
int kvp_rdma_hello_check(const struct kvp_rdma_hello *h, char *why, size_t why_cap);

/**
 * Encode h (checked first) with its envelope into a new malloc'd buffer (*out, caller frees).
 * Errors: KVP_ERR_INVALID (NULL arguments, or h fails kvp_rdma_hello_check), KVP_ERR_NOMEM,
 * KVP_ERR_TOO_LARGE.
 */
int kvp_rdma_hello_encode(const struct kvp_rdma_hello *h, uint8_t **out, size_t *out_len);

/**
 * Decode and check [buf, buf+len) into *out (zeroed first; free with kvp_rdma_hello_free even
 * on error). Errors: KVP_ERR_MALFORMED (envelope, protobuf or any field out of range: why says
 * which), KVP_ERR_VERSION (the envelope's version, or a hello version other than ours),
 * KVP_ERR_NOMEM, KVP_ERR_INVALID (NULL out).
 */
int kvp_rdma_hello_decode(const uint8_t *buf, size_t len, struct kvp_rdma_hello *out, char *why,
                          size_t why_cap);

/** Free what decode allocated (the chunk table) and zero the table fields. h may be NULL. */
void kvp_rdma_hello_free(struct kvp_rdma_hello *h);

#endif
