/*
 * _kvpool.c — the CPython extension under the `kvpool` package (python/kvpool/__init__.py).
 *
 * One type, `_kvpool.Store`, wraps a kvp_client and implements the data calls of Mooncake's
 * MooncakeDistributedStore (docs/python.md; the surface is ../shared/clients/mooncake-python.md).
 * The Python class MooncakeDistributedStore subclasses it and adds setup(), descriptors and
 * the pure-Python methods. Built against the limited API (abi3, Python 3.8+): no struct access,
 * no buffer protocol (3.11+ only), keys through PyUnicode_AsUTF8String.
 *
 * Rules kept by every method:
 *  - the GIL is released around every call into libkvpool that can block;
 *  - ordinary failures are return codes (Mooncake's numbers, map_code()); only wrong argument
 *    types raise (TypeError/ValueError naming the argument);
 *  - batch calls return len(keys) entries; a call that cannot run returns len(keys) negatives.
 *
 * Mooncake's error numbers and the argument helpers are in _kvpool_args.c (_kvpool.h).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03080000
#include <Python.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_kvpool.h"
#include "kvpool.h"
#include "runtime/log.h"

/* ------------------------------------------------------------------ the Store object */

typedef struct {
    PyObject_HEAD
    /* The client and the count of calls using it. Many Python threads call one object with the
     * GIL released, and close() may run meanwhile: the client must stay alive until the last
     * call that took it has returned. A mutex-guarded use count is the smallest thing that does
     * it here (no actor owns a Python object); it is held only around the counter updates,
     * never across a libkvpool call. */
    pthread_mutex_t mu;
    pthread_cond_t idle;
    kvp_client *c;         /* NULL before setup and after close */
    unsigned users;        /* calls that took c and have not returned */
    int closing;           /* close() is waiting for users to drop to 0 */
    int closer;            /* a close() owns the client: drains, waits, closes; other closes wait */
    uint64_t local_buffer; /* local_buffer_size: staging bytes for the copying calls */
} Store;

/* Take the client for one call; NULL when not set up (or closing). Needs the GIL? No. */
static kvp_client *take(Store *s)
{
    pthread_mutex_lock(&s->mu);
    kvp_client *c = s->closing ? NULL : s->c;
    if (c)
        s->users++;
    pthread_mutex_unlock(&s->mu);
    return c;
}

static void give(Store *s)
{
    pthread_mutex_lock(&s->mu);
    if (--s->users == 0)
        pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
}

static PyObject *Store_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Store *s = (Store *)alloc(type, 0);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->c = NULL;
    s->users = 0;
    s->closing = 0;
    s->closer = 0;
    s->local_buffer = 0;
    return (PyObject *)s;
}

/* Close the client: drain the embedded segment first when `drain`. Releases the GIL.
 * One close at a time owns the client (s->closer): a close that arrives while another is
 * draining or waiting waits for it to finish, then finds nothing to close. Without that, two
 * closes both drained, the first waited for a wake-up that never came (hang), and the client
 * could be closed twice. */
