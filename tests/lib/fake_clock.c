/* fake_clock.c — see fake_clock.h. */
#include "tests/lib/fake_clock.h"

#include <stddef.h>

#include "runtime/clock.h"

void kvp_fake_clock_install(struct kvp_fake_clock *fc, uint64_t start_ns)
{
    fc->ns = start_ns ? start_ns : 1000000000ull;
    kvp_clock_set_fake(&fc->ns);
}

void kvp_fake_clock_advance_ns(struct kvp_fake_clock *fc, uint64_t ns)
{
    fc->ns += ns;
}

void kvp_fake_clock_advance_ms(struct kvp_fake_clock *fc, uint64_t ms)
{
    fc->ns += ms * 1000000ull;
}

void kvp_fake_clock_uninstall(void)
{
    kvp_clock_set_fake(NULL);
}
