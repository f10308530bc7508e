/*
 * envelope.h — the frame around every control message, and the TCP data-plane frame header.
 *
 * Control envelope (12 bytes, little-endian), followed by `length` bytes of protobuf body:
 *   u32 magic   = KVP_WIRE_MAGIC ("KVPW")
 *   u8  version = KVP_WIRE_VERSION
 *   u8  flags   = 0
 *   u16 msg_id  = enum kvp_wire_msg (which protobuf message the body is)
 *   u32 length  = body bytes, <= KVP_WIRE_MAX_BODY
 *
 * Decoders never trust lengths: a short, long, oversized, wrong-magic or unknown-id input is
 * KVP_ERR_MALFORMED; a wrong version is KVP_ERR_VERSION.
 */
#ifndef KVP_WIRE_ENVELOPE_H
#define KVP_WIRE_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

#define KVP_WIRE_MAGIC 0x5750564bu /* "KVPW" little-endian */
#define KVP_WIRE_VERSION 1u
#define KVP_WIRE_HEADER_BYTES 12u
#define KVP_WIRE_MAX_BODY (64u << 20) /* 64 MiB: a batch of 1,024 keys is far below */

enum kvp_wire_msg {
    KVP_MSG_REQUEST = 1,
    KVP_MSG_RESPONSE = 2,
    KVP_MSG_COMMAND_BATCH = 3,
    KVP_MSG_RDMA_HELLO = 4, /* Kvp__RdmaHello: the RDMA QP handshake (wire/rdma_hello.h) */
    KVP_MSG__MAX = 5,
};

/**
 * Encode `msg` (a protobuf-c message of the type msg_id names) with its envelope into a new
 * malloc'd buffer. On success *out owns it (caller frees) and *out_len is its size in bytes.
 * Errors: KVP_ERR_INVALID (unknown id / NULL), KVP_ERR_TOO_LARGE, KVP_ERR_NOMEM.
 */
int kvp_wire_encode(enum kvp_wire_msg msg_id, const ProtobufCMessage *msg, uint8_t **out,
                    size_t *out_len);

/**
 * The two halves of kvp_wire_encode, for a caller that owns the buffer (e.g. a zmq_msg_t):
 * kvp_wire_encoded_size sets *out_len to the envelope plus the packed body, in bytes
 * (KVP_ERR_INVALID, KVP_ERR_TOO_LARGE); kvp_wire_encode_into writes exactly that many bytes into
 * buf (len must be that size: KVP_ERR_INVALID for a bad argument, KVP_ERR_INTERNAL when the
 * message no longer packs to len - KVP_WIRE_HEADER_BYTES bytes; nothing past buf + len is
 * written either way).
 */
int kvp_wire_encoded_size(enum kvp_wire_msg msg_id, const ProtobufCMessage *msg, size_t *out_len);
int kvp_wire_encode_into(enum kvp_wire_msg msg_id, const ProtobufCMessage *msg, uint8_t *buf, size_t len);

/** Shorthands that type-check. */
int kvp_wire_encode_request(const Kvp__Request *req, uint8_t **out, size_t *out_len);
int kvp_wire_encode_response(const Kvp__Response *resp, uint8_t **out, size_t *out_len);
int kvp_wire_encode_command_batch(const Kvp__CommandBatch *b, uint8_t **out, size_t *out_len);

/**
 * Check the envelope of [buf, buf+len) and decode its body as `expect`. On success *out is a
 * new message (free with protobuf_c_message_free_unpacked(*out, NULL)).
 * Errors: KVP_ERR_MALFORMED (truncated, trailing bytes, bad magic, bad length, wrong id,
 * body that protobuf-c rejects), KVP_ERR_VERSION.
 */
int kvp_wire_decode(enum kvp_wire_msg expect, const uint8_t *buf, size_t len,
                    ProtobufCMessage **out);

/**
 * kvp_wire_decode with the body's memory from `allocator` (NULL: malloc, as kvp_wire_decode).
 * With an arena (wire/arena.h) the message is released by resetting the arena, not by
 * protobuf_c_message_free_unpacked.
 */
int kvp_wire_decode_with(enum kvp_wire_msg expect, const uint8_t *buf, size_t len,
                         ProtobufCAllocator *allocator, ProtobufCMessage **out);