static int close_client(Store *s, int drain, uint64_t *left_out)
{
    pthread_mutex_lock(&s->mu);
    while (s->closer)
        pthread_cond_wait(&s->idle, &s->mu);
    if (!s->c) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    kvp_client *c = s->c;
    s->closer = 1;
    s->users++; /* the drain below is a call like any other */
    pthread_mutex_unlock(&s->mu);
    uint64_t left = 0;
    int rc = KVP_OK;
    if (drain)
        rc = kvp_client_drain(c, 0, &left);
    if (left_out)
        *left_out = rc == KVP_OK ? 0 : left;
    pthread_mutex_lock(&s->mu);
    s->closing = 1; /* new calls see "not set up" from here on */
    s->users--;
    while (s->users > 0) /* calls in flight finish (each at most its timeout) */
        pthread_cond_wait(&s->idle, &s->mu);
    s->c = NULL;
    pthread_mutex_unlock(&s->mu);
    kvp_client_close(&c);
    pthread_mutex_lock(&s->mu);
    s->closing = 0;
    s->closer = 0;
    pthread_cond_broadcast(&s->idle); /* closes waiting for this one */
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void Store_dealloc(PyObject *self)
{
    Store *s = (Store *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (s->c) {
        /* Garbage-collected while set up: no drain here (it may wait drain_timeout_ms, and this
         * may run at interpreter exit), but the loss must not be silent. */
        char name[256];
        if (kvp_client_segment_name(s->c, name, sizeof name) == KVP_OK)
            kvp_log_warn(ACT, "a store was garbage-collected without close(): its segment %s is dropped "
                         "undrained (the objects whose only copy is there are lost; close() drains first)", name);
        Py_BEGIN_ALLOW_THREADS
        close_client(s, 0, NULL);
        Py_END_ALLOW_THREADS
    }
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    freefunc tfree = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tfree(self);
    Py_DECREF(tp);
}

/* Calls on a store that is not set up, in this process. A thread that keeps polling a closed
 * store (a connector's lookup thread after shutdown) makes hundreds of thousands of them a
 * second: the 1st, 2nd, 4th, 8th... are logged, with the count, instead of every one. */
static _Atomic unsigned long long not_set_up_calls;

static int not_set_up(const char *fn)
{
    unsigned long long n = ++not_set_up_calls;
    if ((n & (n - 1)) == 0)
        kvp_log_warn(ACT, "%s: the store is not set up (or closed): -600 (%llu such call%s in this process; "
                     "logged at powers of two)", fn, n, n == 1 ? "" : "s");
    return MC_INVALID;
}

/* The staging rule of the copying calls: an object of `bytes` needs that much of
 * local_buffer_size (Mooncake copies through a buffer of that size). */
static int staging_ok(Store *s, const char *fn, const char *key, uint64_t bytes)
{
    if (bytes <= s->local_buffer)
        return 1;
    kvp_log_warn(ACT, "%s: key '%.64s': %llu bytes need the client's staging memory, local_buffer_size is %llu "
                 "(-600; the zero-copy calls from registered memory need none)", fn, key ? key : "",
                 (unsigned long long)bytes, (unsigned long long)s->local_buffer);
    return 0;
}

/* ------------------------------------------------------------------ setup / close */

/* _open(items, local_buffer_size): items is a list of (key, value) str pairs for
 * kvp_config_set, in order. Returns 0 or a negative code. */
static PyObject *Store_open(PyObject *self, PyObject *args)
{
    Store *s = (Store *)self;
    PyObject *items;
    unsigned long long lbs;
    if (!PyArg_ParseTuple(args, "OK:_open", &items, &lbs))
        return NULL;
    PyObject *seq = as_seq(items, "items");
    if (!seq)
        return NULL;
    kvp_config *cfg = NULL;
    if (kvp_config_new(&cfg) != KVP_OK) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    /* defaults < KVPOOL_* environment < setup()'s arguments */
    long rc = kvp_config_load_env(cfg) == KVP_OK ? 0 : MC_INVALID;
    for (Py_ssize_t i = 0; i < seq_len(seq) && rc == 0; i++) {
        PyObject *kv = seq_item(seq, i), *kh = NULL, *vh = NULL;
        if (!PyTuple_Check(kv) || PyTuple_Size(kv) != 2) {
            PyErr_SetString(PyExc_TypeError, "items must be (str, str) pairs");
            rc = 1;
            break;
        }
        const char *k = key_of(PyTuple_GetItem(kv, 0), "config key", -1, &kh);
        const char *v = k ? key_of(PyTuple_GetItem(kv, 1), "config value", -1, &vh) : NULL;
        if (!v)
            rc = 1;
        else if (kvp_config_set(cfg, k, v) != KVP_OK)
            rc = MC_INVALID; /* logged by kvp_config_set, naming the key and what is allowed */
        Py_XDECREF(kh);
        Py_XDECREF(vh);
    }
    Py_DECREF(seq);
    if (rc == 1) {
        kvp_config_destroy(&cfg);
        return NULL;
    }
    if (rc == 0) {
        pthread_mutex_lock(&s->mu);
        int open = s->c != NULL || s->closing || s->closer;
        pthread_mutex_unlock(&s->mu);
        if (open) {
            kvp_log_warn(ACT, "setup: this store is already set up (close() it first): -600");
            rc = MC_INVALID;
        }
    }
    if (rc == 0) {
        kvp_client *c = NULL;
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = kvp_client_open(cfg, &c);
        Py_END_ALLOW_THREADS
        if (r == KVP_OK) {
            pthread_mutex_lock(&s->mu);
            if (s->c == NULL && !s->closing && !s->closer) {
                s->c = c;
                s->local_buffer = lbs;
                c = NULL;
            }
            pthread_mutex_unlock(&s->mu);
            if (c) { /* two setups raced: keep the first */
                Py_BEGIN_ALLOW_THREADS
                kvp_client_close(&c);
                Py_END_ALLOW_THREADS
                rc = MC_INVALID;
            }
        } else {
            rc = map_code(r);
        }
    }
    kvp_config_destroy(&cfg);
    return PyLong_FromLong(rc);
}

static PyObject *Store_close(PyObject *self, PyObject *args)
{
    Store *s = (Store *)self;
    uint64_t left = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = close_client(s, 1, &left);
    Py_END_ALLOW_THREADS
    (void)rc; /* kvp_client_drain logged the outcome, with the count of replicas not moved */
    return PyLong_FromLong(0);
}

/* ------------------------------------------------------------------ simple calls */

static PyObject *Store_is_exist(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", NULL};
    PyObject *ko, *kh;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:is_exist", kwl, &ko))
        return NULL;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    kvp_client *c = take((Store *)self);
    long r;
    if (!c) {
        r = not_set_up("is_exist");
    } else {
        Py_BEGIN_ALLOW_THREADS
        r = kvp_exists(c, key);
        Py_END_ALLOW_THREADS
        give((Store *)self);
        r = map_code(r);
    }
    Py_DECREF(kh);
    return PyLong_FromLong(r);
}

/* A batch call with one int per key (kvp_batch_exists, kvp_batch_replica_count): parses `ko` as
 * the key list, runs fn without the GIL, and returns a new list of len(keys) ints (each result
 * through map_code; the call's own error for every key when it failed as a whole; "not set up"
 * codes when the store is closed). NULL with a Python error set on a bad key list. `api` names
 * the Mooncake call in the not-set-up log line. */
static PyObject *batch_int_list(Store *self, PyObject *ko, const char *api,
                                int (*fn)(kvp_client *, size_t, const char *const[], int[]))
{
    Keys k;
    if (keys_get(ko, "keys", &k) < 0)
        return NULL;
    PyObject *out = NULL;
    kvp_client *c = take(self);
    if (!c) {
        out = list_of(k.n, k.n ? not_set_up(api) : 0);
    } else {
        int *r = PyMem_Calloc(k.n ? k.n : 1, sizeof *r);
        int rc = KVP_ERR_NOMEM;
        if (r) {
            Py_BEGIN_ALLOW_THREADS
            rc = fn(c, (size_t)k.n, k.keys, r);
            Py_END_ALLOW_THREADS
        }
        give(self);
        if (rc != KVP_OK) {
            out = list_of(k.n, map_code(rc));
        } else {
            out = PyList_New(k.n);
            for (Py_ssize_t i = 0; out && i < k.n; i++)
                PyList_SetItem(out, i, PyLong_FromLong(map_code(r[i])));
        }
        PyMem_Free(r);
    }
    keys_free(&k);
    return out;
}

static PyObject *Store_batch_is_exist(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"keys", NULL};
    PyObject *ko;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:batch_is_exist", kwl, &ko))
        return NULL;
    return batch_int_list((Store *)self, ko, "batch_is_exist", kvp_batch_exists);
}

static PyObject *Store_get_size(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", NULL};
    PyObject *ko, *kh;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:get_size", kwl, &ko))
        return NULL;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    kvp_client *c = take((Store *)self);
    int64_t r;
    if (!c) {
        r = not_set_up("get_size");
    } else {
        Py_BEGIN_ALLOW_THREADS
        r = kvp_get_size(c, key);
        Py_END_ALLOW_THREADS
        give((Store *)self);
        if (r < 0)
            r = map_code((long)r);
    }
    Py_DECREF(kh);
    return PyLong_FromLongLong(r);
}

static PyObject *Store_remove(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", "force", NULL};
    PyObject *ko, *kh;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:remove", kwl, &ko, &force))
        return NULL;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    kvp_client *c = take((Store *)self);
    long r;
    if (!c) {
        r = not_set_up("remove");
    } else {
        Py_BEGIN_ALLOW_THREADS
        r = kvp_remove(c, key, force != 0);
        Py_END_ALLOW_THREADS
        give((Store *)self);
        r = map_code(r);
    }
    Py_DECREF(kh);
    return PyLong_FromLong(r);
}

static PyObject *Store_remove_all(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"force", NULL};
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:remove_all", kwl, &force))
        return NULL;
    kvp_client *c = take((Store *)self);
    if (!c)
        return PyLong_FromLong(not_set_up("remove_all"));
    uint64_t n = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_remove_all(c, force != 0, &n);
    Py_END_ALLOW_THREADS
    give((Store *)self);
    return rc == KVP_OK ? PyLong_FromUnsignedLongLong(n) : PyLong_FromLong(map_code(rc));
}

