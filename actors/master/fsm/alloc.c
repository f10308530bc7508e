/* alloc.c — treap of free extents (see alloc.h for the design). */
#include "actors/master/fsm/alloc.h"

#include <stdlib.h>

#include "kvpool.h"

struct kvp_alloc_node {
    uint64_t off, len;
    uint64_t max;  /* largest len in this subtree */
    uint64_t prio; /* heap order: parent prio >= child prio */
    struct kvp_alloc_node *left, *right;
};

typedef struct kvp_alloc_node node;

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t max3(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t m = a > b ? a : b;
    return m > c ? m : c;
}

static inline void pull(node *t)
{
    t->max = max3(t->len, t->left ? t->left->max : 0, t->right ? t->right->max : 0);
}

/* Split t into nodes with off < key (*l) and off >= key (*r). */
static void split(node *t, uint64_t key, node **l, node **r)
{
    if (!t) {
        *l = *r = NULL;
        return;
    }
    if (t->off < key) {
        split(t->right, key, &t->right, r);
        pull(t);
        *l = t;
    } else {
        split(t->left, key, l, &t->left);
        pull(t);
        *r = t;
    }
}

/* Every key of l is below every key of r. */
static node *merge(node *l, node *r)
{
    if (!l)
        return r;
    if (!r)
        return l;
    if (l->prio >= r->prio) {
        l->right = merge(l->right, r);
        pull(l);
        return l;
    }
    r->left = merge(l, r->left);
    pull(r);
    return r;
}

static node *rightmost(node *t)
{
    while (t && t->right)
        t = t->right;
    return t;
}

static node *leftmost(node *t)
{
    while (t && t->left)
        t = t->left;
    return t;
}

/* Detach the rightmost node of t into *out; returns the new root. */
static node *pop_rightmost(node *t, node **out)
{
    if (!t->right) {
        *out = t;
        node *l = t->left;
        t->left = NULL;
        return l;
    }
    t->right = pop_rightmost(t->right, out);
    pull(t);
    return t;
}

static node *pop_leftmost(node *t, node **out)
{
    if (!t->left) {
        *out = t;
        node *r = t->right;
        t->right = NULL;
        return r;
    }
    t->left = pop_leftmost(t->left, out);
    pull(t);
    return t;
}

static node *node_new(struct kvp_alloc *a)
{
    node *n = calloc(1, sizeof(*n));
    if (n)
        n->prio = splitmix64(++a->seq);
    return n;
}

static void node_set(node *n, uint64_t off, uint64_t len)
{
    n->off = off;
    n->len = len;
    n->max = len;
    n->left = n->right = NULL;
}

uint64_t kvp_alloc_round(uint64_t len)
{
    if (len == 0 || len > UINT64_MAX - (KVP_ALLOC_ALIGN - 1))
        return 0;
    return (len + KVP_ALLOC_ALIGN - 1) & ~(uint64_t)(KVP_ALLOC_ALIGN - 1);
}

void kvp_alloc_init_full(struct kvp_alloc *a, uint64_t size)
{
    a->root = NULL;
    a->capacity = size & ~(uint64_t)(KVP_ALLOC_ALIGN - 1);
    a->free_bytes = 0;
    a->n_free = 0;
    a->seq = 0;
}

int kvp_alloc_init(struct kvp_alloc *a, uint64_t size)
{
    kvp_alloc_init_full(a, size);
    if (a->capacity == 0)
        return KVP_OK;
    node *n = node_new(a);
    if (!n)
        return KVP_ERR_NOMEM;
    node_set(n, 0, a->capacity);
    a->root = n;
    a->free_bytes = a->capacity;
    a->n_free = 1;
    return KVP_OK;
}

static void free_tree(node *t)
{
    /* Iterative on the right spine to bound recursion to the tree height. */
    while (t) {
        free_tree(t->left);
        node *r = t->right;
        free(t);
        t = r;
    }
}

void kvp_alloc_fini(struct kvp_alloc *a)
{
    free_tree(a->root);
    a->root = NULL;
    a->free_bytes = 0;
    a->n_free = 0;
}

/* First fit: the lowest-offset node with len >= want. Caller checked root->max >= want. */
static node *take(struct kvp_alloc *a, node *t, uint64_t want, uint64_t *off)
{
    if (t->left && t->left->max >= want) {
        t->left = take(a, t->left, want, off);
    } else if (t->len >= want) {
        *off = t->off;
        if (t->len == want) {
            node *m = merge(t->left, t->right);
            free(t);
            a->n_free--;
            return m;
        }
        t->off += want;
        t->len -= want;
    } else {
        t->right = take(a, t->right, want, off);
    }
    pull(t);
    return t;
}

int kvp_alloc_alloc(struct kvp_alloc *a, uint64_t len, uint64_t *off)
{
    uint64_t want = kvp_alloc_round(len);
    if (want == 0)
        return KVP_ERR_INVALID;
    if (!a->root || a->root->max < want)
        return KVP_ERR_NO_SPACE;
    a->root = take(a, a->root, want, off);
    a->free_bytes -= want;
    return KVP_OK;
}

