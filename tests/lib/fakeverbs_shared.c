/*
 * fakeverbs_shared.c — see fakeverbs_shared.h. A test helper: the arena allocator, the
 * process-shared lock and the ticker thread stand in for what a real NIC and its driver share
 * with the kernel; none of it is kvpool code.
 */
#ifdef KVP_HAVE_VERBS
#define _GNU_SOURCE

#include "tests/lib/fakeverbs_shared.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <time.h>
#include <unistd.h>

#include "kvpool.h"
#include "tests/lib/fakeverbs_internal.h"
#include "tests/lib/fakeverbs_locked.h"

/* ---------- the arena: power-of-two size classes with free lists, bump allocation ---------- */

#define CLASSES 40
#define MIN_CLASS 5
#define MAGIC 0x46564152u /* "FVAR" */

struct blk { /* 16 bytes before every block */
    uint32_t cls;
    uint32_t magic;
    struct blk *next; /* free list link while free */
};

struct arena {
    pthread_mutex_t lock;  /* the double's lock (fv_lock) */
    pthread_mutex_t alloc; /* the allocator's own */
    size_t size, used;
    struct blk *free[CLASSES];
};

static struct arena *g_ar;    /* same address in every process forked after init */
static uint8_t *g_lo, *g_hi;  /* the arena's bounds, for fv_free of libc blocks */

static void robust_lock(pthread_mutex_t *m)
{
    int rc = pthread_mutex_lock(m);
    if (rc == EOWNERDEAD) { /* a child died holding it (fakeverbs_shared.h) */
        fprintf(stderr, "fakeverbs_shared: a process died holding the double's lock\n");
        pthread_mutex_consistent(m);
    } else if (rc != 0) {
        abort();
    }
}

