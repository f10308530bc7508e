/*
 * clock.h — time, replaceable by tests.
 *
 * kvp_clock_now_ms/us/ns(): monotonic time (CLOCK_MONOTONIC) unless a test installed a fake.
 * kvp_clock_wall_ms(): wall time in ms since the epoch (CLOCK_REALTIME); used only where a time
 * must mean the same on several hosts (deadlines recorded in Raft commands).
 * kvp_clock_sleep_ms(ms): sleep ms milliseconds of real time (restarted after a signal; never
 * the fake clock), for start-up and tool code, not actors (they use timers).
 * kvp_clock_set_fake(ns_ptr): make now_* read *ns_ptr (a test advances it); NULL restores the
 * real clock. Not for production code paths; the pointer is read with relaxed atomics.
 */
#ifndef KVP_RUNTIME_CLOCK_H
#define KVP_RUNTIME_CLOCK_H

#include <stdint.h>

uint64_t kvp_clock_now_ns(void);
uint64_t kvp_clock_now_us(void);
uint64_t kvp_clock_now_ms(void);
uint64_t kvp_clock_wall_ms(void);
void kvp_clock_set_fake(const uint64_t *ns);
void kvp_clock_sleep_ms(uint32_t ms);

#endif
