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

#include <protobuf-c/protobuf-c.h>

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

#endif