static int range_ok(const struct kvp_alloc *a, uint64_t off, uint64_t len)
{
    return len != 0 && (off % KVP_ALLOC_ALIGN) == 0 && off <= a->capacity &&
           len <= a->capacity - off;
}

int kvp_alloc_free(struct kvp_alloc *a, uint64_t off, uint64_t len)
{
    len = kvp_alloc_round(len);
    if (!range_ok(a, off, len))
        return KVP_ERR_INVALID;
    node *fresh = node_new(a);
    if (!fresh)
        return KVP_ERR_NOMEM;
    node *l, *r;
    split(a->root, off, &l, &r);
    node *lm = rightmost(l), *rm = leftmost(r);
    if ((lm && lm->off + lm->len > off) || (rm && rm->off < off + len)) {
        a->root = merge(l, r);
        free(fresh);
        return KVP_ERR_INVALID;
    }
    a->free_bytes += len;
    a->n_free++;
    node *n = NULL;
    if (lm && lm->off + lm->len == off) {
        l = pop_rightmost(l, &n);
        off = n->off;
        len += n->len;
        a->n_free--;
    }
    if (rm && off + len == rm->off) {
        node *m;
        r = pop_leftmost(r, &m);
        len += m->len;
        a->n_free--;
        if (n)
            free(m);
        else
            n = m;
    }
    if (n)
        free(fresh);
    else
        n = fresh;
    node_set(n, off, len);
    a->root = merge(merge(l, n), r);
    return KVP_OK;
}

int kvp_alloc_reserve(struct kvp_alloc *a, uint64_t off, uint64_t len)
{
    len = kvp_alloc_round(len);
    if (!range_ok(a, off, len))
        return KVP_ERR_INVALID;
    node *fresh = node_new(a);
    if (!fresh)
        return KVP_ERR_NOMEM;
    node *l, *r;
    split(a->root, off + 1, &l, &r);
    node *c = rightmost(l);
    if (!c || c->off + c->len < off + len) {
        a->root = merge(l, r);
        free(fresh);
        return KVP_ERR_INVALID;
    }
    l = pop_rightmost(l, &c);
    uint64_t c_off = c->off, c_end = c->off + c->len, end = off + len;
    node *lo = NULL, *hi = NULL;
    a->n_free--;
    if (c_off < off) {
        lo = c;
        node_set(lo, c_off, off - c_off);
        c = NULL;
        a->n_free++;
    }
    if (end < c_end) {
        hi = c ? c : fresh;
        if (hi == fresh)
            fresh = NULL;
        node_set(hi, end, c_end - end);
        c = NULL;
        a->n_free++;
    }
    free(c);
    free(fresh);
    a->free_bytes -= len;
    a->root = merge(merge(l, lo), merge(hi, r));
    return KVP_OK;
}

uint64_t kvp_alloc_largest_free(const struct kvp_alloc *a)
{
    return a->root ? a->root->max : 0;
}

static void walk(const node *t, void (*cb)(void *, uint64_t, uint64_t), void *ctx)
{
    while (t) {
        walk(t->left, cb, ctx);
        cb(ctx, t->off, t->len);
        t = t->right;
    }
}

void kvp_alloc_foreach_free(const struct kvp_alloc *a,
                            void (*cb)(void *ctx, uint64_t off, uint64_t len), void *ctx)
{
    walk(a->root, cb, ctx);
}

struct check_ctx {
    uint64_t prev_end, bytes, count;
    int first, err;
};

static int check_node(const struct kvp_alloc *a, const node *t, struct check_ctx *c)
{
    if (!t)
        return 0;
    if (t->left && t->left->prio > t->prio)
        return -1;
    if (t->right && t->right->prio > t->prio)
        return -2;
    if (check_node(a, t->left, c))
        return c->err ? c->err : -3;
    if (t->len == 0 || t->off % KVP_ALLOC_ALIGN || t->len % KVP_ALLOC_ALIGN)
        return c->err = -4;
    if (t->off + t->len > a->capacity)
        return c->err = -5;
    if (!c->first && t->off <= c->prev_end) /* overlapping, unordered or not coalesced */
        return c->err = -6;
    c->first = 0;
    c->prev_end = t->off + t->len;
    c->bytes += t->len;
    c->count++;
    if (t->max != max3(t->len, t->left ? t->left->max : 0, t->right ? t->right->max : 0))
        return c->err = -7;
    return check_node(a, t->right, c);
}

int kvp_alloc_check(const struct kvp_alloc *a)
{
    struct check_ctx c = {.first = 1};
    int rc = check_node(a, a->root, &c);
    if (rc)
        return rc;
    if (c.bytes != a->free_bytes)
        return -8;
    if (c.count != a->n_free)
        return -9;
    if (a->capacity % KVP_ALLOC_ALIGN)
        return -10;
    return 0;
}