static PyObject *Store_register_buffer(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"buffer_ptr", "size", NULL};
    PyObject *po, *so;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:register_buffer", kwl, &po, &so))
        return NULL;
    uint64_t p, n;
    if (u64_of(po, "buffer_ptr", -1, -1, &p) < 0 || u64_of(so, "size", -1, -1, &n) < 0)
        return NULL;
    kvp_client *c = take((Store *)self);
    if (!c)
        return PyLong_FromLong(not_set_up("register_buffer"));
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_register_buffer_overlap(c, (void *)(uintptr_t)p, (size_t)n);
    Py_END_ALLOW_THREADS
    give((Store *)self);
    return PyLong_FromLong(map_code(rc));
}

static PyObject *Store_unregister_buffer(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"buffer_ptr", NULL};
    PyObject *po;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:unregister_buffer", kwl, &po))
        return NULL;
    uint64_t p;
    if (u64_of(po, "buffer_ptr", -1, -1, &p) < 0)
        return NULL;
    kvp_client *c = take((Store *)self);
    if (!c)
        return PyLong_FromLong(not_set_up("unregister_buffer"));
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_unregister_buffer(c, (void *)(uintptr_t)p);
    Py_END_ALLOW_THREADS
    give((Store *)self);
    return PyLong_FromLong(map_code(rc));
}

/* _staging_ok(fn, key, nbytes) -> True, or False with a WARN line: whether a copying call of
 * nbytes fits local_buffer_size (upsert checks it before it removes the old object). */
static PyObject *Store_staging_ok_py(PyObject *self, PyObject *args)
{
    const char *fn;
    PyObject *ko, *kh;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "sOK:_staging_ok", &fn, &ko, &n))
        return NULL;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    int ok = staging_ok((Store *)self, fn, key, (uint64_t)n);
    Py_DECREF(kh);
    return PyBool_FromLong(ok);
}

/* _segment() -> (name, endpoint) of the embedded segment, or None. */
static PyObject *Store_segment(PyObject *self, PyObject *args)
{
    kvp_client *c = take((Store *)self);
    if (!c)
        Py_RETURN_NONE;
    char name[256], ep[320];
    int a = kvp_client_segment_name(c, name, sizeof name);
    int b = kvp_client_segment_endpoint(c, ep, sizeof ep);
    give((Store *)self);
    if (a != KVP_OK || b != KVP_OK)
        Py_RETURN_NONE;
    return Py_BuildValue("(ss)", name, ep);
}

/* device_stats() -> dict of the client's GPU staging counters (kvp_client_device_stats), or
 * None when not set up. */
static PyObject *Store_device_stats(PyObject *self, PyObject *args)
{
    (void)args;
    kvp_client *c = take((Store *)self);
    if (!c)
        Py_RETURN_NONE;
    kvp_device_stats d;
    int rc = kvp_client_device_stats(c, &d);
    give((Store *)self);
    if (rc != KVP_OK)
        Py_RETURN_NONE;
    return Py_BuildValue("{s:O,s:K,s:K,s:I,s:I,s:K,s:K,s:K,s:K}", "driver_loaded", d.driver_loaded ? Py_True : Py_False,
                         "registered_bytes", (unsigned long long)d.registered_bytes, "bounce_bytes",
                         (unsigned long long)d.bounce_bytes, "lanes", d.lanes, "lanes_busy", d.lanes_busy,
                         "staged_batches", (unsigned long long)d.staged_batches, "staged_bytes",
                         (unsigned long long)d.staged_bytes, "copies", (unsigned long long)d.copies, "copy_errors",
                         (unsigned long long)d.copy_errors);
}

/* _replica_counts(keys) -> list of counts or negative codes. */
static PyObject *Store_replica_counts(PyObject *self, PyObject *args)
{
    PyObject *ko;
    if (!PyArg_ParseTuple(args, "O:_replica_counts", &ko))
        return NULL;
    return batch_int_list((Store *)self, ko, "batch_get_replica_desc", kvp_batch_replica_count);
}

/* ------------------------------------------------------------------ copying put / get */

/* The bytes of a bytes-like value: bytes as they are (immutable, kept alive by the caller's
 * reference), anything else copied once through bytes(value) (bytearray, memoryview, array:
 * a mutable buffer could change or move while the GIL is released). New reference. */
static PyObject *as_bytes(PyObject *v, const char *arg)
{
    if (PyBytes_Check(v)) {
        Py_INCREF(v);
        return v;
    }
    if (PyUnicode_Check(v) || PyLong_Check(v) || v == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s must be a bytes-like object, not %s", arg, TN(v));
        return NULL;
    }
    PyObject *b = PyObject_Bytes(v);
    if (!b) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a bytes-like object, not %s", arg, TN(v));
    }
    return b;
}

