/* arena.c — see arena.h. */
#include "wire/arena.h"

#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"

#define ARENA_ALIGN alignof(max_align_t)

struct kvp_wire_arena_big {
    struct kvp_wire_arena_big *next;
    alignas(max_align_t) unsigned char data[];
};

static void *arena_alloc(void *ctx, size_t size)
{
    struct kvp_wire_arena *a = ctx;
    size_t need = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need < size)
        return NULL; /* overflow */
    if (need <= a->cap - a->used) {
        void *p = a->block + a->used;
        a->used += need;
        return p;
    }
    if (size > SIZE_MAX - sizeof(struct kvp_wire_arena_big))
        return NULL;
    struct kvp_wire_arena_big *b = malloc(sizeof(*b) + size);
    if (!b)
        return NULL;
    b->next = a->big;
    a->big = b;
    a->big_allocs++;
    return b->data;
}

static void arena_free(void *ctx, void *p)
{
    (void)ctx;
    (void)p; /* released at kvp_wire_arena_reset */
}

int kvp_wire_arena_init(struct kvp_wire_arena *a, size_t cap)
{
    if (!a)
        return KVP_ERR_INVALID;
    memset(a, 0, sizeof(*a));
    a->pb.alloc = arena_alloc;
    a->pb.free = arena_free;
    a->pb.allocator_data = a;
    if (cap > 0) {
        /* malloc's blocks are aligned to max_align_t, so every bump offset (a multiple of it) is */
        a->block = malloc(cap);
        if (!a->block)
            return KVP_ERR_NOMEM;
        a->cap = cap;
    }
    return KVP_OK;
}

void kvp_wire_arena_reset(struct kvp_wire_arena *a)
{
    if (!a)
        return;
    while (a->big) {
        struct kvp_wire_arena_big *b = a->big;
        a->big = b->next;
        free(b);
    }
    a->used = 0;
}

void kvp_wire_arena_fini(struct kvp_wire_arena *a)
{
    if (!a)
        return;
    kvp_wire_arena_reset(a);
    free(a->block);
    a->block = NULL;
    a->cap = 0;
}
