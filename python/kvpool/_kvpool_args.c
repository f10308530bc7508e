/*
 * _kvpool_args.c — the extension's Mooncake error numbers (map_code) and its argument helpers:
 * keys, ints, lists and ReplicateConfig from Python objects, with the TypeError/ValueError
 * naming the argument; declared in _kvpool.h. Split from _kvpool.c (the 1,500-line limit).
 * Every function needs the GIL.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03080000
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "_kvpool.h"
#include "kvpool.h"
#include "runtime/log.h"

/* ------------------------------------------------------------------ error numbers */

long map_code(long rc)
{
    if (rc >= 0)
        return rc;
    switch (rc) {
    case KVP_ERR_NOT_FOUND: return MC_NOT_FOUND;
    case KVP_ERR_EXISTS: return MC_EXISTS;
    case KVP_ERR_NO_SPACE: return MC_NO_HANDLE;
    case KVP_ERR_TIMEOUT: return MC_TIMEOUT;
    case KVP_ERR_TRANSFER: return MC_TRANSFER;
    case KVP_ERR_CORRUPT: return MC_CHECKSUM;
    case KVP_ERR_LEASE_EXPIRED: return MC_LEASE_EXPIRED;
    case KVP_ERR_UNAVAILABLE: return MC_RPC;
    case KVP_ERR_NOT_LEADER: return MC_RPC;
    case KVP_ERR_INVALID: return MC_INVALID;
    case KVP_ERR_TOO_LARGE: return MC_INVALID;
    case KVP_ERR_BUFFER_TOO_SMALL: return MC_INVALID;
    case KVP_ERR_CLOSED: return MC_INVALID;
    case KVP_ERR_UNSUPPORTED: return MC_INVALID;
    case KVP_ERR_LEASED: return MC_HAS_LEASE;
    default:
        if (rc > KVP_ERR__LAST)
            return MC_KVP_BASE + rc;
        return MC_KVP_BASE + KVP_ERR_INTERNAL;
    }
}

/* A put's code: write-once puts of an existing key are success for the callers. */
long map_put(long rc) { return rc == KVP_ERR_EXISTS ? 0 : map_code(rc); }

/* ------------------------------------------------------------------ argument helpers */

/* The name of o's type, for error messages (the limited API has no tp_name). The buffer is
 * per thread and valid until the next call on that thread; callers hold the GIL. */
const char *TN(PyObject *o)
{
    static _Thread_local char buf[96];
    snprintf(buf, sizeof buf, "?");
    PyObject *n = PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__name__");
    PyObject *b = n ? PyUnicode_AsUTF8String(n) : NULL;
    if (b)
        snprintf(buf, sizeof buf, "%s", PyBytes_AsString(b));
    else
        PyErr_Clear();
    Py_XDECREF(b);
    Py_XDECREF(n);
    return buf;
}

/* A key as UTF-8 (str, or bytes as given). *holder keeps the storage alive (new reference). */
const char *key_of(PyObject *o, const char *arg, Py_ssize_t idx, PyObject **holder)
{
    *holder = NULL;
    if (PyUnicode_Check(o) || PyBytes_Check(o)) {
        if (PyUnicode_Check(o)) {
            *holder = PyUnicode_AsUTF8String(o);
            if (!*holder && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) { /* a lone surrogate */
                PyErr_Clear();
                if (idx >= 0)
                    PyErr_Format(PyExc_ValueError, "%s[%zd] cannot be encoded as UTF-8 (a lone surrogate)", arg, idx);
                else
                    PyErr_Format(PyExc_ValueError, "%s cannot be encoded as UTF-8 (a lone surrogate)", arg);
                return NULL;
            }
        } else {
            Py_INCREF(o);
            *holder = o;
        }
        if (!*holder)
            return NULL;
        const char *k = PyBytes_AsString(*holder);
        if (k && (Py_ssize_t)strlen(k) != PyBytes_Size(*holder)) { /* the C API would see a shorter key */
            Py_CLEAR(*holder);
            if (idx >= 0)
                PyErr_Format(PyExc_ValueError, "%s[%zd] contains a NUL character", arg, idx);
            else
                PyErr_Format(PyExc_ValueError, "%s contains a NUL character", arg);
            return NULL;
        }
        return k;
    }
    if (idx >= 0)
        PyErr_Format(PyExc_TypeError, "%s[%zd] must be str, not %s", arg, idx, TN(o));
    else
        PyErr_Format(PyExc_TypeError, "%s must be str, not %s", arg, TN(o));
    return NULL;
}

/* A list or tuple (a new reference to a list or tuple); TypeError naming arg otherwise. */
PyObject *as_seq(PyObject *o, const char *arg)
{
    if (PyList_Check(o) || PyTuple_Check(o)) {
        Py_INCREF(o);
        return o;
    }
    PyErr_Format(PyExc_TypeError, "%s must be a list, not %s", arg, TN(o));
    return NULL;
}

PyObject *seq_item(PyObject *seq, Py_ssize_t i)
{
    return PyList_Check(seq) ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i); /* borrowed */
}

Py_ssize_t seq_len(PyObject *seq) { return PyList_Check(seq) ? PyList_Size(seq) : PyTuple_Size(seq); }

void keys_free(Keys *k)
{
    for (Py_ssize_t i = 0; i < k->n && k->hold; i++)
        Py_XDECREF(k->hold[i]);
    PyMem_Free(k->hold);
    PyMem_Free((void *)k->keys);
    k->keys = NULL;
    k->hold = NULL;
}

