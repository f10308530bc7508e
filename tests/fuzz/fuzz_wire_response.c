/* fuzz_wire_response.c — libFuzzer target for kvp_wire_decode_response():
 * any input either decodes or is
 * refused with KVP_ERR_MALFORMED / KVP_ERR_VERSION and no output; a decoded message
 * re-encodes, and the re-encoding decodes (unless it kept unknown fields, see fuzz_common.h)
 * and re-encodes to the same bytes (fuzz_wire_roundtrip() in fuzz_common.h). */
#include "kvpool.h"
#include "tests/fuzz/fuzz_common.h"
#include "wire/envelope.h"

FUZZ_WIRE_ROUNDTRIP_TARGET(Kvp__Response, response)