static PyObject *Store_put(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", "value", "config", NULL};
    PyObject *ko, *vo, *cfg = Py_None, *kh, *ph;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:put", kwl, &ko, &vo, &cfg))
        return NULL;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    PyObject *b = as_bytes(vo, "value");
    if (!b) {
        Py_DECREF(kh);
        return NULL;
    }
    kvp_put_opts o;
    int bad;
    if (opts_of(cfg, &o, &ph, &bad) < 0) {
        Py_DECREF(kh);
        Py_DECREF(b);
        return NULL;
    }
    char *data;
    Py_ssize_t len;
    PyBytes_AsStringAndSize(b, &data, &len);
    Store *s = (Store *)self;
    long r;
    kvp_client *c = bad ? NULL : take(s);
    if (bad) {
        r = bad;
    } else if (!c) {
        r = not_set_up("put");
    } else {
        if (!staging_ok(s, "put", key, (uint64_t)len)) {
            r = MC_INVALID;
        } else {
            Py_BEGIN_ALLOW_THREADS
            r = kvp_put(c, key, data, (size_t)len, &o);
            Py_END_ALLOW_THREADS
            r = map_put(r);
        }
        give(s);
    }
    Py_DECREF(kh);
    Py_DECREF(b);
    Py_XDECREF(ph);
    return PyLong_FromLong(r);
}

static PyObject *Store_put_from(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", "buffer_ptr", "size", "config", NULL};
    PyObject *ko, *po, *so, *cfg = Py_None, *kh, *ph;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:put_from", kwl, &ko, &po, &so, &cfg))
        return NULL;
    uint64_t p, n;
    if (u64_of(po, "buffer_ptr", -1, -1, &p) < 0 || u64_of(so, "size", -1, -1, &n) < 0)
        return NULL;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    kvp_put_opts o;
    int bad;
    if (opts_of(cfg, &o, &ph, &bad) < 0) {
        Py_DECREF(kh);
        return NULL;
    }
    long r = bad;
    kvp_client *c = bad ? NULL : take((Store *)self);
    if (!bad && !c) {
        r = not_set_up("put_from");
    } else if (c) {
        Py_BEGIN_ALLOW_THREADS
        r = map_put(kvp_put(c, key, (const void *)(uintptr_t)p, (size_t)n, &o));
        Py_END_ALLOW_THREADS
        give((Store *)self);
    }
    Py_DECREF(kh);
    Py_XDECREF(ph);
    return PyLong_FromLong(r);
}

static PyObject *Store_get_into(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", "buffer_ptr", "size", NULL};
    PyObject *ko, *po, *so, *kh;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:get_into", kwl, &ko, &po, &so))
        return NULL;
    uint64_t p, n;
    if (u64_of(po, "buffer_ptr", -1, -1, &p) < 0 || u64_of(so, "size", -1, -1, &n) < 0)
        return NULL;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    int64_t r;
    kvp_client *c = take((Store *)self);
    if (!c) {
        r = not_set_up("get_into");
    } else {
        Py_BEGIN_ALLOW_THREADS
        r = kvp_get(c, key, (void *)(uintptr_t)p, (size_t)n, 0);
        Py_END_ALLOW_THREADS
        give((Store *)self);
        if (r < 0)
            r = map_code((long)r);
    }
    Py_DECREF(kh);
    return PyLong_FromLongLong(r);
}

/* get_batch core: n keys -> list of bytes (b"" for a miss or an error), or, with `handles`,
 * None for those. Two RPC rounds: sizes, then one batch get into new bytes objects. */
static PyObject *get_many(Store *s, const char *fn, Keys *k, int none_on_miss)
{
    Py_ssize_t n = k->n;
    PyObject *out = PyList_New(n);
    if (!out)
        return NULL;
    PyObject *miss = none_on_miss ? Py_None : NULL;
    kvp_client *c = take(s);
    int64_t *sz = PyMem_Calloc(n ? n : 1, sizeof *sz);
    int64_t *res = PyMem_Calloc(n ? n : 1, sizeof *res);
    void **bufs = PyMem_Calloc(n ? n : 1, sizeof *bufs);
    size_t *caps = PyMem_Calloc(n ? n : 1, sizeof *caps);
    PyObject **objs = PyMem_Calloc(n ? n : 1, sizeof *objs);
    if (!sz || !res || !bufs || !caps || !objs) {
        PyErr_NoMemory();
        goto fail;
    }
    int rc = KVP_OK;
    if (!c) {
        if (n)
            not_set_up(fn);
        rc = KVP_ERR_CLOSED;
    } else if (n > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = kvp_batch_get_size(c, (size_t)n, k->keys, sz);
        Py_END_ALLOW_THREADS
    }
    size_t m = 0;
    const char **mk = NULL;
    Py_ssize_t *mi = NULL;
    if (rc == KVP_OK && n > 0) {
        mk = PyMem_Calloc(n, sizeof *mk);
        mi = PyMem_Calloc(n, sizeof *mi);
        if (!mk || !mi) {
            PyMem_Free(mk);
            PyMem_Free(mi);
            PyErr_NoMemory();
            goto fail;
        }
        Py_ssize_t over = 0, first_over = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (sz[i] <= 0)
                continue;
            if ((uint64_t)sz[i] > s->local_buffer) { /* staging: one log line per call, below */
                if (over++ == 0)
                    first_over = i;
                sz[i] = KVP_ERR_INVALID;
                continue;
            }
            objs[i] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sz[i]);
            if (!objs[i]) {
                PyMem_Free(mk);
                PyMem_Free(mi);
                goto fail;
            }
            bufs[m] = PyBytes_AsString(objs[i]);
            caps[m] = (size_t)sz[i];
            mk[m] = k->keys[i];
            mi[m++] = i;
        }
        if (over > 0)
            kvp_log_warn(ACT, "%s: %zd of %zd keys (first '%.64s') are larger than local_buffer_size %llu, the "
                         "client's staging memory: -600 for them (the zero-copy calls need none)", fn, over, n,
                         k->keys[first_over], (unsigned long long)s->local_buffer);
        if (m > 0) {
            Py_BEGIN_ALLOW_THREADS
            rc = kvp_batch_get(c, m, mk, bufs, caps, 0, res);
            Py_END_ALLOW_THREADS
            if (rc != KVP_OK)
                for (size_t j = 0; j < m; j++)
                    res[j] = rc;
        }
    }
    if (c)
        give(s);
    c = NULL; /* given back: the fail path below must not give it again */
    for (size_t j = 0; j < m; j++) {
        Py_ssize_t i = mi[j];
        if (res[j] != sz[i]) { /* a miss, an error, or (replaced meanwhile) another size */
            if (res[j] > 0 || res[j] == KVP_ERR_BUFFER_TOO_SMALL)
                kvp_log_warn(ACT, "%s: key '%.64s' changed size while read: returned as a miss", fn, mk[j]);
            else if (res[j] != KVP_ERR_NOT_FOUND)
                kvp_log_warn(ACT, "%s: key '%.64s': %s: returned as a miss", fn, mk[j], kvp_errname((int)res[j]));
            Py_CLEAR(objs[i]);
        }
    }
    PyMem_Free(mk);
    PyMem_Free(mi);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = objs[i];
        objs[i] = NULL;
        if (!v) {
            v = miss ? miss : PyBytes_FromStringAndSize("", 0);
            if (miss)
                Py_INCREF(v);
        }
        if (!v || PyList_SetItem(out, i, v) < 0)
            goto fail;
    }
    PyMem_Free(sz);
    PyMem_Free(res);
    PyMem_Free(bufs);
    PyMem_Free(caps);
    PyMem_Free(objs);
    return out;
