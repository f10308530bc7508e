/*
 * test_auth_scope.c — auth/auth_scope.c and the refusal log (auth/auth.h), pure: a tenant's keys
 * are scoped in every keyed request, roles refuse what they may not ask, a key holding the
 * separator is refused, admin passes unchanged; the refusal log holds back repeats.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth_scope.h"
#include "kvpool.h"
#include "wire/arena.h"
#include "wire/envelope.h"

static Kvp__Request *keyed(Kvp__Request__BodyCase b, const char *key)
{
    Kvp__Request *r = calloc(1, sizeof *r);
    kvp__request__init(r);
    r->body_case = b;
    char **keys = calloc(1, sizeof *keys);
    keys[0] = strdup(key);
    if (b == KVP__REQUEST__BODY_EXISTS) {
        r->exists = calloc(1, sizeof *r->exists);
        kvp__exists_req__init(r->exists);
        r->exists->keys = keys;
        r->exists->n_keys = 1;
    } else if (b == KVP__REQUEST__BODY_PUT_START) {
        r->put_start = calloc(1, sizeof *r->put_start);
        kvp__put_start_req__init(r->put_start);
        r->put_start->items = calloc(1, sizeof *r->put_start->items);
        r->put_start->items[0] = calloc(1, sizeof **r->put_start->items);
        kvp__put_start_item__init(r->put_start->items[0]);
        r->put_start->items[0]->key = keys[0];
        r->put_start->n_items = 1;
        free(keys);
    }
    return r;
}

static const char *first_key(Kvp__Request *r)
{
    return r->body_case == KVP__REQUEST__BODY_EXISTS ? r->exists->keys[0] : r->put_start->items[0]->key;
}

static void test_auth_scope_tenant_keys_prefixed(void **state)
{
    struct kvp_auth_principal p = {.role = KVP_AUTH_ROLE_CLIENT};
    strcpy(p.tenant, "ta");
    char why[200];
    Kvp__Request__BodyCase cases[] = {KVP__REQUEST__BODY_EXISTS, KVP__REQUEST__BODY_PUT_START};
    for (int i = 0; i < 2; i++) {
        Kvp__Request *r = keyed(cases[i], "k1");
        assert_int_equal(kvp_auth_scope_request(r, &p, why, sizeof why), KVP_OK);
        assert_string_equal(first_key(r), "ta\x1f" "k1");
        char t[KVP_AUTH_TENANT_MAX];
        assert_int_equal(kvp_auth_key_tenant(first_key(r), t, sizeof t), 3);
        assert_string_equal(t, "ta");
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
}

static void test_auth_scope_default_tenant_and_admin_unchanged(void **state)
{
    char why[200];
    struct kvp_auth_principal def = {.role = KVP_AUTH_ROLE_CLIENT}, adm = {.role = KVP_AUTH_ROLE_ADMIN};
    Kvp__Request *r = keyed(KVP__REQUEST__BODY_EXISTS, "k1");
    assert_int_equal(kvp_auth_scope_request(r, &def, why, sizeof why), KVP_OK);
    assert_string_equal(first_key(r), "k1");
    protobuf_c_message_free_unpacked(&r->base, NULL);
    r = keyed(KVP__REQUEST__BODY_EXISTS, "ta\x1fk1");
    assert_int_equal(kvp_auth_scope_request(r, &adm, why, sizeof why), KVP_OK);
    assert_string_equal(first_key(r), "ta\x1fk1");
    protobuf_c_message_free_unpacked(&r->base, NULL);
    assert_int_equal(kvp_auth_key_tenant("plain", why, sizeof why), 0);
    assert_string_equal(why, "");
}

static void test_auth_scope_separator_in_key_denied(void **state)
{
    char why[200] = "";
    struct kvp_auth_principal p = {.role = KVP_AUTH_ROLE_CLIENT};
    Kvp__Request *r = keyed(KVP__REQUEST__BODY_EXISTS, "tb\x1fk1");
    assert_int_equal(kvp_auth_scope_request(r, &p, why, sizeof why), KVP_ERR_DENIED);
    assert_non_null(strstr(why, "0x1f"));
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_auth_scope_roles(void **state)
{
    char why[200];
    struct kvp_auth_principal cl = {.role = KVP_AUTH_ROLE_CLIENT}, seg = {.role = KVP_AUTH_ROLE_SEGMENT};
    strcpy(cl.tenant, "ta");
    Kvp__Request r = KVP__REQUEST__INIT;
    Kvp__Request__BodyCase denied_client[] = {KVP__REQUEST__BODY_TRANSFER_LEADER, KVP__REQUEST__BODY_ADD_MEMBER,
                                              KVP__REQUEST__BODY_REMOVE_MEMBER, KVP__REQUEST__BODY_SEGMENT_LOST,
                                              KVP__REQUEST__BODY_REMOVE_ALL, KVP__REQUEST__BODY_EVICT_SCAN,
                                              KVP__REQUEST__BODY_REPAIR_SCAN};
    for (size_t i = 0; i < sizeof denied_client / sizeof denied_client[0]; i++) {
        r.body_case = denied_client[i];
        assert_int_equal(kvp_auth_scope_request(&r, &cl, why, sizeof why), KVP_ERR_DENIED);
    }
    r.body_case = KVP__REQUEST__BODY_REMOVE_ALL;
    struct kvp_auth_principal owner = {.role = KVP_AUTH_ROLE_CLIENT};
    assert_int_equal(kvp_auth_scope_request(&r, &owner, why, sizeof why), KVP_OK);
    assert_int_equal(kvp_auth_scope_request(&r, &seg, why, sizeof why), KVP_ERR_DENIED);
    r.body_case = KVP__REQUEST__BODY_MEMBERS;
    assert_int_equal(kvp_auth_scope_request(&r, &cl, why, sizeof why), KVP_OK);
    r.body_case = KVP__REQUEST__BODY_TRANSFER_LEADER;
    assert_int_equal(kvp_auth_scope_request(&r, NULL, why, sizeof why), KVP_OK); /* auth off */
}

