/*
 * fake_clock.h — a test clock for runtime/clock.h.
 *
 * kvp_fake_clock_install() makes kvp_clock_now_*() read fc->ns (starting at start_ns, which
 * must be > 0 so deadlines computed from it are positive); kvp_fake_clock_advance_ms() moves it
 * forward; kvp_fake_clock_uninstall() restores the real monotonic clock.
 * Threads: advance only while no other thread reads the clock (clock.c reads the value
 * without atomics), i.e. with manual actors / the actor harness, or before spawning threads.
 */
#ifndef KVP_TESTLIB_FAKE_CLOCK_H
#define KVP_TESTLIB_FAKE_CLOCK_H

#include <stdint.h>

struct kvp_fake_clock {
    uint64_t ns;
};

void kvp_fake_clock_install(struct kvp_fake_clock *fc, uint64_t start_ns);
void kvp_fake_clock_advance_ms(struct kvp_fake_clock *fc, uint64_t ms);
void kvp_fake_clock_advance_ns(struct kvp_fake_clock *fc, uint64_t ns);
void kvp_fake_clock_uninstall(void);

#endif