fail:
    if (c)
        give(s); /* a MemoryError above must not leave close() waiting for this call for ever */
    for (Py_ssize_t i = 0; objs && i < n; i++)
        Py_XDECREF(objs[i]);
    PyMem_Free(sz);
    PyMem_Free(res);
    PyMem_Free(bufs);
    PyMem_Free(caps);
    PyMem_Free(objs);
    Py_DECREF(out);
    return NULL;
}

static PyObject *Store_get(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", NULL};
    PyObject *ko;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:get", kwl, &ko))
        return NULL;
    /* one key, as get_many takes them; key_of's own errors (TypeError, ValueError for a NUL,
     * MemoryError) pass through unchanged */
    PyObject *kh;
    const char *key = key_of(ko, "key", -1, &kh);
    if (!key)
        return NULL;
    Keys k = {.n = 1, .keys = PyMem_Calloc(1, sizeof(char *)), .hold = PyMem_Calloc(1, sizeof(PyObject *))};
    if (!k.keys || !k.hold) {
        Py_DECREF(kh);
        k.n = 0;
        keys_free(&k);
        return PyErr_NoMemory();
    }
    k.keys[0] = key;
    k.hold[0] = kh;
    PyObject *l = get_many((Store *)self, "get", &k, 0);
    keys_free(&k);
    if (!l)
        return NULL;
    PyObject *v = PyList_GetItem(l, 0);
    Py_XINCREF(v);
    Py_DECREF(l);
    return v;
}

static PyObject *Store_get_batch(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"keys", NULL};
    PyObject *ko;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:get_batch", kwl, &ko))
        return NULL;
    Keys k;
    if (keys_get(ko, "keys", &k) < 0)
        return NULL;
    PyObject *l = get_many((Store *)self, "get_batch", &k, 0);
    keys_free(&k);
    return l;
}

/* _get_buffers(keys): as get_batch with None for a miss (batch_get_buffer wraps them). */
static PyObject *Store_get_buffers(PyObject *self, PyObject *args)
{
    PyObject *ko;
    if (!PyArg_ParseTuple(args, "O:batch_get_buffer", &ko))
        return NULL;
    Keys k;
    if (keys_get(ko, "keys", &k) < 0)
        return NULL;
    PyObject *l = get_many((Store *)self, "batch_get_buffer", &k, 1);
    keys_free(&k);
    return l;
}

/* ------------------------------------------------------------------ zero-copy batches */

/* batch_put_from / batch_get_into: flat pointers. */
static PyObject *flat_batch(PyObject *self, PyObject *args, PyObject *kw, int put)
{
    static char *kwp[] = {"keys", "buffer_ptrs", "sizes", "config", NULL};
    static char *kwg[] = {"keys", "buffer_ptrs", "sizes", NULL};
    PyObject *ko, *po, *so, *cfg = Py_None, *ph = NULL;
    if (put ? !PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:batch_put_from", kwp, &ko, &po, &so, &cfg)
            : !PyArg_ParseTupleAndKeywords(args, kw, "OOO:batch_get_into", kwg, &ko, &po, &so))
        return NULL;
    const char *fn = put ? "batch_put_from" : "batch_get_into";
    Keys k;
    if (keys_get(ko, "keys", &k) < 0)
        return NULL;
    uint64_t *ptrs = NULL, *sizes = NULL;
    Py_ssize_t np = 0, ns = 0;
    PyObject *out = NULL;
    kvp_put_opts o;
    memset(&o, 0, sizeof o);
    int bad = 0;
    if (u64_list(po, "buffer_ptrs", &np, &ptrs) < 0 || u64_list(so, "sizes", &ns, &sizes) < 0 ||
        (put && opts_of(cfg, &o, &ph, &bad) < 0))
        goto done;
    if (np != k.n || ns != k.n) {
        kvp_log_warn(ACT, "%s: %zd keys, %zd buffer_ptrs, %zd sizes: the lengths differ (-600 for every key)", fn,
                     k.n, np, ns);
        out = list_of(k.n, MC_INVALID);
        goto done;
    }
    if (bad) {
        out = list_of(k.n, bad);
        goto done;
    }
    kvp_client *c = take((Store *)self);
    if (!c) {
        out = list_of(k.n, k.n ? not_set_up(fn) : 0);
        goto done;
    }
    int64_t *r = PyMem_Calloc(k.n ? k.n : 1, sizeof *r);
    int *ri = PyMem_Calloc(k.n ? k.n : 1, sizeof *ri);
    int rc = KVP_ERR_NOMEM;
    if (r && ri && k.n > 0) {
        /* uint64_t and void * / size_t have the same width on the 64-bit hosts kvpool builds for */
        Py_BEGIN_ALLOW_THREADS
        if (put) {
            rc = kvp_batch_put(c, (size_t)k.n, k.keys, (const void *const *)ptrs, (const size_t *)sizes, &o, ri);
            for (Py_ssize_t i = 0; i < k.n; i++)
                r[i] = ri[i];
        } else {
            rc = kvp_batch_get(c, (size_t)k.n, k.keys, (void *const *)ptrs, (const size_t *)sizes, 0, r);
        }
        Py_END_ALLOW_THREADS
    } else if (r && ri) {
        rc = KVP_OK;
    }
    give((Store *)self);
    out = rc == KVP_OK ? list_i64(k.n, r, put) : list_of(k.n, map_code(rc));
    PyMem_Free(r);
    PyMem_Free(ri);
done:
    keys_free(&k);
    PyMem_Free(ptrs);
    PyMem_Free(sizes);
    Py_XDECREF(ph);
    return out;
}

