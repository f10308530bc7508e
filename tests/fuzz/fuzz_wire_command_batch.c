/* fuzz_wire_command_batch.c — libFuzzer target for kvp_wire_decode_command_batch():
 * any input either decodes or is
 * refused with KVP_ERR_MALFORMED / KVP_ERR_VERSION and no output; a decoded message
 * re-encodes, and the re-encoding decodes (unless it kept unknown fields, see fuzz_common.h)
 * and re-encodes to the same bytes. */
#include <string.h>

#include "kvpool.h"
#include "tests/fuzz/fuzz_common.h"
#include "wire/envelope.h"

unsigned long kvp_fuzz_decoded;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Kvp__CommandBatch *m = NULL;
    int rc = kvp_wire_decode_command_batch(data, size, &m);
    if (rc != KVP_OK) {
        FUZZ_CHECK(rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION);
        FUZZ_CHECK(m == NULL);
        return 0;
    }
    kvp_fuzz_decoded++;
    FUZZ_CHECK(m != NULL);
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t l1 = 0, l2 = 0;
    FUZZ_CHECK(kvp_wire_encode_command_batch(m, &b1, &l1) == KVP_OK);
    Kvp__CommandBatch *m2 = NULL;
    if (kvp_wire_decode_command_batch(b1, l1, &m2) != KVP_OK) {
        /* protobuf-c quirk, see fuzz_has_unknown_fields() */
        FUZZ_CHECK(fuzz_has_unknown_fields((ProtobufCMessage *)m));
        free(b1);
        protobuf_c_message_free_unpacked((ProtobufCMessage *)m, NULL);
        return 0;
    }
    FUZZ_CHECK(kvp_wire_encode_command_batch(m2, &b2, &l2) == KVP_OK);
    FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    /* Every strict prefix of a valid encoding is refused. */
    for (size_t cut = 0; cut < l1; cut += 1 + cut / 8) {
        Kvp__CommandBatch *t = NULL;
        FUZZ_CHECK(kvp_wire_decode_command_batch(b1, cut, &t) == KVP_ERR_MALFORMED && t == NULL);
    }
    free(b1);
    free(b2);
    protobuf_c_message_free_unpacked((ProtobufCMessage *)m2, NULL);
    protobuf_c_message_free_unpacked((ProtobufCMessage *)m, NULL);
    return 0;
}
