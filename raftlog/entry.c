/* entry.c — the Raft entry framing codec (see entry.h) and the EV_APPLIED_BATCH record reader
 * (raftlog.h). Pure, no allocation. */
#include "raftlog/entry.h"

#include <string.h>

#include "kvpool.h"
#include "raftlog/raftlog.h"

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

size_t kvp_rl_entry_size(const struct kvp_rl_cmd *cmds, size_t n)
{
    if (cmds == NULL || n == 0 || n > UINT32_MAX)
        return 0;
    size_t total = KVP_RL_ENTRY_HDR_BYTES;
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].len > KVP_RL_ENTRY_MAX_CMD_BYTES)
            return 0;
        size_t add = 4 + cmds[i].len;
        if (total > SIZE_MAX - add)
            return 0;
        total += add;
    }
    size_t pad = (8 - total % 8) % 8;
    if (total > SIZE_MAX - pad)
        return 0;
    return total + pad;
}

int kvp_rl_entry_encode(uint8_t *buf, size_t cap, const struct kvp_rl_cmd *cmds, size_t n,
                        size_t *written)
{
    if (buf == NULL || written == NULL)
        return KVP_ERR_INVALID;
    size_t need = kvp_rl_entry_size(cmds, n);
    if (need == 0)
        return KVP_ERR_INVALID;
    if (cap < need)
        return KVP_ERR_BUFFER_TOO_SMALL;
    uint8_t *p = buf;
    put_u32(p, KVP_RL_ENTRY_MAGIC);
    p[4] = (uint8_t)KVP_RL_ENTRY_VERSION;
    put_u32(p + 5, (uint32_t)n);
    p += KVP_RL_ENTRY_HDR_BYTES;
    for (size_t i = 0; i < n; i++) {
        put_u32(p, (uint32_t)cmds[i].len);
        p += 4;
        if (cmds[i].len > 0)
            memcpy(p, cmds[i].data, cmds[i].len);
        p += cmds[i].len;
    }
    memset(p, 0, need - (size_t)(p - buf)); /* padding to a multiple of 8 */
    *written = need;
    return KVP_OK;
}

int kvp_rl_entry_decode(const uint8_t *buf, size_t len, struct kvp_rl_entry_iter *it)
{
    if (it == NULL || (buf == NULL && len > 0))
        return KVP_ERR_INVALID;
    memset(it, 0, sizeof(*it));
    if (len < KVP_RL_ENTRY_HDR_BYTES)
        return KVP_ERR_MALFORMED;
    if (get_u32(buf) != KVP_RL_ENTRY_MAGIC)
        return KVP_ERR_MALFORMED;
    if (buf[4] != KVP_RL_ENTRY_VERSION)
        return KVP_ERR_VERSION;
    uint32_t count = get_u32(buf + 5);
    size_t rest = len - KVP_RL_ENTRY_HDR_BYTES;
    /* Every command needs at least its 4-byte length: reject impossible counts up front. */
    if (count == 0 || count > rest / 4)
        return KVP_ERR_MALFORMED;
    const uint8_t *p = buf + KVP_RL_ENTRY_HDR_BYTES;
    const uint8_t *end = buf + len;
    for (uint32_t i = 0; i < count; i++) {
        if ((size_t)(end - p) < 4)
            return KVP_ERR_MALFORMED;
        uint32_t l = get_u32(p);
        p += 4;
        if (l > KVP_RL_ENTRY_MAX_CMD_BYTES || (size_t)(end - p) < l)
            return KVP_ERR_MALFORMED;
        p += l;
    }
    /* Only the zero padding up to the next multiple of 8 may follow the last command. */
    size_t tail = (size_t)(end - p);
    if (tail >= 8 || len % 8 != 0)
        return KVP_ERR_MALFORMED;
    for (size_t i = 0; i < tail; i++)
        if (p[i] != 0)
            return KVP_ERR_MALFORMED;
    it->p = buf + KVP_RL_ENTRY_HDR_BYTES;
    it->end = end;
    it->count = count;
    it->left = count;
    return KVP_OK;
}

int kvp_rl_entry_next(struct kvp_rl_entry_iter *it, struct kvp_rl_cmd *cmd)
{
    if (it == NULL || cmd == NULL || it->left == 0)
        return 0;
    uint32_t l = get_u32(it->p);
    cmd->data = it->p + 4;
    cmd->len = l;
    it->p += 4 + (size_t)l;
    it->left--;
    return 1;
}

/* ---- EV_APPLIED_BATCH records (raftlog.h, kvp_raftlog_applied_next) ---- */

int kvp_raftlog_applied_next(const uint8_t *data, size_t len, size_t *pos, uint64_t *corr, int32_t *status,
                             const uint8_t **res, size_t *res_len)
{
    if (*pos >= len)
        return 0;
    if (data == NULL || len - *pos < 16)
        return KVP_ERR_MALFORMED;
    const uint8_t *p = data + *pos;
    uint64_t c = 0;
    uint32_t st = 0, n = 0;
    for (int i = 0; i < 8; i++)
        c |= (uint64_t)p[i] << (8 * i);
    for (int i = 0; i < 4; i++) {
        st |= (uint32_t)p[8 + i] << (8 * i);
        n |= (uint32_t)p[12 + i] << (8 * i);
    }
    if (len - *pos - 16 < n)
        return KVP_ERR_MALFORMED;
    *corr = c;
    *status = (int32_t)st;
    *res = n ? p + 16 : NULL;
    *res_len = n;
    *pos += 16 + (size_t)n;
    return 1;
}

int kvp_rl_group_fits(const struct kvp_rl_group *g, size_t len, uint32_t cost, uint32_t max_cmds, size_t max_bytes,
                      uint64_t max_cost)
{
    if (g->n == 0)
        return 1;
    return g->n < max_cmds && g->bytes + len <= max_bytes && g->cost + cost <= max_cost;
}

void kvp_rl_group_add(struct kvp_rl_group *g, size_t len, uint32_t cost)
{
    g->n++;
    g->bytes += len + 4;
    g->cost += cost;
}