static void mutex_shared(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

int fv_shared_init(size_t bytes)
{
    if (g_ar || bytes < (1u << 20))
        return KVP_ERR_INVALID;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return KVP_ERR_NOMEM;
    struct arena *a = p;
    memset(a, 0, sizeof *a);
    mutex_shared(&a->lock);
    mutex_shared(&a->alloc);
    a->size = bytes;
    a->used = (sizeof *a + 63) & ~(size_t)63;
    g_lo = p;
    g_hi = (uint8_t *)p + bytes;
    g_ar = a;
    return KVP_OK;
}

size_t fv_shared_used(void)
{
    return g_ar ? g_ar->used : 0;
}

pthread_mutex_t *fvi_shared_lock(void);
pthread_mutex_t *fvi_shared_lock(void)
{
    return g_ar ? &g_ar->lock : NULL;
}
void fvi_shared_lock_take(pthread_mutex_t *m);
void fvi_shared_lock_take(pthread_mutex_t *m)
{
    robust_lock(m);
}

static unsigned cls_of(size_t n)
{
    unsigned c = MIN_CLASS;
    while (((size_t)1 << c) < n)
        c++;
    return c;
}

static void *arena_alloc(size_t n)
{
    unsigned c = cls_of(n ? n : 1);
    if (c >= CLASSES)
        return NULL;
    robust_lock(&g_ar->alloc);
    struct blk *b = g_ar->free[c];
    if (b) {
        g_ar->free[c] = b->next;
    } else {
        size_t need = sizeof *b + ((size_t)1 << c);
        if (g_ar->used + need > g_ar->size) {
            pthread_mutex_unlock(&g_ar->alloc);
            return NULL;
        }
        b = (struct blk *)((uint8_t *)g_ar + g_ar->used);
        g_ar->used += need;
    }
    b->cls = c;
    b->magic = MAGIC;
    b->next = NULL;
    pthread_mutex_unlock(&g_ar->alloc);
    return b + 1;
}

static bool in_arena(const void *p)
{
    return g_ar && (const uint8_t *)p >= g_lo && (const uint8_t *)p < g_hi;
}

void *fv_malloc(size_t n)
{
    if (!g_ar)
        return malloc(n);
    void *p = arena_alloc(n);
    if (!p)
        errno = ENOMEM;
    return p;
}

void *fv_calloc(size_t n, size_t size)
{
    if (!g_ar)
        return calloc(n, size);
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = fv_malloc(n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void fv_free(void *p)
{
    if (!p)
        return;
    if (!in_arena(p)) {
        free(p);
        return;
    }
    struct blk *b = (struct blk *)p - 1;
    if (b->magic != MAGIC)
        abort(); /* test helper: a double free or a stray pointer */
    b->magic = 0;
    robust_lock(&g_ar->alloc);
    b->next = g_ar->free[b->cls];
    g_ar->free[b->cls] = b;
    pthread_mutex_unlock(&g_ar->alloc);
}

void *fv_realloc(void *p, size_t n)
{
    if (!p)
        return fv_malloc(n);
    if (!in_arena(p))
        return realloc(p, n);
    struct blk *b = (struct blk *)p - 1;
    size_t have = (size_t)1 << b->cls;
    if (n <= have)
        return p;
    void *q = fv_malloc(n);
    if (!q)
        return NULL;
    memcpy(q, p, have);
    fv_free(p);
    return q;
}

/* ---------- the ticker ---------- */

static struct {
    pthread_t th;
    bool running;
    _Atomic bool stop; /* the test thread asks the ticker thread to end (join follows) */
    struct fv_fabric *f;
    uint64_t v0, r0; /* virtual and real time at start */
    struct { struct fv_node *n; int fd; } w[8];
    _Atomic int n_w; /* watches are added by the test thread while the ticker runs */
} T;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *ticker(void *arg)
{
    (void)arg;
    while (!atomic_load(&T.stop)) {
        int n_w = atomic_load(&T.n_w);
        fv_lock();
        fv_run_until(T.f, T.v0 + (mono_ns() - T.r0));
        for (int i = 0; i < n_w; i++) {
            if (T.w[i].fd < 0)
                continue;
            struct pollfd pf = {.fd = T.w[i].fd, .events = POLLIN};
            if (poll(&pf, 1, 0) == 1) { /* the process exited: its node dies with it */
                fv_node_kill(T.w[i].n);
                close(T.w[i].fd);
                T.w[i].fd = -1;
            }
        }
        uint64_t now = fv_now(T.f), next = fv_next_event(T.f);
        fv_unlock();
        uint64_t nap = 300000; /* idle: a new post waits at most this long to leave */
        if (next != UINT64_MAX && next > now && next - now < nap)
            nap = next - now < 20000 ? 20000 : next - now;
        struct timespec ts = {0, (long)nap};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int fv_ticker_start(struct fv_fabric *f)
{
    if (T.running)
        return KVP_ERR_INVALID;
    T.f = f;
    fv_lock();
    T.v0 = fv_now(f);
    fv_unlock();
    T.r0 = mono_ns();
    atomic_store(&T.stop, false);
    if (pthread_create(&T.th, NULL, ticker, NULL) != 0)
        return KVP_ERR_NOMEM;
    T.running = true;
    return KVP_OK;
}

int fv_ticker_watch(struct fv_node *n, pid_t pid)
{
    int i = atomic_load(&T.n_w);
    if (i >= 8)
        return KVP_ERR_INVALID;
    int fd = pidfd_open(pid, 0);
    if (fd < 0)
        return KVP_ERR_IO;
    T.w[i].n = n;
    T.w[i].fd = fd;
    atomic_store(&T.n_w, i + 1);
    return KVP_OK;
}

void fv_ticker_stop(void)
{
    if (!T.running)
        return;
    atomic_store(&T.stop, true);
    pthread_join(T.th, NULL);
    T.running = false;
    for (int i = 0; i < atomic_load(&T.n_w); i++)
        if (T.w[i].fd >= 0)
            close(T.w[i].fd);
    atomic_store(&T.n_w, 0);
}

#endif
