/*
 * fuzz_common.h — shared by the fuzz targets (tests/fuzz/fuzz_*.c).
 *
 * Each target defines LLVMFuzzerTestOneInput() and the counter kvp_fuzz_decoded, incremented
 * for every input its decoder accepted. The same file is linked either with libFuzzer
 * (-DKVP_FUZZ=ON, clang) or with fuzz_driver.c, a plain replay/mutation driver that the
 * normal test suite runs (label `fuzz`). FUZZ_CHECK aborts on a broken invariant so both
 * libFuzzer and the driver (under ASan/UBSan or not) report it as a crash.
 */
#ifndef KVP_TESTS_FUZZ_COMMON_H
#define KVP_TESTS_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "kvpool.h"

extern unsigned long kvp_fuzz_decoded;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond);    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/*
 * True if m or any message inside it kept unknown fields. protobuf-c keeps them verbatim and
 * re-emits them, and it accepts an over-long tag varint naming field 0 (e.g. 0x82 0x00) as an
 * unknown field that it then refuses in canonical form; the round-trip invariant is only
 * checked for messages without unknown fields.
 */
static inline int fuzz_has_unknown_fields(const ProtobufCMessage *m)
{
    if (!m)
        return 0;
    if (m->n_unknown_fields)
        return 1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (fuzz_has_unknown_fields(v[k]))
                    return 1;
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        if (fuzz_has_unknown_fields(*(ProtobufCMessage *const *)(base + f->offset)))
            return 1;
    }
    return 0;
}

/*
 * The wire-decoder round trip shared by fuzz_wire_{request,response,command_batch}.c: any input
 * either decodes or is refused with KVP_ERR_MALFORMED / KVP_ERR_VERSION and no output; a decoded
 * message re-encodes, and the re-encoding decodes (unless it kept unknown fields, see
 * fuzz_has_unknown_fields()) and re-encodes to the same bytes; every strict prefix of a valid
 * encoding is refused. dec/enc adapt the typed kvp_wire_{decode,encode}_<name>() calls;
 * FUZZ_WIRE_ROUNDTRIP_TARGET(Type, name) defines them and LLVMFuzzerTestOneInput().
 */
typedef int (*fuzz_wire_dec_fn)(const uint8_t *buf, size_t len, ProtobufCMessage **out);
typedef int (*fuzz_wire_enc_fn)(const ProtobufCMessage *m, uint8_t **out, size_t *out_len);

static inline int fuzz_wire_roundtrip(const uint8_t *data, size_t size, fuzz_wire_dec_fn dec,
                                      fuzz_wire_enc_fn enc)
{
    ProtobufCMessage *m = NULL;
    int rc = dec(data, size, &m);
    if (rc != KVP_OK) {
        FUZZ_CHECK(rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION);
        FUZZ_CHECK(m == NULL);
        return 0;
    }
    kvp_fuzz_decoded++;
    FUZZ_CHECK(m != NULL);
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t l1 = 0, l2 = 0;
    FUZZ_CHECK(enc(m, &b1, &l1) == KVP_OK);
    ProtobufCMessage *m2 = NULL;
    if (dec(b1, l1, &m2) != KVP_OK) {
        /* protobuf-c quirk, see fuzz_has_unknown_fields() */
        FUZZ_CHECK(fuzz_has_unknown_fields(m));
        free(b1);
        protobuf_c_message_free_unpacked(m, NULL);
        return 0;
    }
    FUZZ_CHECK(enc(m2, &b2, &l2) == KVP_OK);
    FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    /* Every strict prefix of a valid encoding is refused. */
    for (size_t cut = 0; cut < l1; cut += 1 + cut / 8) {
        ProtobufCMessage *t = NULL;
        FUZZ_CHECK(dec(b1, cut, &t) == KVP_ERR_MALFORMED && t == NULL);
    }
    free(b1);
    free(b2);
    protobuf_c_message_free_unpacked(m2, NULL);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

#define FUZZ_WIRE_ROUNDTRIP_TARGET(TYPE, NAME)                                                     \
    static int fuzz_dec_##NAME(const uint8_t *buf, size_t len, ProtobufCMessage **out)             \
    {                                                                                              \
        TYPE *m = NULL;                                                                            \
        int rc = kvp_wire_decode_##NAME(buf, len, &m);                                             \
        *out = (ProtobufCMessage *)m;                                                              \
        return rc;                                                                                 \
    }                                                                                              \
    static int fuzz_enc_##NAME(const ProtobufCMessage *m, uint8_t **out, size_t *out_len)          \
    {                                                                                              \
        return kvp_wire_encode_##NAME((const TYPE *)m, out, out_len);                              \
    }                                                                                              \
    unsigned long kvp_fuzz_decoded;                                                                \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)                                   \
    {                                                                                              \
        return fuzz_wire_roundtrip(data, size, fuzz_dec_##NAME, fuzz_enc_##NAME);                  \
    }

#endif
