/* _io_api.c -- holoprof.collect._io_api: the preloaded I/O library's exported API, for the
 * in-process agent, without ctypes.
 *
 * The library (libholoprof_io.so, LD_PRELOAD) is not a Python module: it is loaded into every
 * process of a job, Python or not. This small extension module finds its functions in the process
 * (dlsym of RTLD_DEFAULT) and calls them. Importing it costs a fraction of a millisecond and a few
 * objects, where `import ctypes` and the bindings cost a short process about two milliseconds and
 * some 700 objects (benchmarks/bench_startup.py). Where the library is not loaded, loaded() is
 * False and every other function raises RuntimeError. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <stdint.h>

typedef int64_t (*snapshot_fn)(void *, size_t, uint64_t, uint64_t *);
typedef void (*set_owner_fn)(int);
typedef long (*long_fn)(void);
typedef int (*path_fn)(uint32_t, char *, size_t);
typedef int (*trace_start_fn)(uint64_t);
typedef void (*void_fn)(void);
typedef int64_t (*trace_drain_fn)(void *, uint64_t);
typedef int (*dump_fn)(const char *);
typedef const char *(*names_fn)(int, int);
typedef int (*layout_fn)(int *, int *, int *);

static struct {
    snapshot_fn snapshot;
    set_owner_fn set_owner;
    long_fn dropped;
    path_fn path;
    trace_start_fn trace_start;
    void_fn trace_stop;
    trace_drain_fn trace_drain;
    long_fn trace_dropped;
    dump_fn dump;
    names_fn counter_names;
    layout_fn layout;
} lib;

static int resolve(void)
{
    void *h = RTLD_DEFAULT;
    lib.snapshot = (snapshot_fn)dlsym(h, "holoprof_io_snapshot");
    lib.set_owner = (set_owner_fn)dlsym(h, "holoprof_io_set_owner");
    lib.dropped = (long_fn)dlsym(h, "holoprof_io_dropped");
    lib.path = (path_fn)dlsym(h, "holoprof_io_path");
    lib.trace_start = (trace_start_fn)dlsym(h, "holoprof_io_trace_start");
    lib.trace_stop = (void_fn)dlsym(h, "holoprof_io_trace_stop");
    lib.trace_drain = (trace_drain_fn)dlsym(h, "holoprof_io_trace_drain");
    lib.trace_dropped = (long_fn)dlsym(h, "holoprof_io_trace_dropped");
    lib.dump = (dump_fn)dlsym(h, "holoprof_io_dump");
    lib.counter_names = (names_fn)dlsym(h, "holoprof_io_counter_names");
    lib.layout = (layout_fn)dlsym(h, "holoprof_io_layout");
    return lib.snapshot && lib.set_owner && lib.dropped && lib.path && lib.trace_start && lib.trace_stop &&
           lib.trace_drain && lib.trace_dropped && lib.dump && lib.counter_names && lib.layout;
}

static int g_loaded = 0;

/* a trace record's size (holoprof.collect.io_native._TRACE_REC) */
#define TRACE_REC_BYTES 40

#define NOT_LOADED "libholoprof_io is not loaded in this process"
#define REQUIRE_LOADED() \
    if (!g_loaded) { \
        PyErr_SetString(PyExc_RuntimeError, NOT_LOADED); \
        return NULL; \
    }

/* the arguments (buf, n) of snapshot and trace_drain: a writable buffer (released by the caller on
 * success) and an unsigned 64-bit number; -1 with an exception set otherwise */
static int buffer_and_number(PyObject *args, Py_buffer *b, unsigned long long *n)
{
    if (!PyArg_ParseTuple(args, "w*K", b, n))
        return -1;
    if (!g_loaded) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_RuntimeError, NOT_LOADED);
        return -1;
    }
    return 0;
}

/* loaded() -> bool; looked up again while not found (a library loaded later with RTLD_GLOBAL) */
static PyObject *api_loaded(PyObject *self, PyObject *args)
{
    if (!g_loaded)
        g_loaded = resolve();
    return PyBool_FromLong(g_loaded);
}

static PyObject *api_set_owner(PyObject *self, PyObject *args)
{
    int on;
    if (!PyArg_ParseTuple(args, "i", &on))
        return NULL;
    REQUIRE_LOADED();
    lib.set_owner(on);
    Py_RETURN_NONE;
}

static PyObject *api_dropped(PyObject *self, PyObject *args)
{
    REQUIRE_LOADED();
    return PyLong_FromLong(lib.dropped());
}

static PyObject *api_trace_dropped(PyObject *self, PyObject *args)
{
    REQUIRE_LOADED();
    return PyLong_FromLong(lib.trace_dropped());
}

static PyObject *api_trace_stop(PyObject *self, PyObject *args)
{
    REQUIRE_LOADED();
    Py_BEGIN_ALLOW_THREADS
    lib.trace_stop();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *api_trace_start(PyObject *self, PyObject *args)
{
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "K", &n))
        return NULL;
    REQUIRE_LOADED();
    int r;
    Py_BEGIN_ALLOW_THREADS /* allocates and clears the ring: tens of milliseconds at a million records */
    r = lib.trace_start((uint64_t)n);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