static void test_auth_ratelog_holds_back_repeats(void **state)
{
    struct kvp_auth_ratelog r;
    memset(&r, 0, sizeof r);
    uint64_t sup = 0;
    assert_true(kvp_auth_ratelog_allow(&r, "10.0.0.1", 1000, &sup));
    assert_false(kvp_auth_ratelog_allow(&r, "10.0.0.1", 2000, &sup));
    assert_false(kvp_auth_ratelog_allow(&r, "10.0.0.1", 5000, &sup));
    assert_true(kvp_auth_ratelog_allow(&r, "10.0.0.2", 5000, &sup));
    assert_int_equal(sup, 2);
    assert_true(kvp_auth_ratelog_allow(&r, "10.0.0.1", 11001, &sup));
    /* at most 20 lines a minute overall */
    int allowed = 0;
    char a[32];
    for (int i = 0; i < 100; i++) {
        snprintf(a, sizeof a, "10.1.0.%d", i);
        allowed += kvp_auth_ratelog_allow(&r, a, 12000, &sup);
    }
    assert_int_equal(allowed, 17);
}

static void test_auth_names_and_modes(void **state)
{
    bool on = false;
    assert_int_equal(kvp_auth_parse_mode("", &on, "t"), KVP_OK);
    assert_true(on);
    assert_int_equal(kvp_auth_parse_mode("none", &on, "t"), KVP_OK);
    assert_false(on);
    assert_int_equal(kvp_auth_parse_mode("tls", &on, "t"), KVP_ERR_INVALID);
    assert_true(kvp_auth_tenant_valid(""));
    assert_true(kvp_auth_tenant_valid("team-a.1_x"));
    assert_false(kvp_auth_tenant_valid("a/b"));
    assert_false(kvp_auth_tenant_valid("a\x1f"));
    assert_int_equal(kvp_auth_role_parse("segment"), KVP_AUTH_ROLE_SEGMENT);
    assert_int_equal(kvp_auth_role_parse("root"), -1);
    assert_int_equal(kvp_auth_keygen("/nonexistent-dir/x", "x", "client", "", NULL), KVP_ERR_IO);
    assert_int_equal(kvp_auth_keygen("/tmp/x", "x", "root", "", NULL), KVP_ERR_INVALID);
}

/* A request decoded into an arena (the master's request loop) is scoped with the arena's memory:
 * the new keys come from it, the old ones go back to it; nothing is handed to free(). */
struct counting {
    ProtobufCAllocator pb;
    struct kvp_wire_arena *arena;
    int allocs, frees;
};

static void *counting_alloc(void *ctx, size_t n)
{
    struct counting *c = ctx;
    c->allocs++;
    return c->arena->pb.alloc(c->arena->pb.allocator_data, n);
}

static void counting_free(void *ctx, void *p)
{
    struct counting *c = ctx;
    c->frees++;
    c->arena->pb.free(c->arena->pb.allocator_data, p);
}

static void test_auth_scope_with_arena_allocator(void **state)
{
    (void)state;
    struct kvp_auth_principal p = {.role = KVP_AUTH_ROLE_CLIENT};
    strcpy(p.tenant, "tb");
    char why[200];
    struct kvp_wire_arena a;
    assert_int_equal(kvp_wire_arena_init(&a, 1024), KVP_OK);
    struct counting c = {.pb = {counting_alloc, counting_free, NULL}, .arena = &a};
    c.pb.allocator_data = &c;
    Kvp__Request__BodyCase cases[] = {KVP__REQUEST__BODY_EXISTS, KVP__REQUEST__BODY_PUT_START};
    for (int i = 0; i < 2; i++) {
        Kvp__Request *src = keyed(cases[i], "k2");
        uint8_t *enc = NULL;
        size_t len = 0;
        assert_int_equal(kvp_wire_encode_request(src, &enc, &len), KVP_OK);
        protobuf_c_message_free_unpacked(&src->base, NULL);
        Kvp__Request *r = NULL;
        assert_int_equal(kvp_wire_decode_with(KVP_MSG_REQUEST, enc, len, &c.pb, (ProtobufCMessage **)&r), KVP_OK);
        free(enc);
        int allocs = c.allocs, frees = c.frees;
        assert_int_equal(kvp_auth_scope_request_with(r, &c.pb, &p, why, sizeof why), KVP_OK);
        assert_string_equal(first_key(r), "tb\x1f" "k2");
        assert_int_equal(c.allocs - allocs, 1);
        assert_int_equal(c.frees - frees, 1);
        kvp_wire_arena_reset(&a);
    }
    kvp_wire_arena_fini(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_scope_tenant_keys_prefixed),
        cmocka_unit_test(test_auth_scope_with_arena_allocator),
        cmocka_unit_test(test_auth_scope_default_tenant_and_admin_unchanged),
        cmocka_unit_test(test_auth_scope_separator_in_key_denied),
        cmocka_unit_test(test_auth_scope_roles),
        cmocka_unit_test(test_auth_ratelog_holds_back_repeats),
        cmocka_unit_test(test_auth_names_and_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
