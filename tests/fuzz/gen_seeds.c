/* gen_seeds.c — writes the seed corpus of the wire fuzz targets:
 *   kvp-fuzz-gen-seeds DIR  →  DIR/<target>/seed-<n>.bin
 * The committed corpus under tests/fuzz/corpus/ was produced by this program; rerun it after
 * a schema change (and commit the result). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvpool.h"
#include "wire/envelope.h"
#include "wire/rdma_hello.h"

static const char *g_dir;

static void put(const char *target, int n, const uint8_t *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", g_dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/seed-%d.bin", g_dir, target, n);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

#define EMIT(target, n, enc, msg)                                                                  \
    do {                                                                                           \
        uint8_t *b_ = NULL;                                                                        \
        size_t l_ = 0;                                                                             \
        if (enc(msg, &b_, &l_) != KVP_OK) {                                                        \
            fprintf(stderr, "encode %s seed %d failed\n", target, n);                              \
            exit(1);                                                                               \
        }                                                                                          \
        put(target, n, b_, l_);                                                                    \
        free(b_);                                                                                  \
    } while (0)

static void requests(void)
{
    const char *t = "fuzz_wire_request";
    Kvp__MountSegmentReq mount = KVP__MOUNT_SEGMENT_REQ__INIT;
    mount.name = "seg-host-7001";
    mount.host = "host-a";
    mount.endpoint = "127.0.0.1:7001";
    mount.size = 1ull << 30;
    mount.owner_pid = 4242;
    Kvp__Request r = KVP__REQUEST__INIT;
    r.req_id = 1;
    r.timeout_ms = 5000;
    r.body_case = KVP__REQUEST__BODY_MOUNT;
    r.mount = &mount;
    EMIT(t, 1, kvp_wire_encode_request, &r);

    Kvp__PutStartItem it1 = KVP__PUT_START_ITEM__INIT, it2 = KVP__PUT_START_ITEM__INIT;
    it1.key = "prefix/block/0001";
    it1.size = 262144;
    it1.replica_num = 2;
    it1.op_id = 77;
    it1.client_host = "host-b";
    it2.key = "prefix/block/0002";
    it2.size = 1;
    it2.soft_pin = 1;
    it2.preferred_segment = "seg-host-7001";
    it2.op_id = 78;
    Kvp__PutStartItem *items[] = {&it1, &it2};
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    ps.n_items = 2;
    ps.items = items;
    ps.ttl_ms = 30000;
    Kvp__Request r2 = KVP__REQUEST__INIT;
    r2.req_id = 2;
    r2.body_case = KVP__REQUEST__BODY_PUT_START;
    r2.put_start = &ps;
    EMIT(t, 2, kvp_wire_encode_request, &r2);

    char *keys[] = {"k1", "k2", "a/much/longer/key/with/parts"};
    Kvp__GetReplicaListReq gr = KVP__GET_REPLICA_LIST_REQ__INIT;
    gr.n_keys = 3;
    gr.keys = keys;
    gr.client_host = "host-b";
    Kvp__Request r3 = KVP__REQUEST__INIT;
    r3.req_id = 3;
    r3.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    r3.get_replicas = &gr;
    EMIT(t, 3, kvp_wire_encode_request, &r3);

    Kvp__RemoveReq rm = KVP__REMOVE_REQ__INIT;
    rm.n_keys = 2;
    rm.keys = keys;
    rm.force = 1;
    Kvp__Request r4 = KVP__REQUEST__INIT;
    r4.req_id = 4;
    r4.body_case = KVP__REQUEST__BODY_REMOVE;
    r4.remove = &rm;
    EMIT(t, 4, kvp_wire_encode_request, &r4);

    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    Kvp__Request r5 = KVP__REQUEST__INIT;
    r5.req_id = 5;
    r5.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    r5.cluster_status = &cs;
    EMIT(t, 5, kvp_wire_encode_request, &r5);

    Kvp__Member mem = KVP__MEMBER__INIT;
    mem.id = 4;
    mem.address = "tcp://127.0.0.1:7104";
    mem.raft_address = "127.0.0.1:7204";
    mem.role = 1;
    Kvp__AddMemberReq am = KVP__ADD_MEMBER_REQ__INIT;
    am.member = &mem;
    Kvp__Request r6 = KVP__REQUEST__INIT;
    r6.req_id = 6;
    r6.body_case = KVP__REQUEST__BODY_ADD_MEMBER;
    r6.add_member = &am;
    EMIT(t, 6, kvp_wire_encode_request, &r6);

    /* an RDMA segment's heartbeat answering FenceWriter 41 (docs/rdma.md "FenceWriter and Fenced") */
    Kvp__Fenced fd = KVP__FENCED__INIT;
    fd.seq = 41;
    fd.qps_fenced = 4;
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    hb.segment_id = 3;
    hb.rdma_writers = 1;
    hb.fenced = &fd;
    Kvp__Request r7 = KVP__REQUEST__INIT;
    r7.req_id = 7;
    r7.timeout_ms = 1000;
    r7.body_case = KVP__REQUEST__BODY_HEARTBEAT;
    r7.heartbeat = &hb;
    EMIT(t, 7, kvp_wire_encode_request, &r7);

    /* a PutRevoke naming the client's RDMA writers (per-writer fence, docs/rdma.md) */
    Kvp__PutRevokeItem pri = KVP__PUT_REVOKE_ITEM__INIT;
    pri.key = "layer0/blk7";
    pri.op_id = 0x1234567800000009ull;
    Kvp__PutRevokeItem *prip[] = {&pri};
    Kvp__PutRevokeReq prr = KVP__PUT_REVOKE_REQ__INIT;
    prr.n_items = 1;
    prr.items = prip;
    prr.writer_id = 0x1234567800000000ull;
    prr.writer_mask = KVP_RDMA_WRITER_FAMILY_MASK;
    Kvp__Request r8 = KVP__REQUEST__INIT;
    r8.req_id = 8;
    r8.timeout_ms = 1000;
    r8.body_case = KVP__REQUEST__BODY_PUT_REVOKE;
    r8.put_revoke = &prr;
    EMIT(t, 8, kvp_wire_encode_request, &r8);

    /* a segment that runs FenceWriter.writers says so */
    hb.fence_selectors = 1;
    r7.req_id = 9;
    EMIT(t, 9, kvp_wire_encode_request, &r7);
}