static PyObject *Store_batch_put_from(PyObject *self, PyObject *args, PyObject *kw) { return flat_batch(self, args, kw, 1); }
static PyObject *Store_batch_get_into(PyObject *self, PyObject *args, PyObject *kw) { return flat_batch(self, args, kw, 0); }

_Static_assert(sizeof(uint64_t) == sizeof(void *) && sizeof(uint64_t) == sizeof(size_t), "64-bit host");

/* batch_put_from_multi_buffers / batch_get_into_multi_buffers: one kvp_iov array per key. */
static PyObject *multi_batch(PyObject *self, PyObject *args, PyObject *kw, int put)
{
    static char *kwp[] = {"keys", "all_buffer_ptrs", "all_sizes", "config", NULL};
    static char *kwg[] = {"keys", "all_buffer_ptrs", "all_sizes", "prefer_same_node", NULL};
    PyObject *ko, *po, *so, *cfg = Py_None, *ph = NULL;
    int same_node = 0;
    if (put ? !PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:batch_put_from_multi_buffers", kwp, &ko, &po, &so, &cfg)
            : !PyArg_ParseTupleAndKeywords(args, kw, "OOO|p:batch_get_into_multi_buffers", kwg, &ko, &po, &so,
                                           &same_node))
        return NULL;
    const char *fn = put ? "batch_put_from_multi_buffers" : "batch_get_into_multi_buffers";
    Keys k;
    if (keys_get(ko, "keys", &k) < 0)
        return NULL;
    PyObject *out = NULL, *pseq = NULL, *sseq = NULL;
    kvp_iov *iov = NULL;
    const kvp_iov **iovs = NULL;
    size_t *cnt = NULL;
    kvp_put_opts o;
    memset(&o, 0, sizeof o);
    int bad = 0;
    if (put && opts_of(cfg, &o, &ph, &bad) < 0)
        goto done;
    if (!(pseq = as_seq(po, "all_buffer_ptrs")) || !(sseq = as_seq(so, "all_sizes")))
        goto done;
    Py_ssize_t n = k.n;
    if (seq_len(pseq) != n || seq_len(sseq) != n) {
        kvp_log_warn(ACT, "%s: %zd keys, %zd buffer lists, %zd size lists: the lengths differ (-600 for every key)",
                     fn, n, seq_len(pseq), seq_len(sseq));
        out = list_of(n, MC_INVALID);
        goto done;
    }
    /* pass 1: shapes and total pieces */
    size_t total = 0;
    cnt = PyMem_Calloc(n ? n : 1, sizeof *cnt);
    iovs = PyMem_Calloc(n ? n : 1, sizeof *iovs);
    if (!cnt || !iovs) {
        PyErr_NoMemory();
        goto done;
    }
    int *shape_bad = PyMem_Calloc(n ? n : 1, sizeof *shape_bad);
    if (!shape_bad) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pl = seq_item(pseq, i), *sl = seq_item(sseq, i);
        if (!(PyList_Check(pl) || PyTuple_Check(pl))) {
            PyErr_Format(PyExc_TypeError, "all_buffer_ptrs[%zd] must be a list, not %s", i, TN(pl));
            PyMem_Free(shape_bad);
            goto done;
        }
        if (!(PyList_Check(sl) || PyTuple_Check(sl))) {
            PyErr_Format(PyExc_TypeError, "all_sizes[%zd] must be a list, not %s", i, TN(sl));
            PyMem_Free(shape_bad);
            goto done;
        }
        if (seq_len(pl) != seq_len(sl)) {
            shape_bad[i] = 1;
            kvp_log_warn(ACT, "%s: key '%.64s': %zd pointers, %zd sizes (-600)", fn, k.keys[i], seq_len(pl),
                         seq_len(sl));
            continue;
        }
        cnt[i] = (size_t)seq_len(pl);
        total += cnt[i];
    }
    iov = PyMem_Calloc(total ? total : 1, sizeof *iov);
    if (!iov) {
        PyMem_Free(shape_bad);
        PyErr_NoMemory();
        goto done;
    }
    /* pass 2: the pieces */
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        iovs[i] = &iov[at];
        if (shape_bad[i])
            continue;
        PyObject *pl = seq_item(pseq, i), *sl = seq_item(sseq, i);
        for (size_t j = 0; j < cnt[i]; j++) {
            uint64_t p, z;
            if (u64_of(seq_item(pl, (Py_ssize_t)j), "all_buffer_ptrs", i, (Py_ssize_t)j, &p) < 0 ||
                u64_of(seq_item(sl, (Py_ssize_t)j), "all_sizes", i, (Py_ssize_t)j, &z) < 0) {
                PyMem_Free(shape_bad);
                goto done;
            }
            iov[at + j] = (kvp_iov){.base = (void *)(uintptr_t)p, .len = (size_t)z};
        }
        at += cnt[i];
    }
    if (bad) {
        PyMem_Free(shape_bad);
        out = list_of(n, bad);
        goto done;
    }
    kvp_client *c = take((Store *)self);
    if (!c) {
        PyMem_Free(shape_bad);
        out = list_of(n, n ? not_set_up(fn) : 0);
        goto done;
    }
    /* keys with a bad shape are left out of the call */
    const char **ck = PyMem_Calloc(n ? n : 1, sizeof *ck);
    const kvp_iov **ci = PyMem_Calloc(n ? n : 1, sizeof *ci);
    size_t *cc = PyMem_Calloc(n ? n : 1, sizeof *cc);
    Py_ssize_t *pos = PyMem_Calloc(n ? n : 1, sizeof *pos);
    int64_t *r = PyMem_Calloc(n ? n : 1, sizeof *r);
    int64_t *rr = PyMem_Calloc(n ? n : 1, sizeof *rr);
    int *ri = PyMem_Calloc(n ? n : 1, sizeof *ri);
    int rc = KVP_ERR_NOMEM;
    if (ck && ci && cc && pos && r && rr && ri) {
        size_t m = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (shape_bad[i]) {
                r[i] = KVP_ERR_INVALID;
                continue;
            }
            ck[m] = k.keys[i];
            ci[m] = iovs[i];
            cc[m] = cnt[i];
            pos[m++] = i;
        }
        rc = KVP_OK;
        if (m > 0) {
            Py_BEGIN_ALLOW_THREADS
            if (put) {
                rc = kvp_batch_put_iov(c, m, ck, ci, cc, &o, ri);
                for (size_t j = 0; j < m; j++)
                    rr[j] = ri[j];
            } else {
                rc = kvp_batch_get_iov(c, m, ck, ci, cc, 0, rr);
            }
            Py_END_ALLOW_THREADS
        }
        for (size_t j = 0; j < m; j++)
            r[pos[j]] = rc == KVP_OK ? rr[j] : rc;
        rc = KVP_OK;
    }
    give((Store *)self);
    out = rc == KVP_OK ? list_i64(n, r, put) : list_of(n, map_code(rc));
    PyMem_Free(ck);
    PyMem_Free(ci);
    PyMem_Free(cc);
    PyMem_Free(pos);
    PyMem_Free(r);
    PyMem_Free(rr);
    PyMem_Free(ri);
    PyMem_Free(shape_bad);
