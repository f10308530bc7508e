/* err.c — the one table of error codes: kvp_strerror() and kvp_errname(). */
#include "kvpool.h"

struct err_entry {
    const char *name;
    const char *text;
};

/* Indexed by -code. Order must follow enum kvp_err. */
static const struct err_entry err_table[] = {
    [0] = {"KVP_OK", "success"},
    [1] = {"KVP_ERR_NOT_FOUND", "no such object"},
    [2] = {"KVP_ERR_EXISTS", "object already exists"},
    [3] = {"KVP_ERR_NO_SPACE", "no space left in the pool"},
    [4] = {"KVP_ERR_TIMEOUT", "timed out (outstanding transfers were fenced)"},
    [5] = {"KVP_ERR_TRANSFER", "data transfer failed"},
    [6] = {"KVP_ERR_CORRUPT", "checksum mismatch"},
    [7] = {"KVP_ERR_LEASE_EXPIRED", "read lease expired before the transfer finished"},
    [8] = {"KVP_ERR_UNAVAILABLE", "no master quorum available"},
    [9] = {"KVP_ERR_INVALID", "invalid argument"},
    [10] = {"KVP_ERR_TOO_LARGE", "object too large"},
    [11] = {"KVP_ERR_BUFFER_TOO_SMALL", "buffer too small for the object"},
    [12] = {"KVP_ERR_CLOSED", "closed"},
    [13] = {"KVP_ERR_NOMEM", "out of memory"},
    [14] = {"KVP_ERR_MALFORMED", "malformed message"},
    [15] = {"KVP_ERR_VERSION", "unsupported wire version"},
    [16] = {"KVP_ERR_NOT_LEADER", "not the leader"},
    [17] = {"KVP_ERR_LEASED", "object is under a read lease"},
    [18] = {"KVP_ERR_BUSY", "busy (object being written or operation in progress)"},
    [19] = {"KVP_ERR_IO", "I/O error"},
    [20] = {"KVP_ERR_INTERNAL", "internal error"},
    [21] = {"KVP_ERR_FENCE_FAILED", "outstanding transfers could not be fenced"},
    [22] = {"KVP_ERR_CANCELLED", "cancelled"},
    [23] = {"KVP_ERR_UNSUPPORTED", "not supported here"},
    [24] = {"KVP_ERR_PINNED", "object is soft-pinned"},
    [25] = {"KVP_ERR_DEVICE", "GPU copy failed (CUDA driver error)"},
    [26] = {"KVP_ERR_DENIED", "refused: not authenticated or not authorised"},
};

static const struct err_entry *lookup(int err)
{
    if (err > 0 || err <= KVP_ERR__LAST)
        return NULL;
    return &err_table[-err];
}

const char *kvp_strerror(int err)
{
    const struct err_entry *e = lookup(err);
    return e ? e->text : "unknown error";
}

const char *kvp_errname(int err)
{
    const struct err_entry *e = lookup(err);
    return e ? e->name : "KVP_ERR_UNKNOWN";
}
