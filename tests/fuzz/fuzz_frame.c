/* fuzz_frame.c — libFuzzer target for kvp_frame_decode(): the first 40 bytes either decode or
 * are refused with KVP_ERR_MALFORMED / KVP_ERR_VERSION; a decoded header re-encodes to the
 * same 40 bytes (every field round-trips, reserved is 0). */
#include <string.h>

#include "kvpool.h"
#include "tests/fuzz/fuzz_common.h"
#include "wire/envelope.h"

unsigned long kvp_fuzz_decoded;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < KVP_FRAME_HEADER_BYTES)
        return 0; /* the decoder takes exactly a 40-byte header; callers read that much first */
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    memcpy(hdr, data, sizeof(hdr));
    struct kvp_frame f;
    memset(&f, 0xa5, sizeof(f));
    int rc = kvp_frame_decode(hdr, &f);
    if (rc != KVP_OK) {
        FUZZ_CHECK(rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION);
        return 0;
    }
    kvp_fuzz_decoded++;
    FUZZ_CHECK(f.op >= KVP_FRAME_READ && f.op <= KVP_FRAME_RDMA_HELLO_RESP);
    FUZZ_CHECK(f.length <= KVP_FRAME_MAX_LENGTH);
    FUZZ_CHECK(f.deadline == 0 || f.op == KVP_FRAME_WRITE); /* a deadline only on a WRITE */
    uint8_t again[KVP_FRAME_HEADER_BYTES];
    kvp_frame_encode(&f, again);
    FUZZ_CHECK(memcmp(again, hdr, sizeof(hdr)) == 0);
    return 0;
}
