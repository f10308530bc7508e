/* clock.c — see clock.h. */
#include "runtime/clock.h"

#include <stdatomic.h>
#include <stddef.h>
#include <errno.h>
#include <time.h>

/* Relaxed: tests install the fake before starting the code under test. */
static _Atomic(const uint64_t *) g_fake = NULL;

void kvp_clock_set_fake(const uint64_t *ns)
{
    atomic_store_explicit(&g_fake, ns, memory_order_relaxed);
}

uint64_t kvp_clock_now_ns(void)
{
    const uint64_t *f = atomic_load_explicit(&g_fake, memory_order_relaxed);
    if (f) /* a test may move it while actors read it: an atomic read (TSan) */
        return __atomic_load_n(f, __ATOMIC_RELAXED);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvp_clock_now_us(void) { return kvp_clock_now_ns() / 1000u; }
uint64_t kvp_clock_now_ms(void) { return kvp_clock_now_ns() / 1000000u; }

uint64_t kvp_clock_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void kvp_clock_sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}
