/*
 * entry.h — the payload framing of one kvpool Raft entry (a group of commands).
 *
 * Layout, all integers little-endian:
 *   [u32 magic 'KVPR' (bytes 'K','V','P','R')][u8 version = 1][u32 count]
 *   then count × ([u32 len][len bytes]), then 0..7 zero bytes so the total is a multiple of 8.
 * The padding is required by raft 0.15's libuv transport: a follower decodes a multi-entry
 * AppendEntries payload assuming every entry is padded to 8 bytes while the leader sends them
 * unpadded, so any entry whose length is not a multiple of 8 corrupts the entries after it.
 * The decoder trusts nothing: a short header, a count larger than the bytes could hold, a
 * length past the end, a count of 0, or anything after the last command other than the
 * 0..7 zero bytes that reach the next multiple of 8 are all KVP_ERR_MALFORMED; a bad magic is KVP_ERR_MALFORMED; an unknown version is KVP_ERR_VERSION.
 * Pure code: no I/O, no allocation, no raft types; safe from any thread.
 */
#ifndef KVP_RAFTLOG_ENTRY_H
#define KVP_RAFTLOG_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#define KVP_RL_ENTRY_MAGIC 0x5250564Bu /* "KVPR" read as a little-endian u32 */
#define KVP_RL_ENTRY_VERSION 1u
#define KVP_RL_ENTRY_HDR_BYTES 9u
/* Largest single command accepted by the encoder (and by kvp_raftlog_submit). */
#define KVP_RL_ENTRY_MAX_CMD_BYTES (64u << 20)

/** One command: `len` bytes at `data` (borrowed). */
struct kvp_rl_cmd {
    const uint8_t *data;
    size_t len;
};

/**
 * Encoded size (padding included) of an entry holding cmds[0..n). Returns 0 when n == 0, when a command is
 * larger than KVP_RL_ENTRY_MAX_CMD_BYTES, or when the total overflows.
 */
size_t kvp_rl_entry_size(const struct kvp_rl_cmd *cmds, size_t n);

/**
 * Encode cmds[0..n) into buf (cap bytes). On success *written = bytes used (equal to
 * kvp_rl_entry_size()). Errors: KVP_ERR_INVALID (n == 0, NULL args, a command too large),
 * KVP_ERR_BUFFER_TOO_SMALL (cap too small; nothing useful written).
 */
int kvp_rl_entry_encode(uint8_t *buf, size_t cap, const struct kvp_rl_cmd *cmds, size_t n,
                        size_t *written);

/** A validated entry; iterate with kvp_rl_entry_next(). Borrows the decoded buffer. */
struct kvp_rl_entry_iter {
    const uint8_t *p;   /* next length prefix */
    const uint8_t *end; /* one past the last byte */
    uint32_t count;     /* commands in the entry */
    uint32_t left;      /* commands not yet returned */
};

/**
 * Validate the whole entry in buf[0..len) and prepare an iterator. Nothing is returned from
 * a malformed entry: validation covers every length before the first command is handed out.
 * Errors: KVP_ERR_MALFORMED, KVP_ERR_VERSION, KVP_ERR_INVALID (NULL args).
 */
int kvp_rl_entry_decode(const uint8_t *buf, size_t len, struct kvp_rl_entry_iter *it);

/** Next command of a validated entry: 1 and *cmd set, or 0 at the end. */
int kvp_rl_entry_next(struct kvp_rl_entry_iter *it, struct kvp_rl_cmd *cmd);

/**
 * Group commit's packing rule (raftlog.c pump): queued commands are taken in order into one
 * entry while kvp_rl_group_fits says so, each then counted with kvp_rl_group_add. The first
 * command always fits (an entry holds at least one, however large or costly); a later one fits
 * while the entry has fewer than max_cmds commands, its bytes (each command's len + 4) plus
 * this one's len stay within max_bytes, and its costs plus this one's stay within max_cost.
 */
struct kvp_rl_group {
    uint32_t n;    /* commands taken */
    size_t bytes;  /* their bytes, + 4 each */
    uint64_t cost; /* their costs */
};
int kvp_rl_group_fits(const struct kvp_rl_group *g, size_t len, uint32_t cost, uint32_t max_cmds, size_t max_bytes,
                      uint64_t max_cost);
void kvp_rl_group_add(struct kvp_rl_group *g, size_t len, uint32_t cost);

#endif
