/* envelope.c — see envelope.h. */
#include "wire/envelope.h"

#include <stdlib.h>
#include <string.h>

#include "kvpool.h"

static const ProtobufCMessageDescriptor *descriptor_of(enum kvp_wire_msg id)
{
    switch (id) {
    case KVP_MSG_REQUEST:
        return &kvp__request__descriptor;
    case KVP_MSG_RESPONSE:
        return &kvp__response__descriptor;
    case KVP_MSG_COMMAND_BATCH:
        return &kvp__command_batch__descriptor;
    case KVP_MSG_RDMA_HELLO:
        return &kvp__rdma_hello__descriptor;
    default:
        return NULL;
    }
}

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

int kvp_wire_encoded_size(enum kvp_wire_msg msg_id, const ProtobufCMessage *msg, size_t *out_len)
{
    const ProtobufCMessageDescriptor *d = descriptor_of(msg_id);
    if (!d || !msg || !out_len || msg->descriptor != d)
        return KVP_ERR_INVALID;
    size_t body = protobuf_c_message_get_packed_size(msg);
    if (body > KVP_WIRE_MAX_BODY)
        return KVP_ERR_TOO_LARGE;
    *out_len = KVP_WIRE_HEADER_BYTES + body;
    return KVP_OK;
}

int kvp_wire_encode_into(enum kvp_wire_msg msg_id, const ProtobufCMessage *msg, uint8_t *buf, size_t len)
{
    const ProtobufCMessageDescriptor *d = descriptor_of(msg_id);
    if (!d || !msg || !buf || msg->descriptor != d || len < KVP_WIRE_HEADER_BYTES ||
        len - KVP_WIRE_HEADER_BYTES > KVP_WIRE_MAX_BODY)
        return KVP_ERR_INVALID;
    size_t body = len - KVP_WIRE_HEADER_BYTES;
    put_u32(buf, KVP_WIRE_MAGIC);
    buf[4] = KVP_WIRE_VERSION;
    buf[5] = 0;
    put_u16(buf + 6, (uint16_t)msg_id);
    put_u32(buf + 8, (uint32_t)body);
    /* protobuf-c writes exactly get_packed_size bytes: a message changed since the size was
     * taken would overrun, so the size is checked first (one walk, no write). */
    if (protobuf_c_message_get_packed_size(msg) != body)
        return KVP_ERR_INTERNAL;
    if (protobuf_c_message_pack(msg, buf + KVP_WIRE_HEADER_BYTES) != body)
        return KVP_ERR_INTERNAL;
    return KVP_OK;
}

int kvp_wire_encode(enum kvp_wire_msg msg_id, const ProtobufCMessage *msg, uint8_t **out,
                    size_t *out_len)
{
    size_t len = 0;
    if (!out || !out_len)
        return KVP_ERR_INVALID;
    int rc = kvp_wire_encoded_size(msg_id, msg, &len);
    if (rc != KVP_OK)
        return rc;
    uint8_t *buf = malloc(len + 1);
    if (!buf)
        return KVP_ERR_NOMEM;
    size_t body = len - KVP_WIRE_HEADER_BYTES;
    put_u32(buf, KVP_WIRE_MAGIC);
    buf[4] = KVP_WIRE_VERSION;
    buf[5] = 0;
    put_u16(buf + 6, (uint16_t)msg_id);
    put_u32(buf + 8, (uint32_t)body);
    if (protobuf_c_message_pack(msg, buf + KVP_WIRE_HEADER_BYTES) != body) {
        free(buf);
        return KVP_ERR_INTERNAL;
    }
    *out = buf;
    *out_len = len;
    return KVP_OK;
}

int kvp_wire_encode_request(const Kvp__Request *req, uint8_t **out, size_t *out_len)
{
    return kvp_wire_encode(KVP_MSG_REQUEST, (const ProtobufCMessage *)req, out, out_len);
}
int kvp_wire_encode_response(const Kvp__Response *resp, uint8_t **out, size_t *out_len)
{
    return kvp_wire_encode(KVP_MSG_RESPONSE, (const ProtobufCMessage *)resp, out, out_len);
}
int kvp_wire_encode_command_batch(const Kvp__CommandBatch *b, uint8_t **out, size_t *out_len)
{
    return kvp_wire_encode(KVP_MSG_COMMAND_BATCH, (const ProtobufCMessage *)b, out, out_len);
}