static void responses(void)
{
    const char *t = "fuzz_wire_response";
    Kvp__MountSegmentResp mr = KVP__MOUNT_SEGMENT_RESP__INIT;
    mr.segment_id = 3;
    Kvp__Response r = KVP__RESPONSE__INIT;
    r.req_id = 1;
    r.body_case = KVP__RESPONSE__BODY_MOUNT;
    r.mount = &mr;
    EMIT(t, 1, kvp_wire_encode_response, &r);

    Kvp__Replica rep1 = KVP__REPLICA__INIT, rep2 = KVP__REPLICA__INIT;
    rep1.segment_id = 3;
    rep1.offset = 4096;
    rep1.endpoint = "127.0.0.1:7001";
    rep1.host = "host-a";
    rep1.owner_pid = 4242;
    rep2.segment_id = 5;
    rep2.offset = 0;
    rep2.endpoint = "[::1]:7002";
    rep2.host = "host-c";
    Kvp__Replica *reps[] = {&rep1, &rep2};
    Kvp__PutStartResult res1 = KVP__PUT_START_RESULT__INIT, res2 = KVP__PUT_START_RESULT__INIT;
    res1.n_replicas = 2;
    res1.replicas = reps;
    res2.status = KVP_ERR_EXISTS;
    Kvp__PutStartResult *results[] = {&res1, &res2};
    Kvp__PutStartResp psr = KVP__PUT_START_RESP__INIT;
    psr.n_results = 2;
    psr.results = results;
    Kvp__Response r2 = KVP__RESPONSE__INIT;
    r2.req_id = 2;
    r2.body_case = KVP__RESPONSE__BODY_PUT_START;
    r2.put_start = &psr;
    EMIT(t, 2, kvp_wire_encode_response, &r2);

    Kvp__ObjectInfo oi1 = KVP__OBJECT_INFO__INIT, oi2 = KVP__OBJECT_INFO__INIT;
    oi1.size = 262144;
    oi1.checksum = 0x0123456789abcdefull;
    oi1.n_replicas = 2;
    oi1.replicas = reps;
    oi1.lease_ttl_ms = 5000;
    oi2.status = KVP_ERR_NOT_FOUND;
    Kvp__ObjectInfo *objs[] = {&oi1, &oi2};
    Kvp__GetReplicaListResp gr = KVP__GET_REPLICA_LIST_RESP__INIT;
    gr.n_objects = 2;
    gr.objects = objs;
    Kvp__Response r3 = KVP__RESPONSE__INIT;
    r3.req_id = 3;
    r3.body_case = KVP__RESPONSE__BODY_GET_REPLICAS;
    r3.get_replicas = &gr;
    EMIT(t, 3, kvp_wire_encode_response, &r3);

    Kvp__Response r4 = KVP__RESPONSE__INIT;
    r4.req_id = 4;
    r4.status = KVP_ERR_NOT_LEADER;
    r4.error = "not the leader";
    r4.leader_hint = "127.0.0.1:7102";
    EMIT(t, 4, kvp_wire_encode_response, &r4);

    Kvp__Member m1 = KVP__MEMBER__INIT, m2 = KVP__MEMBER__INIT;
    m1.id = 1;
    m1.address = "tcp://127.0.0.1:7101";
    m1.raft_address = "127.0.0.1:7201";
    m2.id = 2;
    m2.address = "tcp://127.0.0.1:7102";
    m2.raft_address = "127.0.0.1:7202";
    m2.role = 2;
    Kvp__Member *ms[] = {&m1, &m2};
    Kvp__MembersResp mresp = KVP__MEMBERS_RESP__INIT;
    mresp.n_members = 2;
    mresp.members = ms;
    mresp.leader_id = 1;
    mresp.term = 7;
    Kvp__Response r5 = KVP__RESPONSE__INIT;
    r5.req_id = 5;
    r5.body_case = KVP__RESPONSE__BODY_MEMBERS;
    r5.members = &mresp;
    EMIT(t, 5, kvp_wire_encode_response, &r5);

    int64_t sizes[] = {262144, KVP_ERR_NOT_FOUND, 1};
    Kvp__GetSizeResp gs = KVP__GET_SIZE_RESP__INIT;
    gs.n_sizes = 3;
    gs.sizes = sizes;
    Kvp__Response r6 = KVP__RESPONSE__INIT;
    r6.req_id = 6;
    r6.body_case = KVP__RESPONSE__BODY_GET_SIZE;
    r6.get_size = &gs;
    EMIT(t, 6, kvp_wire_encode_response, &r6);

    /* the leader asking that segment to fence every writer (FenceWriter 42) */
    Kvp__FenceWriter fw = KVP__FENCE_WRITER__INIT;
    fw.seq = 42;
    Kvp__HeartbeatResp hb = KVP__HEARTBEAT_RESP__INIT;
    hb.state = KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
    hb.fence_writer = &fw;
    Kvp__Response r7 = KVP__RESPONSE__INIT;
    r7.req_id = 7;
    r7.body_case = KVP__RESPONSE__BODY_HEARTBEAT;
    r7.heartbeat = &hb;
    EMIT(t, 7, kvp_wire_encode_response, &r7);

    /* ... and to fence only two clients' writers (per-writer fence, FenceWriter.writers) */
    Kvp__WriterSelector ws[2] = {KVP__WRITER_SELECTOR__INIT, KVP__WRITER_SELECTOR__INIT};
    ws[0].client_id = 0x1234567800000000ull;
    ws[0].mask = KVP_RDMA_WRITER_FAMILY_MASK;
    ws[1].client_id = 0x9abcdef000000000ull;
    ws[1].mask = KVP_RDMA_WRITER_FAMILY_MASK;
    Kvp__WriterSelector *wsp[] = {&ws[0], &ws[1]};
    fw.seq = 43;
    fw.n_writers = 2;
    fw.writers = wsp;
    r7.req_id = 8;
    EMIT(t, 8, kvp_wire_encode_response, &r7);
}