done:
    keys_free(&k);
    Py_XDECREF(pseq);
    Py_XDECREF(sseq);
    PyMem_Free(iov);
    PyMem_Free(iovs);
    PyMem_Free(cnt);
    Py_XDECREF(ph);
    return out;
}

static PyObject *Store_batch_put_multi(PyObject *self, PyObject *args, PyObject *kw) { return multi_batch(self, args, kw, 1); }
static PyObject *Store_batch_get_multi(PyObject *self, PyObject *args, PyObject *kw) { return multi_batch(self, args, kw, 0); }

/* ------------------------------------------------------------------ module */

static PyMethodDef Store_methods[] = {
    {"_open", (PyCFunction)Store_open, METH_VARARGS, "_open(items, local_buffer_size) -> 0 or a negative code"},
    {"close", (PyCFunction)Store_close, METH_NOARGS,
     "close() -> 0. Drains this client's own segment (bounded by drain_timeout_ms), then closes. Idempotent."},
    {"is_exist", (PyCFunction)(void (*)(void))Store_is_exist, METH_VARARGS | METH_KEYWORDS,
     "is_exist(key) -> 1, 0 (a miss) or a negative code"},
    {"batch_is_exist", (PyCFunction)(void (*)(void))Store_batch_is_exist, METH_VARARGS | METH_KEYWORDS,
     "batch_is_exist(keys) -> list of 1/0/negative, len(keys) entries"},
    {"get_size", (PyCFunction)(void (*)(void))Store_get_size, METH_VARARGS | METH_KEYWORDS,
     "get_size(key) -> bytes or a negative code"},
    {"remove", (PyCFunction)(void (*)(void))Store_remove, METH_VARARGS | METH_KEYWORDS,
     "remove(key, force=False) -> 0 or a negative code (-706: leased)"},
    {"remove_all", (PyCFunction)(void (*)(void))Store_remove_all, METH_VARARGS | METH_KEYWORDS,
     "remove_all(force=False) -> number of objects removed, or a negative code"},
    {"register_buffer", (PyCFunction)(void (*)(void))Store_register_buffer, METH_VARARGS | METH_KEYWORDS,
     "register_buffer(buffer_ptr, size) -> 0 or a negative code; overlapping and nested ranges are allowed"},
    {"unregister_buffer", (PyCFunction)(void (*)(void))Store_unregister_buffer, METH_VARARGS | METH_KEYWORDS,
     "unregister_buffer(buffer_ptr) -> 0 or a negative code (-704: not registered)"},
    {"put", (PyCFunction)(void (*)(void))Store_put, METH_VARARGS | METH_KEYWORDS,
     "put(key, value, config=None) -> 0 (also when the key exists: write-once) or a negative code"},
    {"put_from", (PyCFunction)(void (*)(void))Store_put_from, METH_VARARGS | METH_KEYWORDS,
     "put_from(key, buffer_ptr, size, config=None) -> 0 or a negative code"},
    {"get_into", (PyCFunction)(void (*)(void))Store_get_into, METH_VARARGS | METH_KEYWORDS,
     "get_into(key, buffer_ptr, size) -> bytes read (the object's size) or a negative code"},
    {"get", (PyCFunction)(void (*)(void))Store_get, METH_VARARGS | METH_KEYWORDS, "get(key) -> bytes; b'' on a miss"},
    {"get_batch", (PyCFunction)(void (*)(void))Store_get_batch, METH_VARARGS | METH_KEYWORDS,
     "get_batch(keys) -> list of bytes (b'' for a miss)"},
    {"_get_buffers", (PyCFunction)Store_get_buffers, METH_VARARGS, "_get_buffers(keys) -> list of bytes or None"},
    {"batch_put_from", (PyCFunction)(void (*)(void))Store_batch_put_from, METH_VARARGS | METH_KEYWORDS,
     "batch_put_from(keys, buffer_ptrs, sizes, config=None) -> list of 0/negative"},
    {"batch_get_into", (PyCFunction)(void (*)(void))Store_batch_get_into, METH_VARARGS | METH_KEYWORDS,
     "batch_get_into(keys, buffer_ptrs, sizes) -> list of sizes/negative"},
    {"batch_put_from_multi_buffers", (PyCFunction)(void (*)(void))Store_batch_put_multi, METH_VARARGS | METH_KEYWORDS,
     "batch_put_from_multi_buffers(keys, all_buffer_ptrs, all_sizes, config=None) -> list of 0/negative; "
     "object i is the concatenation of its pieces"},
    {"batch_get_into_multi_buffers", (PyCFunction)(void (*)(void))Store_batch_get_multi, METH_VARARGS | METH_KEYWORDS,
     "batch_get_into_multi_buffers(keys, all_buffer_ptrs, all_sizes, prefer_same_node=False) -> list of total "
     "bytes/negative"},
    {"_segment", (PyCFunction)Store_segment, METH_NOARGS, "_segment() -> (name, endpoint) or None"},
    {"_staging_ok", (PyCFunction)Store_staging_ok_py, METH_VARARGS, "_staging_ok(fn, key, nbytes) -> bool"},
    {"device_stats", (PyCFunction)Store_device_stats, METH_NOARGS,
     "device_stats() -> dict of GPU staging counters (registered device bytes, bounce-pool use, copy errors), "
     "or None when not set up"},
    {"_replica_counts", (PyCFunction)Store_replica_counts, METH_VARARGS, "_replica_counts(keys) -> list"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Store_slots[] = {
    {Py_tp_new, (void *)Store_new},
    {Py_tp_dealloc, (void *)Store_dealloc},
    {Py_tp_methods, Store_methods},
    {Py_tp_doc, "kvpool client (the base of kvpool.MooncakeDistributedStore)"},
    {0, NULL},
};

static PyType_Spec Store_spec = {
    "kvpool._kvpool.Store",
    sizeof(Store),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    Store_slots,
};

/* _copy_out(dst_ptr, data, src_offset, size) -> size, or -600 with a WARN line: copies
 * data[src_offset:src_offset+size] to the caller's address for get_into_ranges. The address is
 * checked as the C API checks its buffers (not NULL, no wrap-around, not GPU device memory),
 * so a bad address is a return code instead of a segfault. */
static PyObject *mod_copy_out(PyObject *m, PyObject *args)
{
    PyObject *po, *data;
    Py_ssize_t off, n;
    if (!PyArg_ParseTuple(args, "OSnn:_copy_out", &po, &data, &off, &n))
        return NULL;
    uint64_t p;
    if (u64_of(po, "buffer_ptr", -1, -1, &p) < 0)
        return NULL;
    char *src;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(data, &src, &len) < 0)
        return NULL;
    if (off < 0 || n < 0 || off > len || n > len - off) {
        kvp_log_warn(ACT, "get_into_ranges: range [%zd, +%zd) is outside the object of %zd bytes (-600)", off, n, len);
        return PyLong_FromLong(MC_INVALID);
    }
    if (n == 0)
        return PyLong_FromLong(0);
    if (p < 4096 || p + (uint64_t)n < p) { /* the NULL page (NULL plus an offset), or a wrap-around */
        kvp_log_warn(ACT, "get_into_ranges: destination %#llx + %zd is in the NULL page or wraps around (-600)",
                     (unsigned long long)p, n);
        return PyLong_FromLong(MC_INVALID);
    }
    /* get_into_ranges sends GPU destinations through kvpool's staging before it gets here:
     * one that still arrives (or a driver that cannot tell) is refused, never written by the CPU */
    int dev = kvp_device_pointer((const void *)(uintptr_t)p);
    if (dev != 0) {
        kvp_log_warn(ACT, "get_into_ranges: destination %#llx is GPU device memory or unknown to the driver "
                     "(%d): -600", (unsigned long long)p, dev);
        return PyLong_FromLong(MC_INVALID);
    }
    memcpy((void *)(uintptr_t)p, src + off, (size_t)n);
    return PyLong_FromSsize_t(n);
}

static PyObject *mod_map_code(PyObject *m, PyObject *args)
{
    long rc;
    if (!PyArg_ParseTuple(args, "l:map_code", &rc))
        return NULL;
    return PyLong_FromLong(map_code(rc));
}

static PyObject *mod_kvp_errname(PyObject *m, PyObject *args)
{
    int rc;
    if (!PyArg_ParseTuple(args, "i:kvp_errname", &rc))
        return NULL;
    return PyUnicode_FromString(kvp_errname(rc));
}

static PyObject *mod_log(PyObject *m, PyObject *args)
{
    const char *level, *msg;
    if (!PyArg_ParseTuple(args, "ss:_log", &level, &msg))
        return NULL;
    if (strcmp(level, "warn") == 0)
        kvp_log_warn(ACT, "%s", msg);
    else if (strcmp(level, "error") == 0)
        kvp_log_error(ACT, "%s", msg);
    else
        kvp_log_info(ACT, "%s", msg);
    Py_RETURN_NONE;
}

static PyObject *mod_device_pointer(PyObject *m, PyObject *args)
{
    (void)m;
    unsigned long long p;
    if (!PyArg_ParseTuple(args, "K:_device_pointer", &p))
        return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = kvp_device_pointer((const void *)(uintptr_t)p);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r < 0 ? map_code(r) : r);
}

static PyMethodDef mod_methods[] = {
    {"map_code", mod_map_code, METH_VARARGS, "map_code(kvp_err) -> the number the Python API returns for it"},
    {"kvp_errname", mod_kvp_errname, METH_VARARGS, "kvp_errname(kvp_err) -> 'KVP_ERR_...'"},
    {"_log", mod_log, METH_VARARGS, "_log(level, message): one line in kvpool's log"},
    {"_copy_out", mod_copy_out, METH_VARARGS, "_copy_out(dst_ptr, data, src_offset, size) -> size or -600"},
    {"_device_pointer", mod_device_pointer, METH_VARARGS,
     "_device_pointer(ptr) -> 1 GPU device memory, 0 host memory, or a negative number (driver failure)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod_def = {
    PyModuleDef_HEAD_INIT, "_kvpool", "kvpool's C extension (use the kvpool package)", -1, mod_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvpool(void)
{
    PyObject *m = PyModule_Create(&mod_def);
    if (!m)
        return NULL;
    PyObject *t = PyType_FromSpec(&Store_spec);
    if (!t || PyModule_AddObject(m, "Store", t) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "KVP_BASE", MC_KVP_BASE);
    return m;
}