int kvp_wire_decode_request(const uint8_t *buf, size_t len, Kvp__Request **out);
int kvp_wire_decode_response(const uint8_t *buf, size_t len, Kvp__Response **out);
int kvp_wire_decode_command_batch(const uint8_t *buf, size_t len, Kvp__CommandBatch **out);

/* ------------------------------------------------------------------ TCP data plane frames
 * A fixed 40-byte little-endian header, hand-written so payload bytes can move straight
 * between the socket and the destination memory with readv/writev:
 *   u32 magic      = KVP_FRAME_MAGIC ("KVPD")
 *   u8  version    = KVP_WIRE_VERSION
 *   u8  op         = enum kvp_frame_op
 *   i16 status     = kvp_err (responses)
 *   u32 segment_id = the segment the request addresses (a restarted segment has a new id)
 *   u32 deadline   = WRITE requests: the client's write deadline, wall-clock ms since the
 *                    epoch modulo 2^32 (0 = none; see kvp_frame_deadline_*); 0 in other frames
 *   u64 req_id     = correlation id, echoed
 *   u64 offset     = byte offset inside the segment
 *   u64 length     = payload bytes (WRITE request, READ response) or bytes wanted (READ request)
 * WRITE request: header + `length` payload bytes; reply: header with status, no payload.
 * READ request: header; reply: header with status and, if status is 0, `length` payload bytes.
 * A segment server receives no WRITE payload byte into its region once the frame's deadline has
 * passed on its own clock: it drains the rest and answers KVP_ERR_TIMEOUT (contract C3,
 * docs/fencing.md). The deadline field was the reserved word of the first version; a zero there
 * still means "no deadline".
 */
#define KVP_FRAME_MAGIC 0x4450564bu /* "KVPD" */
#define KVP_FRAME_HEADER_BYTES 40u
#define KVP_FRAME_MAX_LENGTH (1ull << 32) /* one slice is at most 4 GiB */

enum kvp_frame_op {
    KVP_FRAME_READ = 1,
    KVP_FRAME_WRITE = 2,
    KVP_FRAME_READ_RESP = 3,
    KVP_FRAME_WRITE_RESP = 4,
    KVP_FRAME_PING = 5,
    KVP_FRAME_PONG = 6,
    /* RDMA handshake on the data-plane port (docs/rdma.md "Handshake"): the request's payload is
     * an RdmaHello offer (wire/rdma_hello.h, at most KVP_FRAME_RDMA_HELLO_MAX bytes); the answer's
     * payload is the segment's RdmaHello answer. offset 0; segment_id: the segment addressed.
     * A server without RDMA answers status KVP_ERR_UNSUPPORTED and no payload; a server older
     * than these ops closes the connection (unknown op): either way the client uses TCP. */
    KVP_FRAME_RDMA_HELLO = 7,
    KVP_FRAME_RDMA_HELLO_RESP = 8,
};
#define KVP_FRAME_RDMA_HELLO_MAX (64u * 1024u)

struct kvp_frame {
    uint8_t op;
    int16_t status;
    uint32_t segment_id;
    uint64_t req_id;
    uint64_t offset;
    uint64_t length;
    uint32_t deadline;   /* WRITE: kvp_frame_deadline_make(wall ms), else 0 */
};

/** The 32-bit deadline word for a wall-clock time in ms (never 0: 0 means none). */
static inline uint32_t kvp_frame_deadline_make(uint64_t wall_ms)
{
    uint32_t d = (uint32_t)wall_ms;
    return d ? d : 1u;
}

/**
 * True when deadline d (not 0) is before now_wall_ms. Serial-number arithmetic on 32 bits: exact
 * while the deadline is within ±24 days of now, which every transfer timeout is.
 */
static inline int kvp_frame_deadline_passed(uint32_t d, uint64_t now_wall_ms)
{
    return d != 0 && (int32_t)((uint32_t)now_wall_ms - d) > 0;
}

/** Write the 40-byte header of `f` into buf (KVP_FRAME_HEADER_BYTES bytes). */
void kvp_frame_encode(const struct kvp_frame *f, uint8_t buf[KVP_FRAME_HEADER_BYTES]);

/**
 * Parse a 40-byte header. Errors: KVP_ERR_MALFORMED (bad magic, unknown op, a deadline on a
 * frame other than WRITE, length > KVP_FRAME_MAX_LENGTH), KVP_ERR_VERSION.
 */
int kvp_frame_decode(const uint8_t buf[KVP_FRAME_HEADER_BYTES], struct kvp_frame *out);

#endif