/* dump(path: bytes | str | None) -> int: 0 on success (None: the at-exit location) */
static PyObject *api_dump(PyObject *self, PyObject *args)
{
    PyObject *arg, *encoded = NULL;
    if (!PyArg_ParseTuple(args, "O", &arg))
        return NULL;
    REQUIRE_LOADED();
    if (arg != Py_None && !PyUnicode_FSConverter(arg, &encoded)) /* bytes kept as they are; no NUL */
        return NULL;
    const char *path = encoded ? PyBytes_AS_STRING(encoded) : NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = lib.dump(path);
    Py_END_ALLOW_THREADS
    Py_XDECREF(encoded);
    return PyLong_FromLong(r);
}

/* layout() -> (integer counters, float counters, snapshot header bytes) */
static PyObject *api_layout(PyObject *self, PyObject *args)
{
    REQUIRE_LOADED();
    int ni = 0, nf = 0, hdr = 0;
    lib.layout(&ni, &nf, &hdr);
    return Py_BuildValue("(iii)", ni, nf, hdr);
}

/* counter_names(module, kind) -> bytes (comma-separated) */
static PyObject *api_counter_names(PyObject *self, PyObject *args)
{
    int module, kind;
    if (!PyArg_ParseTuple(args, "ii", &module, &kind))
        return NULL;
    REQUIRE_LOADED();
    const char *s = lib.counter_names(module, kind);
    return PyBytes_FromString(s ? s : "");
}

/* snapshot(buf: writable buffer, since) -> (n, next_since); n < 0: -n bytes are needed */
static PyObject *api_snapshot(PyObject *self, PyObject *args)
{
    Py_buffer b;
    unsigned long long since;
    if (buffer_and_number(args, &b, &since) < 0)
        return NULL;
    uint64_t next = 0;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS /* the buffer's export keeps it from being resized meanwhile */
    n = lib.snapshot(b.buf, (size_t)b.len, (uint64_t)since, &next);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return Py_BuildValue("(LK)", (long long)n, (unsigned long long)next);
}

/* trace_drain(buf: writable buffer, max_records) -> records moved into buf */
static PyObject *api_trace_drain(PyObject *self, PyObject *args)
{
    Py_buffer b;
    unsigned long long want;
    if (buffer_and_number(args, &b, &want) < 0)
        return NULL;
    uint64_t fits = (uint64_t)b.len / TRACE_REC_BYTES;
    if (want > fits)
        want = fits; /* never past the buffer's end */
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = lib.trace_drain(b.buf, (uint64_t)want);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromLongLong((long long)n);
}

/* path(idx) -> bytes: the path of record idx (empty where there is none) */
static PyObject *api_path(PyObject *self, PyObject *args)
{
    unsigned int idx;
    if (!PyArg_ParseTuple(args, "I", &idx))
        return NULL;
    REQUIRE_LOADED();
    char small[4096];
    int n = lib.path((uint32_t)idx, small, sizeof small);
    if (n >= 0)
        return PyBytes_FromStringAndSize(small, n);
    size_t len = (size_t)(-(long)n);
    char *big = PyMem_Malloc(len);
    if (!big)
        return PyErr_NoMemory();
    n = lib.path((uint32_t)idx, big, len);
    PyObject *out = PyBytes_FromStringAndSize(big, n > 0 ? n : 0);
    PyMem_Free(big);
    return out;
}

static PyMethodDef methods[] = {
    {"loaded", api_loaded, METH_NOARGS, "Whether libholoprof_io is loaded in this process."},
    {"set_owner", api_set_owner, METH_VARARGS, "Claim (1) or release (0) this process's counters."},
    {"dropped", api_dropped, METH_NOARGS, "Files not recorded: the table was full."},
    {"path", api_path, METH_VARARGS, "path(idx) -> bytes: the path of a record."},
    {"trace_start", api_trace_start, METH_VARARGS, "trace_start(max_records) -> 0 on success."},
    {"trace_stop", api_trace_stop, METH_NOARGS, "Stop the per-operation trace."},
    {"trace_drain", api_trace_drain, METH_VARARGS, "trace_drain(buf, max_records) -> records moved."},
    {"trace_dropped", api_trace_dropped, METH_NOARGS, "Operations not traced: the ring was full."},
    {"dump", api_dump, METH_VARARGS, "dump(path: bytes, str or None) -> 0 on success."},
    {"counter_names", api_counter_names, METH_VARARGS, "counter_names(module, kind) -> bytes."},
    {"layout", api_layout, METH_NOARGS, "layout() -> (integer counters, float counters, header bytes)."},
    {"snapshot", api_snapshot, METH_VARARGS, "snapshot(buf, since) -> (bytes written or -needed, next)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_io_api",
    .m_doc = "The preloaded libholoprof_io's API, without ctypes.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__io_api(void)
{
    g_loaded = resolve();
    return PyModule_Create(&module);
}
