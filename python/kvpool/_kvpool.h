/*
 * _kvpool.h — what the extension's C files share (_kvpool.c: the Store type and the module;
 * _kvpool_args.c: error numbers and argument helpers). Include after <Python.h>. Private to
 * the module: hidden, so the .so exports only PyInit__kvpool.
 */
#ifndef KVP_PY_KVPOOL_H
#define KVP_PY_KVPOOL_H

#include <stdint.h>

#include "kvpool.h"

#define KVPY_PRIVATE __attribute__((visibility("hidden")))

/* the log lines' actor name */
#define ACT "python"

/* Mooncake's numbers (the callers test these) */
#define MC_NO_HANDLE (-200)
#define MC_INVALID (-600)
#define MC_NOT_FOUND (-704)
#define MC_EXISTS (-705)
#define MC_HAS_LEASE (-706)
#define MC_LEASE_EXPIRED (-707)
#define MC_TRANSFER (-800)
#define MC_CHECKSUM (-801)
#define MC_RPC (-900)
#define MC_TIMEOUT (-901)
/* A kvpool code with no Mooncake counterpart: -1000 + code (KVP_ERR_NOMEM -13 -> -1013). */
#define MC_KVP_BASE (-1000)

/** A kvpool code (kvp_err, or >= 0 passed through) as Mooncake's number. */
KVPY_PRIVATE long map_code(long rc);
/** A put's code: write-once puts of an existing key are success for the callers. */
KVPY_PRIVATE long map_put(long rc);

/* The keys of a batch call: n keys, their UTF-8 pointers and the objects holding them. */
typedef struct {
    Py_ssize_t n;
    const char **keys;
    PyObject **hold;
} Keys;

KVPY_PRIVATE const char *TN(PyObject *o);
KVPY_PRIVATE const char *key_of(PyObject *o, const char *arg, Py_ssize_t idx, PyObject **holder);
KVPY_PRIVATE PyObject *as_seq(PyObject *o, const char *arg);
KVPY_PRIVATE PyObject *seq_item(PyObject *seq, Py_ssize_t i);
KVPY_PRIVATE Py_ssize_t seq_len(PyObject *seq);
KVPY_PRIVATE void keys_free(Keys *k);
KVPY_PRIVATE int keys_get(PyObject *o, const char *arg, Keys *k);
KVPY_PRIVATE int u64_of(PyObject *o, const char *arg, Py_ssize_t i, Py_ssize_t j, uint64_t *out);
KVPY_PRIVATE int u64_list(PyObject *o, const char *arg, Py_ssize_t *n, uint64_t **out);
KVPY_PRIVATE int opts_of(PyObject *cfg, kvp_put_opts *o, PyObject **hold, int *bad);
KVPY_PRIVATE PyObject *list_of(Py_ssize_t n, long code);
KVPY_PRIVATE PyObject *list_i64(Py_ssize_t n, const int64_t *r, int put);

#endif
