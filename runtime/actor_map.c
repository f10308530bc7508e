/* actor_map.c — the runtime's small containers: an intrusive u64 hash map and a timer heap. */
#include <stdlib.h>

#include "kvpool.h"
#include "runtime/actor_internal.h"

static size_t slot(uint64_t key, size_t nb)
{
    /* Fibonacci hashing: ids are sequential, so spread them. */
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (nb - 1);
}

void rt_hmap_init(struct rt_hmap *m)
{
    m->b = NULL;
    m->nb = 0;
    m->n = 0;
}

void rt_hmap_fini(struct rt_hmap *m)
{
    free(m->b);
    rt_hmap_init(m);
}

static int grow(struct rt_hmap *m)
{
    size_t nb = m->nb ? m->nb * 2 : 16;
    struct rt_hnode **b = calloc(nb, sizeof(*b));
    if (!b)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < m->nb; i++) {
        struct rt_hnode *n = m->b[i];
        while (n) {
            struct rt_hnode *next = n->next;
            size_t s = slot(n->key, nb);
            n->next = b[s];
            b[s] = n;
            n = next;
        }
    }
    free(m->b);
    m->b = b;
    m->nb = nb;
    return KVP_OK;
}

int rt_hmap_put(struct rt_hmap *m, struct rt_hnode *node)
{
    if (m->n + 1 > m->nb) {
        int rc = grow(m);
        if (rc)
            return rc;
    }
    size_t s = slot(node->key, m->nb);
    node->next = m->b[s];
    m->b[s] = node;
    m->n++;
    return KVP_OK;
}

struct rt_hnode *rt_hmap_get(const struct rt_hmap *m, uint64_t key)
{
    if (!m->nb)
        return NULL;
    for (struct rt_hnode *n = m->b[slot(key, m->nb)]; n; n = n->next)
        if (n->key == key)
            return n;
    return NULL;
}

struct rt_hnode *rt_hmap_del(struct rt_hmap *m, uint64_t key)
{
    if (!m->nb)
        return NULL;
    struct rt_hnode **pp = &m->b[slot(key, m->nb)];
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->key == key) {
            struct rt_hnode *n = *pp;
            *pp = n->next;
            n->next = NULL;
            m->n--;
            return n;
        }
    }
    return NULL;
}

struct rt_hnode *rt_hmap_any(const struct rt_hmap *m)
{
    if (!m->n)
        return NULL;
    for (size_t i = 0; i < m->nb; i++)
        if (m->b[i])
            return m->b[i];
    return NULL;
}

/* ------------------------------------------------------------------ heap ordered by due_us */

static bool before(const struct rt_timer *a, const struct rt_timer *b)
{
    return a->due_us < b->due_us;
}

static void place(struct rt_heap *h, size_t i, struct rt_timer *t)
{
    h->v[i] = t;
    t->idx = i;
}

static void sift_up(struct rt_heap *h, size_t i)
{
    struct rt_timer *t = h->v[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(t, h->v[p]))
            break;
        place(h, i, h->v[p]);
        i = p;
    }
    place(h, i, t);
}

static void sift_down(struct rt_heap *h, size_t i)
{
    struct rt_timer *t = h->v[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && before(h->v[c + 1], h->v[c]))
            c++;
        if (!before(h->v[c], t))
            break;
        place(h, i, h->v[c]);
        i = c;
    }
    place(h, i, t);
}

int rt_heap_push(struct rt_heap *h, struct rt_timer *t)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        struct rt_timer **v = realloc(h->v, cap * sizeof(*v));
        if (!v)
            return KVP_ERR_NOMEM;
        h->v = v;
        h->cap = cap;
    }
    place(h, h->n++, t);
    sift_up(h, h->n - 1);
    return KVP_OK;
}

void rt_heap_remove(struct rt_heap *h, struct rt_timer *t)
{
    size_t i = t->idx;
    h->n--;
    if (i == h->n)
        return;
    struct rt_timer *m = h->v[h->n];
    place(h, i, m);
    sift_down(h, i);
    sift_up(h, m->idx);
}

struct rt_timer *rt_heap_top(const struct rt_heap *h)
{
    return h->n ? h->v[0] : NULL;
}

void rt_heap_fini(struct rt_heap *h)
{
    free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
}