int keys_get(PyObject *o, const char *arg, Keys *k)
{
    k->n = 0;
    k->keys = NULL;
    k->hold = NULL;
    PyObject *seq = as_seq(o, arg);
    if (!seq)
        return -1;
    Py_ssize_t n = seq_len(seq);
    k->keys = PyMem_Calloc(n ? n : 1, sizeof *k->keys);
    k->hold = PyMem_Calloc(n ? n : 1, sizeof *k->hold);
    if (!k->keys || !k->hold) {
        Py_DECREF(seq);
        keys_free(k);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        k->keys[i] = key_of(seq_item(seq, i), arg, i, &k->hold[i]);
        k->n = i + 1;
        if (!k->keys[i]) {
            Py_DECREF(seq);
            keys_free(k);
            return -1;
        }
    }
    k->n = n;
    Py_DECREF(seq);
    return 0;
}

/* An address (int >= 0) or a size (int >= 0). */
int u64_of(PyObject *o, const char *arg, Py_ssize_t i, Py_ssize_t j, uint64_t *out)
{
    /* int, or an integer that is not an int (numpy.uint64, torch's and numpy's index types):
     * anything with __index__, as pybind11 and so Mooncake's class accept it. Not float. */
    PyObject *held = NULL;
    if (!PyLong_Check(o) && PyIndex_Check(o)) {
        held = PyNumber_Index(o);
        if (!held)
            PyErr_Clear();
        else
            o = held;
    }
    if (!PyLong_Check(o)) {
        if (j >= 0)
            PyErr_Format(PyExc_TypeError, "%s[%zd][%zd] must be int, not %s", arg, i, j, TN(o));
        else if (i >= 0)
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be int, not %s", arg, i, TN(o));
        else
            PyErr_Format(PyExc_TypeError, "%s must be int, not %s", arg, TN(o));
        Py_XDECREF(held);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    Py_XDECREF(held);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        if (j >= 0)
            PyErr_Format(PyExc_ValueError, "%s[%zd][%zd] must be an int in [0, 2**64)", arg, i, j);
        else if (i >= 0)
            PyErr_Format(PyExc_ValueError, "%s[%zd] must be an int in [0, 2**64)", arg, i);
        else
            PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", arg);
        return -1;
    }
    *out = v;
    return 0;
}

/* A flat list of n ints (ptrs or sizes) into out[] (PyMem). */
int u64_list(PyObject *o, const char *arg, Py_ssize_t *n, uint64_t **out)
{
    *out = NULL;
    PyObject *seq = as_seq(o, arg);
    if (!seq)
        return -1;
    *n = seq_len(seq);
    *out = PyMem_Calloc(*n ? *n : 1, sizeof **out);
    if (!*out) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (u64_of(seq_item(seq, i), arg, i, -1, &(*out)[i]) < 0) {
            Py_DECREF(seq);
            PyMem_Free(*out);
            *out = NULL;
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* ReplicateConfig (or None) -> kvp_put_opts. The preferred segment string lives in *hold.
 * Returns 0, or -1 with an exception set (a wrong type). A config kvpool cannot honour gives
 * *bad = MC_INVALID (a return code, not an exception), with a log line. */
int opts_of(PyObject *cfg, kvp_put_opts *o, PyObject **hold, int *bad)
{
    memset(o, 0, sizeof *o);
    *hold = NULL;
    *bad = 0;
    if (!cfg || cfg == Py_None)
        return 0;
    PyObject *v = PyObject_GetAttrString(cfg, "replica_num");
    if (!v) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "config must be a ReplicateConfig or None, not %s", TN(cfg));
        return -1;
    }
    long rn = PyLong_Check(v) ? PyLong_AsLong(v) : -1;
    Py_DECREF(v);
    if (rn == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (rn < 1 || rn > 16) {
        kvp_log_warn(ACT, "config.replica_num=%ld: must be an int in [1, 16] (-600)", rn);
        *bad = MC_INVALID;
        return 0;
    }
    o->replica_num = (uint32_t)rn;
    v = PyObject_GetAttrString(cfg, "_kvp_soft_pin");
    if (v) {
        o->soft_pin = PyObject_IsTrue(v) == 1;
        Py_DECREF(v);
    } else {
        PyErr_Clear();
    }
    v = PyObject_GetAttrString(cfg, "_kvp_preferred");
    if (!v) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1; /* e.g. TypeError: preferred_segment is not a str */
        PyErr_Clear(); /* a config object of another kind: no preference */
    } else if (PyUnicode_Check(v) && PyUnicode_GetLength(v) > 0) {
        *hold = PyUnicode_AsUTF8String(v);
        if (!*hold) {
            Py_DECREF(v);
            return -1;
        }
        o->preferred_segment = PyBytes_AsString(*hold);
    }
    Py_XDECREF(v);
    v = PyObject_GetAttrString(cfg, "_kvp_invalid");
    if (v) {
        if (PyObject_IsTrue(v) == 1) {
            kvp_log_warn(ACT, "config: soft_pin_ttl_ms set without SoftPinAction.ENABLE (-600)");
            *bad = MC_INVALID;
        }
        Py_DECREF(v);
    } else {
        PyErr_Clear();
    }
    return 0;
}

/* A list of n copies of code. */
PyObject *list_of(Py_ssize_t n, long code)
{
    PyObject *l = PyList_New(n);
    for (Py_ssize_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromLong(code);
        if (!v || PyList_SetItem(l, i, v) < 0) {
            Py_DECREF(l);
            return NULL;
        }
    }
    return l;
}

PyObject *list_i64(Py_ssize_t n, const int64_t *r, int put)
{
    PyObject *l = PyList_New(n);
    for (Py_ssize_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(put ? map_put((long)r[i]) : r[i] < 0 ? map_code((long)r[i]) : r[i]);
        if (!v || PyList_SetItem(l, i, v) < 0) {
            Py_DECREF(l);
            return NULL;
        }
    }
    return l;
}