static void batches(void)
{
    const char *t = "fuzz_wire_command_batch";
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT;
    it.key = "prefix/block/0001";
    it.size = 4096;
    it.replica_num = 1;
    it.op_id = 9;
    Kvp__PutStartItem *items[] = {&it};
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    ps.n_items = 1;
    ps.items = items;
    Kvp__PutEndItem pe1 = KVP__PUT_END_ITEM__INIT;
    pe1.key = "prefix/block/0001";
    pe1.op_id = 9;
    pe1.checksum = 0xfeedfacecafebeefull;
    Kvp__PutEndItem *pes[] = {&pe1};
    Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
    pe.n_items = 1;
    pe.items = pes;
    Kvp__SegmentLostCmd sl = KVP__SEGMENT_LOST_CMD__INIT;
    sl.segment_id = 2;
    Kvp__Command c1 = KVP__COMMAND__INIT, c2 = KVP__COMMAND__INIT, c3 = KVP__COMMAND__INIT;
    c1.now_wall_ms = 1796000000000ull;
    c1.term = 3;
    c1.body_case = KVP__COMMAND__BODY_PUT_START;
    c1.put_start = &ps;
    c2.now_wall_ms = 1796000000001ull;
    c2.term = 3;
    c2.body_case = KVP__COMMAND__BODY_PUT_END;
    c2.put_end = &pe;
    c3.now_wall_ms = 1796000000002ull;
    c3.term = 3;
    c3.body_case = KVP__COMMAND__BODY_SEGMENT_LOST;
    c3.segment_lost = &sl;
    Kvp__Command *cmds[] = {&c1, &c2, &c3};
    Kvp__CommandBatch b = KVP__COMMAND_BATCH__INIT;
    b.n_commands = 3;
    b.commands = cmds;
    EMIT(t, 1, kvp_wire_encode_command_batch, &b);

    Kvp__RevokeExpiredCmd re = KVP__REVOKE_EXPIRED_CMD__INIT;
    Kvp__QuarantineReleaseCmd qr = KVP__QUARANTINE_RELEASE_CMD__INIT;
    Kvp__Command d1 = KVP__COMMAND__INIT, d2 = KVP__COMMAND__INIT;
    d1.now_wall_ms = 1796000001000ull;
    d1.term = 4;
    d1.body_case = KVP__COMMAND__BODY_REVOKE_EXPIRED;
    d1.revoke_expired = &re;
    d2.now_wall_ms = 1796000001000ull;
    d2.term = 4;
    d2.body_case = KVP__COMMAND__BODY_QUARANTINE_RELEASE;
    d2.quarantine_release = &qr;
    Kvp__Command *cmds2[] = {&d1, &d2};
    Kvp__CommandBatch b2 = KVP__COMMAND_BATCH__INIT;
    b2.n_commands = 2;
    b2.commands = cmds2;
    EMIT(t, 2, kvp_wire_encode_command_batch, &b2);

    char *keys[] = {"old/1", "old/2", "old/3"};
    Kvp__EvictCmd ev = KVP__EVICT_CMD__INIT;
    ev.n_keys = 3;
    ev.keys = keys;
    Kvp__Command e1 = KVP__COMMAND__INIT;
    e1.now_wall_ms = 1796000002000ull;
    e1.term = 5;
    e1.body_case = KVP__COMMAND__BODY_EVICT;
    e1.evict = &ev;
    Kvp__Command *cmds3[] = {&e1};
    Kvp__CommandBatch b3 = KVP__COMMAND_BATCH__INIT;
    b3.n_commands = 1;
    b3.commands = cmds3;
    EMIT(t, 3, kvp_wire_encode_command_batch, &b3);
}

