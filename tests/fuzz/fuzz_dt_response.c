/* fuzz_dt_response.c — libFuzzer target for the segment's side of the data-plane token
 * handshake (auth/auth_token.h): the bytes a peer sends first on a data connection.
 * kvp_dt_response_length never claims more than KVP_DT_RESPONSE_MAX bytes and says 0 only for
 * fewer than KVP_DT_RESPONSE_HEAD bytes of a "KVPR" prefix; kvp_dt_verify on the whole
 * response (or on the input as it is) never reads past it and accepts only a response whose
 * claims match this segment, the fixed challenge and an unexpired time. The masters' key and the
 * client's ephemeral key come from fixed seeds, so the seed corpus holds valid responses
 * (written by this file built with -DKVP_FUZZ_DT_WRITE_SEED: see its main at the end). */
#include <sodium.h>
#include <string.h>

#include "auth/auth_token.h"
#include "kvpool.h"
#include "tests/fuzz/fuzz_common.h"

unsigned long kvp_fuzz_decoded;

#define FUZZ_SEG 42u
#define FUZZ_NOW_MS 1000000ull

static void fixed_keys(uint8_t mpk[32], uint8_t msk[64], uint8_t epk[32], uint8_t esk[64], uint8_t ch[KVP_DT_CHALLENGE_BYTES])
{
    uint8_t seed[32];
    memset(seed, 1, sizeof seed);
    crypto_sign_seed_keypair(mpk, msk, seed);
    memset(seed, 2, sizeof seed);
    crypto_sign_seed_keypair(epk, esk, seed);
    memcpy(ch, "KVPC", 4);
    ch[4] = KVP_DT_VERSION;
    ch[5] = ch[6] = ch[7] = 0;
    ch[8] = FUZZ_SEG;
    ch[9] = ch[10] = ch[11] = 0;
    memset(ch + 12, 0x5a, KVP_DT_NONCE_BYTES);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t mpk[32], msk[64], epk[32], esk[64], ch[KVP_DT_CHALLENGE_BYTES];
    static int ready;
    if (!ready) {
        FUZZ_CHECK(kvp_dt_init() == KVP_OK);
        fixed_keys(mpk, msk, epk, esk, ch);
        ready = 1;
    }
    int total = kvp_dt_response_length(data, size);
    FUZZ_CHECK(total == KVP_ERR_MALFORMED || total >= 0);
    FUZZ_CHECK(total <= (int)KVP_DT_RESPONSE_MAX);
    if (total == 0)
        FUZZ_CHECK(size < KVP_DT_RESPONSE_HEAD);
    const uint8_t(*keys)[KVP_DT_PK_BYTES] = (const uint8_t(*)[KVP_DT_PK_BYTES])mpk;
    struct kvp_dt_claims c;
    const char *why = NULL;
    /* The input as given (any length), then its first `total` bytes when that many are there. */
    int rc = kvp_dt_verify(ch, data, size, FUZZ_SEG, FUZZ_NOW_MS, keys, 1, &c, &why);
    FUZZ_CHECK(rc == KVP_OK || rc == KVP_ERR_DENIED || rc == KVP_ERR_MALFORMED);
    FUZZ_CHECK(why != NULL);
    if (total > 0 && (size_t)total < size)
        rc = kvp_dt_verify(ch, data, (size_t)total, FUZZ_SEG, FUZZ_NOW_MS, keys, 1, &c, &why);
    if (rc == KVP_OK) {
        kvp_fuzz_decoded++;
        FUZZ_CHECK(c.segment_id == FUZZ_SEG);
        FUZZ_CHECK(c.expires_ms > FUZZ_NOW_MS);
        FUZZ_CHECK(memchr(c.tenant, 0, sizeof c.tenant) != NULL);
        FUZZ_CHECK(memcmp(c.client_pk, epk, 32) == 0); /* only the fixed client can answer */
    }
    return 0;
}

#ifdef KVP_FUZZ_DT_WRITE_SEED
/* cc -DKVP_FUZZ_DT_WRITE_SEED ... : write a valid response (tenant argv[2]) to argv[1]. */
int main(int argc, char **argv)
{
    uint8_t mpk[32], msk[64], epk[32], esk[64], ch[KVP_DT_CHALLENGE_BYTES];
    if (argc < 3 || kvp_dt_init() != KVP_OK)
        return 2;
    fixed_keys(mpk, msk, epk, esk, ch);
    struct kvp_dt_claims c = {.segment_id = FUZZ_SEG, .expires_ms = 1ull << 62};
    memcpy(c.client_pk, epk, 32);
    memset(c.client_id, 7, sizeof c.client_id);
    snprintf(c.tenant, sizeof c.tenant, "%s", argv[2]);
    uint8_t tok[KVP_DT_TOKEN_MAX], resp[KVP_DT_RESPONSE_MAX];
    int tl = kvp_dt_issue(mpk, msk, &c, tok, sizeof tok);
    int rl = tl > 0 ? kvp_dt_respond(ch, tok, (size_t)tl, esk, resp, sizeof resp) : -1;
    FILE *f = fopen(argv[1], "wb");
    if (rl <= 0 || !f || fwrite(resp, 1, (size_t)rl, f) != (size_t)rl)
        return 1;
    fclose(f);
    return 0;
}
#endif
