/* fake_clock.c — see fake_clock.h. */
#include "tests/lib/fake_clock.h"

#include <stddef.h>

#include "runtime/clock.h"

void kvp_fake_clock_install(struct kvp_fake_clock *fc, uint64_t start_ns)
{
    __atomic_store_n(&fc->ns, start_ns ? start_ns : 1000000000ull, __ATOMIC_RELAXED);
    kvp_clock_set_fake(&fc->ns);
}

void kvp_fake_clock_advance_ns(struct kvp_fake_clock *fc, uint64_t ns)
{
    __atomic_fetch_add(&fc->ns, ns, __ATOMIC_RELAXED); /* threaded actors read it meanwhile */
}

void kvp_fake_clock_advance_ms(struct kvp_fake_clock *fc, uint64_t ms)
{
    __atomic_fetch_add(&fc->ns, ms * 1000000ull, __ATOMIC_RELAXED);
}

void kvp_fake_clock_uninstall(void)
{
    kvp_clock_set_fake(NULL);
}