static void frames(void)
{
    const char *t = "fuzz_frame";
    struct kvp_frame f[] = {
        {.op = KVP_FRAME_READ, .segment_id = 3, .req_id = 1, .offset = 4096, .length = 262144},
        {.op = KVP_FRAME_WRITE, .segment_id = 5, .req_id = 2, .offset = 0, .length = 1},
        {.op = KVP_FRAME_READ_RESP, .status = KVP_ERR_NOT_FOUND, .segment_id = 3, .req_id = 1},
        {.op = KVP_FRAME_WRITE_RESP, .segment_id = 5, .req_id = 2},
        {.op = KVP_FRAME_PING, .req_id = 99},
        {.op = KVP_FRAME_READ, .segment_id = 1, .req_id = 3, .length = KVP_FRAME_MAX_LENGTH},
        {.op = KVP_FRAME_WRITE, .segment_id = 5, .req_id = 4, .length = 4096, .deadline = 0x9abcdef0u},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        uint8_t hdr[KVP_FRAME_HEADER_BYTES];
        kvp_frame_encode(&f[i], hdr);
        put(t, (int)i + 1, hdr, sizeof(hdr));
    }
}

static void rdma_hellos(void)
{
    const char *t = "fuzz_wire_rdma_hello";
    struct kvp_rdma_hello_chunk ch[3] = {
        {.base = 0x7f0000000000ull, .len = 4ull << 30, .rkey = 0x1234},
        {.base = 0x7f0100000000ull, .len = 4ull << 30, .rkey = 0x1235},
        {.base = 0x7f0200000000ull, .len = 123456, .rkey = 0x1236},
    };
    struct kvp_rdma_hello h = {.conn_generation = 1, .segment_id = 7, .client_id = 42,
                               .nic = "mlx5_0", .port = 1, .gid_index = 3, .mtu = 5,
                               .max_rd_atomic = 16, .n_qps = 2,
                               .qps = {{.qpn = 0x11, .psn = 0xabcdef}, {.qpn = 0x12, .psn = 7}}};
    h.gid[10] = h.gid[11] = 0xff;
    h.gid[12] = 10;
    h.gid[15] = 1;
    EMIT(t, 1, kvp_rdma_hello_encode, &h); /* client offer */
    h.chunks = ch;
    h.n_chunks = 3;
    EMIT(t, 2, kvp_rdma_hello_encode, &h); /* segment answer with its chunk table */
    struct kvp_rdma_hello ib = {.conn_generation = 9, .nic = "ib0", .port = 1, .lid = 17,
                                .gid_index = -1, .mtu = 4, .max_rd_atomic = 1, .n_qps = 16};
    for (unsigned i = 0; i < 16; i++)
        ib.qps[i] = (struct kvp_rdma_hello_qp){.qpn = 0xffffffu - i, .psn = i};
    EMIT(t, 3, kvp_rdma_hello_encode, &ib); /* InfiniBand, 16 QPs */
    struct kvp_rdma_hello no = {.conn_generation = 2, .port = 1, .gid_index = 0, .mtu = 1,
                                .max_rd_atomic = 1, .status = KVP_ERR_UNSUPPORTED};
    EMIT(t, 4, kvp_rdma_hello_encode, &no); /* refusal */
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    g_dir = argv[1];
    if (mkdir(g_dir, 0755) != 0 && errno != EEXIST) {
        perror(g_dir);
        return 1;
    }
    requests();
    responses();
    batches();
    frames();
    rdma_hellos();
    return 0;
}