int kvp_wire_decode(enum kvp_wire_msg expect, const uint8_t *buf, size_t len,
                    ProtobufCMessage **out)
{
    return kvp_wire_decode_with(expect, buf, len, NULL, out);
}

int kvp_wire_decode_with(enum kvp_wire_msg expect, const uint8_t *buf, size_t len,
                         ProtobufCAllocator *allocator, ProtobufCMessage **out)
{
    const ProtobufCMessageDescriptor *d = descriptor_of(expect);
    if (!d || !out)
        return KVP_ERR_INVALID;
    *out = NULL;
    if (!buf || len < KVP_WIRE_HEADER_BYTES)
        return KVP_ERR_MALFORMED;
    if (get_u32(buf) != KVP_WIRE_MAGIC)
        return KVP_ERR_MALFORMED;
    if (buf[4] != KVP_WIRE_VERSION)
        return KVP_ERR_VERSION;
    if (buf[5] != 0)
        return KVP_ERR_MALFORMED;
    if (get_u16(buf + 6) != (uint16_t)expect)
        return KVP_ERR_MALFORMED;
    uint32_t body = get_u32(buf + 8);
    if (body > KVP_WIRE_MAX_BODY || (size_t)body != len - KVP_WIRE_HEADER_BYTES)
        return KVP_ERR_MALFORMED;
    ProtobufCMessage *m = protobuf_c_message_unpack(d, allocator, body, buf + KVP_WIRE_HEADER_BYTES);
    if (!m)
        return KVP_ERR_MALFORMED;
    *out = m;
    return KVP_OK;
}

int kvp_wire_decode_request(const uint8_t *buf, size_t len, Kvp__Request **out)
{
    return kvp_wire_decode(KVP_MSG_REQUEST, buf, len, (ProtobufCMessage **)out);
}
int kvp_wire_decode_response(const uint8_t *buf, size_t len, Kvp__Response **out)
{
    return kvp_wire_decode(KVP_MSG_RESPONSE, buf, len, (ProtobufCMessage **)out);
}
int kvp_wire_decode_command_batch(const uint8_t *buf, size_t len, Kvp__CommandBatch **out)
{
    return kvp_wire_decode(KVP_MSG_COMMAND_BATCH, buf, len, (ProtobufCMessage **)out);
}

void kvp_frame_encode(const struct kvp_frame *f, uint8_t buf[KVP_FRAME_HEADER_BYTES])
{
    put_u32(buf, KVP_FRAME_MAGIC);
    buf[4] = KVP_WIRE_VERSION;
    buf[5] = f->op;
    put_u16(buf + 6, (uint16_t)f->status);
    put_u32(buf + 8, f->segment_id);
    put_u32(buf + 12, f->op == KVP_FRAME_WRITE ? f->deadline : 0);
    put_u64(buf + 16, f->req_id);
    put_u64(buf + 24, f->offset);
    put_u64(buf + 32, f->length);
}

int kvp_frame_decode(const uint8_t buf[KVP_FRAME_HEADER_BYTES], struct kvp_frame *out)
{
    if (get_u32(buf) != KVP_FRAME_MAGIC)
        return KVP_ERR_MALFORMED;
    if (buf[4] != KVP_WIRE_VERSION)
        return KVP_ERR_VERSION;
    uint8_t op = buf[5];
    if (op < KVP_FRAME_READ || op > KVP_FRAME_RDMA_HELLO_RESP)
        return KVP_ERR_MALFORMED;
    uint32_t deadline = get_u32(buf + 12);
    if (deadline != 0 && op != KVP_FRAME_WRITE)
        return KVP_ERR_MALFORMED;
    uint64_t length = get_u64(buf + 32);
    if (length > KVP_FRAME_MAX_LENGTH)
        return KVP_ERR_MALFORMED;
    out->op = op;
    out->status = (int16_t)get_u16(buf + 6);
    out->segment_id = get_u32(buf + 8);
    out->req_id = get_u64(buf + 16);
    out->offset = get_u64(buf + 24);
    out->length = length;
    out->deadline = deadline;
    return KVP_OK;
}
