/*
 * arena.h — a bump allocator for decoding one protobuf message at a time.
 *
 * protobuf-c's unpack allocates every sub-message, string, bytes field and repeated array with
 * its own malloc, and free_unpacked walks the message to free each one: about a dozen calls
 * for one PutStart. A reader that decodes one message, handles it and drops it (the master's
 * request loop) can take all of that memory from one reused block instead and release it at
 * once with kvp_wire_arena_reset.
 *
 * Memory: `cap` bytes allocated once by kvp_wire_arena_init; an allocation that does not fit in
 * what is left of the block gets its own malloc, freed at the next reset (so any message size
 * decodes; only the block is kept between messages). Allocations are aligned to
 * alignof(max_align_t). free is a no-op: nothing is returned before the reset.
 *
 * Ownership and threads: the arena is its owner's (one thread); a message decoded into it is
 * valid until the next reset or fini and must not be passed to free_unpacked with the NULL
 * allocator, nor kept past the reset.
 */
#ifndef KVP_WIRE_ARENA_H
#define KVP_WIRE_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_wire_arena_big;

struct kvp_wire_arena {
    ProtobufCAllocator pb;          /* give &arena->pb to protobuf-c (kvp_wire_decode_with) */
    uint8_t *block;                 /* cap bytes, reused message after message */
    size_t cap, used;
    struct kvp_wire_arena_big *big; /* allocations that did not fit, freed at reset */
    uint64_t big_allocs;            /* how many allocations since init did not fit (diagnostic) */
};

/** Set up `a` with a block of `cap` bytes (0 allowed: every allocation is its own malloc).
 * Errors: KVP_ERR_INVALID (a NULL), KVP_ERR_NOMEM. On error `a` is left safe to fini. */
int kvp_wire_arena_init(struct kvp_wire_arena *a, size_t cap);

/** Release everything allocated since the last reset (the block is kept). */
void kvp_wire_arena_reset(struct kvp_wire_arena *a);

/** Release everything, the block too; `a` may be initialized again. NULL or zeroed: no-op. */
void kvp_wire_arena_fini(struct kvp_wire_arena *a);

#endif
