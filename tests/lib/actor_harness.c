/* actor_harness.c — see actor_harness.h. */
#include "tests/lib/actor_harness.h"

#include <string.h>

#include "kvpool.h"

int kvp_th_init(struct kvp_th *th, const struct kvp_rt_spec *spec)
{
    memset(th, 0, sizeof(*th));
    kvp_fake_clock_install(&th->clock, 1000000000ull);
    int rc = kvp_rt_sink_new(&th->probe, "probe");
    if (rc)
        goto fail;
    rc = kvp_rt_spawn_manual(&th->actor, spec, th->probe);
    if (rc)
        goto fail;
    return KVP_OK;
fail:
    kvp_rt_destroy(&th->probe);
    kvp_fake_clock_uninstall();
    return rc;
}

int kvp_th_fini(struct kvp_th *th)
{
    int rc = KVP_OK;
    if (th->actor) {
        rc = kvp_rt_stop(th->actor);
        kvp_rt_destroy(&th->actor);
    }
    kvp_rt_destroy(&th->probe);
    kvp_fake_clock_uninstall();
    return rc;
}

int kvp_th_run(struct kvp_th *th)
{
    return kvp_rt_poll(th->actor);
}

int kvp_th_send(struct kvp_th *th, uint64_t hid, uint32_t type, uint64_t arg, void **payload,
                kvp_rt_free_fn free_fn)
{
    int rc = kvp_rt_send(th->actor, hid, type, arg, payload, free_fn);
    return rc ? rc : kvp_rt_poll(th->actor);
}

int kvp_th_request(struct kvp_th *th, uint64_t hid, uint32_t type, uint64_t arg, void **payload,
                   kvp_rt_free_fn free_fn, uint64_t *corr)
{
    uint64_t c = ++th->next_corr;
    int rc = kvp_rt_request_from(th->probe, th->actor, hid, type, arg, payload, free_fn, c);
    if (rc)
        return rc;
    if (corr)
        *corr = c;
    return kvp_rt_poll(th->actor);
}

int kvp_th_advance_ms(struct kvp_th *th, uint64_t ms)
{
    kvp_fake_clock_advance_ms(&th->clock, ms);
    return kvp_rt_poll(th->actor);
}

int kvp_th_take(struct kvp_th *th, struct kvp_rt_msg **msg)
{
    return kvp_rt_recv(th->probe, 0, msg);
}

size_t kvp_th_captured(struct kvp_th *th)
{
    return kvp_rt_queued(th->probe);
}
