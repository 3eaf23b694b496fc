/* _ipcref: the CPython extension under the ipcref package, built from
 * ipcref.h. Four types over the C API:
 *
 *   _Context   an ipcref_ctx: shared allocations, peers by path or socket
 *   _Peer      an ipcref_peer: send a batch of views with metadata, receive
 *              a whole message (every view of it) with its metadata
 *   _Buffer    one view (a reference on its buffer) exported to Python
 *              through the buffer protocol (numpy) and DLPack (torch):
 *              zero copy; read-only where this process may not write
 *   exceptions are the package's own, registered by __init__.py
 *
 * What crosses from Python on send is either an object with the buffer
 * protocol (a numpy array) or a tuple (address, dtype code, shape,
 * strides in elements, owner) for a torch tensor. Memory that lies inside
 * a _Buffer alive in this process (made by empty, or received) is sent as
 * a view of it, zero copy; any other memory is copied once into a new
 * shared block. Every call that may wait releases the GIL. A peer is used
 * by one thread at a time: a second thread's call is refused. */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first: it defines _GNU_SOURCE, which ipcref.h needs */

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

/* ---- errors ---------------------------------------------------------------
 * The library's error hook names why a call refused; the hook keeps the
 * last message of each thread, and an exception carries it. */

static PyObject *err_base, *err_timeout, *err_wouldblock, *err_peergone;
static _Thread_local char last_message[256];

static void hook_fn(void *user, ipcref_result code, const char *message) {
  (void)user;
  (void)code;
  snprintf(last_message, sizeof last_message, "%s", message ? message : "");
}
static const ipcref_error_hook the_hook = {hook_fn, NULL};

/* ipcref_result's names, by -code (ipcref.h never renumbers them). */
static const char *const code_names[] = {
    "OK",        "EINVAL",  "ENOMEM", "ERANGE",    "EBUSY",      "EPROTO",
    "ESYS",      "ENODEV",  "EPEER",  "ETIMEDOUT", "ESATURATED", "EDEAD",
    "ENEEDCOPY", "EDEVICE", "EAGAIN", "ENOTSUP"};

/* Raises the exception for `r` (NULL returned, for `return raise(r)`). */
static PyObject *raise_result(ipcref_result r) {
  PyObject *cls = r == IPCREF_ETIMEDOUT ? err_timeout
                  : r == IPCREF_EAGAIN  ? err_wouldblock
                  : r == IPCREF_EPEER   ? err_peergone
                                        : err_base;
  int i = -(int)r;
  const char *name = i >= 0 && i < (int)(sizeof code_names / sizeof *code_names)
                         ? code_names[i]
                         : "E?";
  PyObject *e;
  char msg[384];
  if (!cls) cls = PyExc_RuntimeError;
  if (last_message[0])
    snprintf(msg, sizeof msg, "%s (%s)", ipcref_strerror(r), last_message);
  else
    snprintf(msg, sizeof msg, "%s", ipcref_strerror(r));
  if (r == IPCREF_ESYS && errno) {
    size_t n = strlen(msg);
    snprintf(msg + n, sizeof msg - n, ": %s", strerror(errno));
  }
  e = PyObject_CallFunction(cls, "iss", (int)r, name, msg);
  if (e) {
    PyErr_SetObject(cls, e);
    Py_DECREF(e);
  }
  return NULL;
}

#define CALL_BEGIN() (last_message[0] = '\0')

/* Raises the exception for `r` with `why` as the library's message: a
 * refusal of this module's own. The package's exceptions take (code, name,
 * message), so they are raised the one way raise_result builds them. */
static PyObject *raise_why(ipcref_result r, const char *why) {
  snprintf(last_message, sizeof last_message, "%s", why);
  return raise_result(r);
}

/* ---- dtypes -------------------------------------------------------------- */

/* The buffer protocol's format of each dtype (NULL: none, bf16). */
static const char *const dt_format[IPCREF_DTYPE_COUNT] = {
    "?", "b", "h",  "i", "q", "B",  "H", "I",
    "Q", "e", NULL, "f", "d", "Zf", "Zd"};

/* The dtype of a buffer-protocol format and item size; -1 if none. */
static int dtype_of_format(const char *f, Py_ssize_t itemsize) {
  int i;
  if (!f) f = "B";
  if (*f == '<' || *f == '=' || *f == '@') f++;
  if (strcmp(f, "l") == 0 || strcmp(f, "L") == 0 || strcmp(f, "n") == 0 ||
      strcmp(f, "N") == 0)
    f = itemsize == 8 ? (f[0] == 'l' || f[0] == 'n' ? "q" : "Q")
                      : (f[0] == 'l' || f[0] == 'n' ? "i" : "I");
  if (strcmp(f, "c") == 0) f = "B";
  for (i = 0; i < IPCREF_DTYPE_COUNT; i++)
    if (dt_format[i] && strcmp(dt_format[i], f) == 0 &&
        (Py_ssize_t)ipcref_dtype_size((ipcref_dtype)i) == itemsize)
      return i;
  return -1;
}

/* ---- _Buffer ---------------------------------------------------------------
 */

typedef struct {
  PyObject_HEAD ipcref_view v;
  int readonly;
  Py_ssize_t shape[IPCREF_MAX_DIMS], strides[IPCREF_MAX_DIMS]; /* bytes */
  uintptr_t lo, hi; /* the bytes its buffer spans, for the registry */
  ipcref_ctx *ctx;  /* the context it was made or received in */
} BufferObject;

static PyTypeObject BufferType;

/* The registry: the live _Buffers of this process, by the memory their
 * buffers span, so that an array over one is sent as a view of it. Under
 * the GIL. */
static BufferObject **registry;
static Py_ssize_t nregistry, capregistry;

static int registry_add(BufferObject *b) {
  if (nregistry == capregistry) {
    Py_ssize_t cap = capregistry ? capregistry * 2 : 64;
    BufferObject **n =
        (BufferObject **)PyMem_Realloc(registry, (size_t)cap * sizeof *n);
    if (!n) return -1;
    registry = n;
    capregistry = cap;
  }
  registry[nregistry++] = b;
  return 0;
}

static void registry_remove(BufferObject *b) {
  Py_ssize_t i;
  for (i = nregistry - 1; i >= 0; i--)
    if (registry[i] == b) {
      registry[i] = registry[--nregistry];
      return;
    }
}

/* The live _Buffer of context `ctx` (any, for NULL) whose memory holds
 * [lo, hi), or NULL: memory of another context is copied, as any other. */
static BufferObject *registry_find(uintptr_t lo, uintptr_t hi,
                                   const ipcref_ctx *ctx) {
  Py_ssize_t i;
  for (i = nregistry - 1; i >= 0; i--)
    if (registry[i]->lo <= lo && hi <= registry[i]->hi &&
        (!ctx || registry[i]->ctx == ctx))
      return registry[i];
  return NULL;
}

/* A new _Buffer that takes the reference of view `v`, made or received
 * in context `ctx` (NULL: a private copy). *v is always taken and zeroed,
 * on failure too (released then), so a caller that releases its views
 * after a failure never releases this one twice. */
static PyObject *buffer_new(ipcref_view *v, ipcref_ctx *ctx) {
  BufferObject *b = PyObject_New(BufferObject, &BufferType);
  size_t item = ipcref_dtype_size(v->dtype);
  int d;
  if (!b) {
    ipcref_view_release(v);
    return NULL;
  }
  b->v = *v;
  memset(v, 0, sizeof *v); /* b's now: its dealloc releases it */
  b->ctx = ctx;
  b->readonly = ipcref_view_data_mut(&b->v) == NULL;
  for (d = 0; d < b->v.ndim; d++) {
    b->shape[d] = (Py_ssize_t)b->v.shape[d];
    b->strides[d] = (Py_ssize_t)(b->v.strides[d] * (int64_t)item);
  }
  b->lo = (uintptr_t)ipcref_buf_data(b->v.buf);
  b->hi = b->lo + ipcref_buf_size(b->v.buf);
  if (registry_add(b) != 0) {
    b->lo = b->hi = 0;
    Py_DECREF(b);
    return PyErr_NoMemory();
  }
  return (PyObject *)b;
}

static void buffer_dealloc(BufferObject *b) {
  registry_remove(b);
  ipcref_view_release(&b->v);
  PyObject_Free(b);
}

#define REQUESTS(flags, what) (((flags) & (what)) == (what))

/* Why the layout of `view` (shape and strides filled) cannot be given to a
 * consumer that asked with `flags`; NULL if it can. A consumer that asks
 * for no strides reads len bytes on from buf: only a C-contiguous view is
 * that. */
static const char *layout_refusal(const Py_buffer *view, int flags) {
  int c = PyBuffer_IsContiguous(view, 'C');
  int f = PyBuffer_IsContiguous(view, 'F');
  if (REQUESTS(flags, PyBUF_C_CONTIGUOUS) && !c)
    return "not C-contiguous (np.ascontiguousarray copies it)";
  if (REQUESTS(flags, PyBUF_F_CONTIGUOUS) && !f)
    return "not Fortran-contiguous (np.asfortranarray copies it)";
  if (REQUESTS(flags, PyBUF_ANY_CONTIGUOUS) && !c && !f)
    return "not contiguous (np.ascontiguousarray copies it)";
  if (!REQUESTS(flags, PyBUF_STRIDES) && !c)
    return "strided memory, asked for without strides (np.ascontiguousarray "
           "copies it)";
  return NULL;
}

static int buffer_getbuffer(BufferObject *b, Py_buffer *view, int flags) {
  const char *fmt = dt_format[b->v.dtype], *why;
  if (!fmt) {
    PyErr_SetString(PyExc_BufferError,
                    "bfloat16 has no buffer format: receive it as torch");
    return -1;
  }
  if ((flags & PyBUF_WRITABLE) && b->readonly) {
    PyErr_SetString(PyExc_BufferError,
                    "memory this process may not write (shared read-only "
                    "by its producer)");
    return -1;
  }
  view->buf = (void *)(uintptr_t)ipcref_view_data(&b->v);
  view->obj = NULL;
  view->itemsize = (Py_ssize_t)ipcref_dtype_size(b->v.dtype);
  view->len = (Py_ssize_t)ipcref_view_numel(&b->v) * view->itemsize;
  view->readonly = b->readonly;
  view->ndim = b->v.ndim;
  view->format = (flags & PyBUF_FORMAT) ? (char *)(uintptr_t)fmt : NULL;
  view->shape = b->shape;
  view->strides = b->strides;
  view->suboffsets = NULL;
  view->internal = NULL;
  if ((why = layout_refusal(view, flags)) != NULL) {
    PyErr_SetString(PyExc_BufferError, why);
    return -1;
  }
  /* What was not asked for is NULL: the consumer assumes C order, and
   * without a shape one flat run of len bytes (as PyBuffer_FillInfo). A
   * scalar has neither. */
  if (!REQUESTS(flags, PyBUF_STRIDES) || view->ndim == 0) view->strides = NULL;
  if (!REQUESTS(flags, PyBUF_ND) || view->ndim == 0) view->shape = NULL;
  if (!REQUESTS(flags, PyBUF_ND)) view->ndim = 1;
  view->obj = (PyObject *)b;
  Py_INCREF(b);
  return 0;
}

static PyBufferProcs buffer_procs = {(getbufferproc)buffer_getbuffer, NULL};

/* ---- DLPack (the legacy capsule torch 1.13 takes), declared here: the
 * ABI is fixed, and the package needs no DLPack header. */

typedef struct {
  int32_t device_type, device_id;
} dl_device;
typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} dl_dtype;
typedef struct {
  void *data;
  dl_device device;
  int32_t ndim;
  dl_dtype dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
} dl_tensor;
typedef struct dl_managed {
  dl_tensor t;
  void *manager_ctx;
  void (*deleter)(struct dl_managed *self);
} dl_managed;

typedef struct {
  dl_managed m;
  PyObject *owner; /* the _Buffer, kept alive while the tensor is */
  int64_t shape[IPCREF_MAX_DIMS], strides[IPCREF_MAX_DIMS];
} dl_export;

static const dl_dtype dl_types[IPCREF_DTYPE_COUNT] = {
    {6, 8, 1},  {0, 8, 1},  {0, 16, 1}, {0, 32, 1}, {0, 64, 1},
    {1, 8, 1},  {1, 16, 1}, {1, 32, 1}, {1, 64, 1}, {2, 16, 1},
    {4, 16, 1}, {2, 32, 1}, {2, 64, 1}, {5, 64, 1}, {5, 128, 1}};

static void dl_deleter(dl_managed *self) {
  dl_export *e = (dl_export *)self->manager_ctx;
  PyGILState_STATE g = PyGILState_Ensure();
  Py_XDECREF(e->owner);
  PyMem_RawFree(e);
  PyGILState_Release(g);
}

static void dl_capsule_free(PyObject *cap) {
  dl_managed *m;
  if (!PyCapsule_IsValid(cap, "dltensor")) return; /* consumed */
  m = (dl_managed *)PyCapsule_GetPointer(cap, "dltensor");
  if (m && m->deleter) m->deleter(m);
}

/* A DLPack capsule of the view; bool as uint8 when `as_u8` (torch 1.x
 * takes no kDLBool: the caller views the tensor as bool). */
static PyObject *dlpack_of(BufferObject *b, int as_u8) {
  dl_export *e;
  int d;
  PyObject *cap;
  if (b->readonly) /* as the library's own DLPack export of such memory */
    return raise_why(IPCREF_ENEEDCOPY,
                     "read-only memory: DLPack (torch) has no read-only "
                     "tensors: take a private copy");
  e = (dl_export *)PyMem_RawCalloc(1, sizeof *e);
  if (!e) return PyErr_NoMemory();
  e->owner = (PyObject *)b;
  Py_INCREF(b);
  for (d = 0; d < b->v.ndim; d++) {
    e->shape[d] = b->v.shape[d];
    e->strides[d] = b->v.strides[d];
  }
  e->m.t.data = (void *)(uintptr_t)ipcref_view_data(&b->v);
  e->m.t.device.device_type = 1; /* kDLCPU */
  e->m.t.ndim = b->v.ndim;
  e->m.t.dtype = as_u8 && b->v.dtype == IPCREF_BOOL ? dl_types[IPCREF_U8]
                                                    : dl_types[b->v.dtype];
  e->m.t.shape = e->shape;
  e->m.t.strides = e->strides;
  e->m.manager_ctx = e;
  e->m.deleter = dl_deleter;
  cap = PyCapsule_New(&e->m, "dltensor", dl_capsule_free);
  if (!cap) dl_deleter(&e->m);
  return cap;
}

static PyObject *buffer_dlpack(BufferObject *b, PyObject *args, PyObject *kw) {
  (void)args;
  (void)kw;
  return dlpack_of(b, 0);
}

/* _dlpack_u8(): the capsule with bool exported as uint8. */
static PyObject *buffer_dlpack_u8(BufferObject *b, PyObject *noargs) {
  (void)noargs;
  return dlpack_of(b, 1);
}

/* _private(): a new _Buffer over a private, writable, C-contiguous copy
 * of the elements (any dtype: the buffer protocol has no bfloat16). */
static PyObject *buffer_private(BufferObject *b, PyObject *noargs) {
  ipcref_view out;
  ipcref_result r;
  (void)noargs;
  CALL_BEGIN();
  Py_BEGIN_ALLOW_THREADS r = ipcref_view_contiguous(&b->v, &out);
  if (r == IPCREF_OK && out.buf == b->v.buf) /* already contiguous: copy */
    r = ipcref_view_make_mut(&out) == IPCREF_OK &&
                ipcref_view_data_mut(&out) != NULL
            ? IPCREF_OK
            : IPCREF_ENOMEM;
  Py_END_ALLOW_THREADS if (r != IPCREF_OK) return raise_result(r);
  return buffer_new(&out, NULL);
}

static PyObject *buffer_dlpack_device(BufferObject *b, PyObject *noargs) {
  (void)b;
  (void)noargs;
  return Py_BuildValue("(ii)", 1, 0);
}

static PyObject *buffer_get_readonly(BufferObject *b, void *c) {
  (void)c;
  return PyBool_FromLong(b->readonly);
}

static PyObject *buffer_get_dtype(BufferObject *b, void *c) {
  (void)c;
  return PyLong_FromLong((long)b->v.dtype);
}

static PyObject *buffer_get_shape(BufferObject *b, void *c) {
  PyObject *t = PyTuple_New(b->v.ndim), *n;
  int d;
  (void)c;
  for (d = 0; t && d < b->v.ndim; d++) {
    if (!(n = PyLong_FromLongLong(b->v.shape[d]))) {
      Py_DECREF(t); /* its unset items are NULL: fine to free */
      return NULL;
    }
    PyTuple_SET_ITEM(t, d, n);
  }
  return t;
}

static PyMethodDef buffer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack,
     METH_VARARGS | METH_KEYWORDS, "A DLPack capsule (zero copy)."},
    {"__dlpack_device__", (PyCFunction)buffer_dlpack_device, METH_NOARGS,
     "(kDLCPU, 0)."},
    {"_dlpack_u8", (PyCFunction)buffer_dlpack_u8, METH_NOARGS, NULL},
    {"_private", (PyCFunction)buffer_private, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef buffer_getset[] = {
    {"readonly", (getter)buffer_get_readonly, NULL, "read-only here", NULL},
    {"dtype", (getter)buffer_get_dtype, NULL, "the ipcref dtype code", NULL},
    {"shape", (getter)buffer_get_shape, NULL, "the shape", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ipcref._ipcref._Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_as_buffer = &buffer_procs,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One view of shared memory (buffer protocol, DLPack).",
    .tp_methods = buffer_methods,
    .tp_getset = buffer_getset};

/* ---- _Context -------------------------------------------------------------
 */

typedef struct PeerObject PeerObject;

typedef struct {
  PyObject_HEAD ipcref_ctx *ctx;
  PeerObject *peers; /* its open peers: closed with it */
  int calls; /* calls on ctx that released the GIL and still run on it */
} ContextObject;

static PyTypeObject ContextType, PeerType;

struct PeerObject {
  PyObject_HEAD ipcref_peer *p;
  ContextObject *ctx; /* alive while the peer is */
  int busy;           /* a call runs on it (another thread's is refused) */
  PeerObject *next, *prev;
};

/* Forgets peer `po` in its context's list (its ipcref_peer is gone). */
static void peer_unlink(PeerObject *po) {
  if (po->prev)
    po->prev->next = po->next;
  else if (po->ctx && po->ctx->peers == po)
    po->ctx->peers = po->next;
  if (po->next) po->next->prev = po->prev;
  po->next = po->prev = NULL;
}

static int ctx_open(ContextObject *c, const char *what) {
  if (c->ctx) return 1;
  PyErr_Format(PyExc_ValueError, "%s on a closed Context", what);
  return 0;
}

/* Around a call that releases the GIL on c->ctx (under the GIL): close
 * refuses while one runs, which would free the context under it. */
#define CTX_ENTER(c) ((c)->calls++)
#define CTX_LEAVE(c) ((c)->calls--)

/* *out = `o` (an int; NULL: the 0 it holds) as a size of at most `max`:
 * OverflowError above it, ValueError below 0 (unsigned in C: -1 would
 * be a huge size). */
static int size_arg(PyObject *o, const char *name, unsigned long long max,
                    unsigned long long *out) {
  PyObject *n;
  int over = 0, big = 0;
  long long v;
  if (!o) return 0;
  if (!(n = PyNumber_Index(o))) return -1;
  v = PyLong_AsLongLongAndOverflow(n, &over);
  if (over > 0 && (*out = PyLong_AsUnsignedLongLong(n)) == ULLONG_MAX &&
      PyErr_Occurred()) {
    PyErr_Clear(); /* past 64 bits: said below, naming the argument */
    big = 1;
  }
  Py_DECREF(n);
  if (over < 0 || (over == 0 && v < 0)) {
    PyErr_Format(PyExc_ValueError, "%s must be 0 or more", name);
    return -1;
  }
  if (over == 0) *out = (unsigned long long)v;
  if (big || *out > max) {
    PyErr_Format(PyExc_OverflowError, "%s is at most %llu", name, max);
    return -1;
  }
  return 0;
}

static int context_init(ContextObject *c, PyObject *args, PyObject *kw) {
  static char *names[] = {
      "segment_size",    "max_bytes",        "segment_cache",
      "writable_shares", "isolate",          "ledger_slots",
      "max_maps",        "max_mapped_bytes", NULL};
  PyObject *arg[8] = {NULL};
  unsigned long long seg = 0, max = 0, cache = 0, slots = 0, maps = 0,
                     mapped = 0;
  int writable = 0, isolate = 0;
  ipcref_ctx_options o;
  ipcref_result r;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOppOOO", names, &arg[0],
                                   &arg[1], &arg[2], &writable, &isolate,
                                   &arg[5], &arg[6], &arg[7]) ||
      size_arg(arg[0], names[0], SIZE_MAX, &seg) ||
      size_arg(arg[1], names[1], SIZE_MAX, &max) ||
      size_arg(arg[2], names[2], SIZE_MAX, &cache) ||
      size_arg(arg[5], names[5], UINT32_MAX, &slots) ||
      size_arg(arg[6], names[6], SIZE_MAX, &maps) ||
      size_arg(arg[7], names[7], SIZE_MAX, &mapped))
    return -1;
  memset(&o, 0, sizeof o);
  o.segment_size = (size_t)seg;
  o.max_bytes = (size_t)max;
  o.segment_cache = (size_t)cache;
  o.writable_shares = writable;
  o.isolate = isolate;
  o.ledger_slots = (uint32_t)slots;
  o.max_maps = (size_t)maps;
  o.max_mapped_bytes = (size_t)mapped;
  if (c->ctx) return 0;
  CALL_BEGIN();
  r = ipcref_ctx_new(&o, &c->ctx);
  if (r != IPCREF_OK) {
    raise_result(r);
    return -1;
  }
  return 0;
}

static void context_dealloc(ContextObject *c) {
  if (c->ctx) ipcref_ctx_free(c->ctx); /* no peer left: each held it */
  Py_TYPE(c)->tp_free((PyObject *)c);
}

/* Frees the context and with it every open peer (refused while one is in
 * use by another thread, or another thread's call runs on the context). */
static PyObject *context_close(ContextObject *c, PyObject *noargs) {
  PeerObject *po;
  (void)noargs;
  if (c->calls) {
    PyErr_SetString(PyExc_RuntimeError,
                    "close: another thread is in a call on this Context");
    return NULL;
  }
  for (po = c->peers; po; po = po->next)
    if (po->busy) {
      PyErr_SetString(PyExc_RuntimeError,
                      "close: a Peer of this Context is in use");
      return NULL;
    }
  while ((po = c->peers) != NULL) {
    ipcref_peer_free(po->p);
    po->p = NULL;
    peer_unlink(po);
  }
  if (c->ctx) ipcref_ctx_free(c->ctx);
  c->ctx = NULL;
  Py_RETURN_NONE;
}

/* _empty(dtype, shape): a C-contiguous _Buffer in shared memory. */
static PyObject *context_empty(ContextObject *c, PyObject *args) {
  int dt;
  PyObject *shape_obj;
  int64_t shape[IPCREF_MAX_DIMS];
  Py_ssize_t nd, d;
  ipcref_view v;
  ipcref_result r;
  if (!PyArg_ParseTuple(args, "iO!", &dt, &PyTuple_Type, &shape_obj))
    return NULL;
  if (!ctx_open(c, "empty")) return NULL;
  nd = PyTuple_GET_SIZE(shape_obj);
  if (dt < 0 || dt >= IPCREF_DTYPE_COUNT || nd > IPCREF_MAX_DIMS) {
    PyErr_SetString(PyExc_ValueError, nd > IPCREF_MAX_DIMS
                                          ? "more dimensions than ipcref's 8"
                                          : "an unknown dtype");
    return NULL;
  }
  for (d = 0; d < nd; d++) {
    shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape_obj, d));
    if (shape[d] == -1 && PyErr_Occurred()) return NULL;
  }
  CALL_BEGIN();
  CTX_ENTER(c);
  Py_BEGIN_ALLOW_THREADS r =
      ipcref_view_new_shared(c->ctx, (ipcref_dtype)dt, (int)nd, shape, &v);
  Py_END_ALLOW_THREADS CTX_LEAVE(c);
  if (r != IPCREF_OK) return raise_result(r);
  return buffer_new(&v, c->ctx);
}

static PyObject *peer_wrap(ContextObject *c, ipcref_peer *p) {
  PeerObject *po = PyObject_New(PeerObject, &PeerType);
  if (!po) {
    ipcref_peer_free(p);
    return NULL;
  }
  po->p = p;
  po->ctx = c;
  po->busy = 0;
  po->prev = NULL;
  po->next = c->peers;
  if (c->peers) c->peers->prev = po;
  c->peers = po;
  Py_INCREF(c);
  return (PyObject *)po;
}

static PyObject *context_connect(ContextObject *c, PyObject *args) {
  const char *path;
  ipcref_peer *p = NULL;
  ipcref_result r;
  if (!PyArg_ParseTuple(args, "s", &path) || !ctx_open(c, "connect"))
    return NULL;
  CALL_BEGIN();
  CTX_ENTER(c);
  Py_BEGIN_ALLOW_THREADS r = ipcref_connect(c->ctx, path, &p);
  Py_END_ALLOW_THREADS CTX_LEAVE(c);
  if (r != IPCREF_OK) return raise_result(r);
  return peer_wrap(c, p);
}

/* _adopt(fd): the peer owns the fd from now on (also on error: closed). */
static PyObject *context_adopt(ContextObject *c, PyObject *args) {
  int fd;
  ipcref_peer *p = NULL;
  ipcref_result r;
  if (!PyArg_ParseTuple(args, "i", &fd) || !ctx_open(c, "adopt")) return NULL;
  CALL_BEGIN();
  r = ipcref_peer_new(c->ctx, fd, &p);
  if (r != IPCREF_OK) {
    close(fd);
    return raise_result(r);
  }
  return peer_wrap(c, p);
}

static PyObject *context_listen(ContextObject *c, PyObject *args) {
  const char *path;
  int fd = -1;
  ipcref_result r;
  if (!PyArg_ParseTuple(args, "s", &path) || !ctx_open(c, "listen"))
    return NULL;
  CALL_BEGIN();
  r = ipcref_listen(c->ctx, path, &fd);
  if (r != IPCREF_OK) return raise_result(r);
  return PyLong_FromLong(fd);
}

static PyObject *context_accept(ContextObject *c, PyObject *args) {
  int fd, ms;
  ipcref_peer *p = NULL;
  ipcref_result r;
  if (!PyArg_ParseTuple(args, "ii", &fd, &ms) || !ctx_open(c, "accept"))
    return NULL;
  CALL_BEGIN();
  CTX_ENTER(c);
  Py_BEGIN_ALLOW_THREADS r = ipcref_accept(c->ctx, fd, ms, &p);
  Py_END_ALLOW_THREADS CTX_LEAVE(c);
  if (r != IPCREF_OK) return raise_result(r);
  return peer_wrap(c, p);
}

/* d[key] = v, taking the new reference `v` (PyDict_SetItemString takes
 * its own); -1 with the error set when v is NULL or the set failed. */
static int dict_take(PyObject *d, const char *key, PyObject *v) {
  int rc = v ? PyDict_SetItemString(d, key, v) : -1;
  Py_XDECREF(v);
  return rc;
}

#define STAT(name)                                                             \
  do {                                                                         \
    if (dict_take(d, #name, PyLong_FromSize_t(s.name)) != 0) goto fail;        \
  } while (0)
#define STAT64(name)                                                           \
  do {                                                                         \
    if (dict_take(d, #name, PyLong_FromUnsignedLongLong(s.name)) != 0)         \
      goto fail;                                                               \
  } while (0)

static PyObject *context_stats(ContextObject *c, PyObject *noargs) {
  ipcref_stats s;
  PyObject *d;
  ipcref_result r;
  (void)noargs;
  if (!ctx_open(c, "stats")) return NULL;
  CALL_BEGIN();
  r = ipcref_ctx_stats(c->ctx, &s);
  if (r != IPCREF_OK) return raise_result(r);
  if (!(d = PyDict_New())) return NULL;
  STAT(segment_bytes);
  STAT(cached_bytes);
  STAT(live_bufs);
  STAT(live_bytes);
  STAT(limbo_blocks);
  STAT(limbo_bytes);
  STAT(live_slots);
  STAT(counter_files);
  STAT(peers);
  STAT(mapped_segments);
  STAT(maps_in);
  STAT(maps_in_bytes);
  STAT(imported_bufs);
  STAT64(fds_sent);
  STAT64(fds_received);
  STAT64(reclaimed);
  STAT64(refused);
  STAT64(cache_hits);
  STAT64(cache_misses);
  return d;
fail:
  Py_DECREF(d);
  return NULL;
}

static PyObject *context_collect(ContextObject *c, PyObject *noargs) {
  size_t n;
  ipcref_stats s;
  ipcref_result r;
  (void)noargs;
  if (!ctx_open(c, "collect")) return NULL;
  CALL_BEGIN();
  r = ipcref_ctx_stats(c->ctx, &s); /* EDEAD: a forked child's copy */
  if (r != IPCREF_OK) return raise_result(r);
  CTX_ENTER(c);
  Py_BEGIN_ALLOW_THREADS n = ipcref_collect(c->ctx);
  Py_END_ALLOW_THREADS CTX_LEAVE(c);
  return PyLong_FromSize_t(n);
}

static PyObject *context_fileno(ContextObject *c, PyObject *noargs) {
  int fd;
  (void)noargs;
  if (!ctx_open(c, "fileno")) return NULL;
  CALL_BEGIN();
  fd = ipcref_ctx_poll_fd(c->ctx);
  if (fd < 0) return raise_result(IPCREF_EDEAD); /* a forked child's copy */
  return PyLong_FromLong(fd);
}

static PyMethodDef context_methods[] = {
    {"close", (PyCFunction)context_close, METH_NOARGS, NULL},
    {"_empty", (PyCFunction)context_empty, METH_VARARGS, NULL},
    {"_connect", (PyCFunction)context_connect, METH_VARARGS, NULL},
    {"_adopt", (PyCFunction)context_adopt, METH_VARARGS, NULL},
    {"_listen", (PyCFunction)context_listen, METH_VARARGS, NULL},
    {"_accept", (PyCFunction)context_accept, METH_VARARGS, NULL},
    {"stats", (PyCFunction)context_stats, METH_NOARGS, NULL},
    {"collect", (PyCFunction)context_collect, METH_NOARGS, NULL},
    {"fileno", (PyCFunction)context_fileno, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ContextType = {PyVarObject_HEAD_INIT(NULL, 0).tp_name =
                                       "ipcref._ipcref._Context",
                                   .tp_basicsize = sizeof(ContextObject),
                                   .tp_dealloc = (destructor)context_dealloc,
                                   .tp_flags = Py_TPFLAGS_DEFAULT,
                                   .tp_doc = "An ipcref context.",
                                   .tp_methods = context_methods,
                                   .tp_init = (initproc)context_init,
                                   .tp_new = PyType_GenericNew};

/* ---- _Peer ------------------------------------------------------------------
 */

static int peer_enter(PeerObject *po, const char *what) {
  if (!po->p) {
    PyErr_Format(PyExc_ValueError, "%s on a closed Peer", what);
    return 0;
  }
  if (po->busy) {
    PyErr_Format(PyExc_RuntimeError,
                 "%s: another thread is using this Peer (one at a time)", what);
    return 0;
  }
  po->busy = 1;
  return 1;
}

static void peer_dealloc(PeerObject *po) {
  if (po->p) {
    ipcref_peer_free(po->p);
    peer_unlink(po);
  }
  Py_XDECREF(po->ctx);
  PyObject_Free(po);
}

static PyObject *peer_close(PeerObject *po, PyObject *noargs) {
  (void)noargs;
  if (po->busy) {
    PyErr_SetString(PyExc_RuntimeError, "close: the Peer is in use");
    return NULL;
  }
  if (po->p) {
    ipcref_peer_free(po->p);
    peer_unlink(po);
  }
  po->p = NULL;
  Py_RETURN_NONE;
}

/* A view over memory [addr, addr + extent) described by dtype, shape and
 * strides (elements): of the live _Buffer that holds it, or else a new
 * shared block the caller fills from it (*copy_from set). */
typedef struct {
  ipcref_view view;   /* what is sent */
  ipcref_view source; /* when copied: the caller's memory, borrowed */
  int copy;
} send_item;

/* The bytes a strided view reaches: [lo, hi) from its first element. */
static int extent_of(int nd, const int64_t *shape, const int64_t *strides,
                     size_t item, int64_t *lo, int64_t *hi) {
  int d;
  *lo = 0;
  *hi = (int64_t)item;
  for (d = 0; d < nd; d++) {
    if (shape[d] == 0) {
      *hi = *lo;
      return 1;
    }
    if (strides[d] > 0)
      *hi += strides[d] * (shape[d] - 1) * (int64_t)item;
    else
      *lo += strides[d] * (shape[d] - 1) * (int64_t)item;
  }
  return 1;
}

/* The view of live _Buffer `b`'s buffer that the array at `addr` is, in the
 * array's own dtype: its shape and strides count its elements, whatever
 * the _Buffer's dtype (a.view(np.int32) of a float32 array). 1: made;
 * 0: not a view in that dtype (the offset is not a multiple of its size,
 * or the buffer is smaller than one): the caller copies; -1: raised. */
static int item_view_of(BufferObject *b, char *addr, int dt, int nd,
                        const int64_t *shape, const int64_t *strides,
                        ipcref_view *out) {
  int64_t off = (int64_t)((uintptr_t)addr - b->lo);
  ipcref_view whole;
  ipcref_result r;
  if (off % (int64_t)ipcref_dtype_size((ipcref_dtype)dt) != 0) return 0;
  if (ipcref_view_of(b->v.buf, (ipcref_dtype)dt, 0, NULL, &whole) !=
      IPCREF_OK) {
    CALL_BEGIN(); /* whatever it told the hook is not this call's error */
    return 0;
  }
  r = ipcref_view_as_strided(&whole, nd, shape, strides, off, out);
  ipcref_view_release(&whole);
  return r == IPCREF_OK ? 1 : (raise_result(r), -1);
}

static int item_make(ContextObject *c, char *addr, int dt, int nd,
                     const int64_t *shape, const int64_t *strides,
                     send_item *it) {
  size_t item = ipcref_dtype_size((ipcref_dtype)dt);
  int64_t lo, hi;
  BufferObject *b;
  ipcref_result r;
  ipcref_buf *wrap = NULL;
  memset(it, 0, sizeof *it);
  extent_of(nd, shape, strides, item, &lo, &hi);
  b = registry_find((uintptr_t)(addr + lo),
                    (uintptr_t)(addr + (hi > lo ? hi : lo + 1)), c->ctx);
  if (b) {
    int made = item_view_of(b, addr, dt, nd, shape, strides, &it->view);
    if (made != 0) return made > 0 ? 0 : -1;
  }
  if (hi <= lo) { /* empty: nothing to copy */
    r = ipcref_view_new_shared(c->ctx, (ipcref_dtype)dt, nd, shape, &it->view);
    return r == IPCREF_OK ? 0 : (raise_result(r), -1);
  }
  /* Not ours: a new block, filled once from the caller's memory. */
  r = ipcref_buf_wrap(addr + lo, (size_t)(hi - lo), NULL, NULL, &wrap);
  if (r == IPCREF_OK)
    r = ipcref_view_of(wrap, (ipcref_dtype)dt, 0, NULL, &it->source);
  ipcref_buf_release(wrap);
  if (r == IPCREF_OK)
    r = ipcref_view_as_strided(&it->source, nd, shape, strides, -lo,
                               &it->source);
  if (r == IPCREF_OK)
    r = ipcref_view_new_shared(c->ctx, (ipcref_dtype)dt, nd, shape, &it->view);
  if (r != IPCREF_OK) {
    ipcref_view_release(&it->source);
    return (raise_result(r), -1);
  }
  it->copy = 1;
  return 0;
}

/* One item from Python: an object with the buffer protocol, or a tuple
 * (address, dtype, shape, strides in elements, owner). */
static int item_from(ContextObject *c, PyObject *o, send_item *it) {
  int64_t shape[IPCREF_MAX_DIMS], strides[IPCREF_MAX_DIMS];
  int d, nd, dt, rc;
  if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 5) {
    unsigned long long addr;
    PyObject *sh, *st;
    if (!PyArg_ParseTuple(o, "KiO!O!O", &addr, &dt, &PyTuple_Type, &sh,
                          &PyTuple_Type, &st, &o))
      return -1;
    nd = (int)PyTuple_GET_SIZE(sh);
    if (dt < 0 || dt >= IPCREF_DTYPE_COUNT || nd > IPCREF_MAX_DIMS ||
        PyTuple_GET_SIZE(st) != nd) {
      PyErr_SetString(PyExc_ValueError, "a tensor ipcref cannot describe");
      return -1;
    }
    for (d = 0; d < nd; d++) {
      shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, d));
      strides[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(st, d));
    }
    if (PyErr_Occurred()) return -1;
    return item_make(c, (char *)(uintptr_t)addr, dt, nd, shape, strides, it);
  } else {
    Py_buffer pb;
    if (PyObject_GetBuffer(o, &pb, PyBUF_RECORDS_RO) != 0) return -1;
    dt = dtype_of_format(pb.format, pb.itemsize);
    if (dt < 0 || pb.ndim > IPCREF_MAX_DIMS) {
      PyErr_Format(PyExc_TypeError, "ipcref cannot share format '%s' %s",
                   pb.format ? pb.format : "B",
                   pb.ndim > IPCREF_MAX_DIMS ? "in over 8 dimensions" : "");
      PyBuffer_Release(&pb);
      return -1;
    }
    nd = pb.ndim;
    for (d = 0; d < nd; d++) {
      shape[d] = pb.shape[d];
      if (pb.strides[d] % pb.itemsize != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "strides not a multiple of the item size");
        PyBuffer_Release(&pb);
        return -1;
      }
      strides[d] = pb.strides[d] / pb.itemsize;
    }
    rc = item_make(c, (char *)pb.buf, dt, nd, shape, strides, it);
    PyBuffer_Release(&pb); /* the caller keeps `o` alive during the send */
    return rc;
  }
}

/* _send(items, meta): one message of the items' views and the metadata. */
static PyObject *peer_send(PeerObject *po, PyObject *args) {
  PyObject *items;
  const char *meta = NULL;
  Py_ssize_t meta_len = 0, n, i, made = 0;
  send_item it[IPCREF_MSG_MAX_VIEWS];
  ipcref_view views[IPCREF_MSG_MAX_VIEWS];
  ipcref_result r = IPCREF_OK;
  ContextObject *c;
  if (!PyArg_ParseTuple(args, "O!y#", &PyList_Type, &items, &meta, &meta_len))
    return NULL;
  n = PyList_GET_SIZE(items);
  if (n < 1 || n > IPCREF_MSG_MAX_VIEWS) {
    PyErr_Format(PyExc_ValueError, "a batch holds 1 to %d arrays",
                 IPCREF_MSG_MAX_VIEWS);
    return NULL;
  }
  if (!peer_enter(po, "send")) return NULL;
  c = po->ctx;
  if (!c->ctx) {
    po->busy = 0;
    PyErr_SetString(PyExc_ValueError, "send: its Context is closed");
    return NULL;
  }
  CALL_BEGIN();
  for (i = 0; i < n; i++, made++)
    if (item_from(c, PyList_GET_ITEM(items, i), &it[i]) != 0) break;
  if (made == n) {
    Py_BEGIN_ALLOW_THREADS for (i = 0; i < n && r == IPCREF_OK; i++) {
      if (it[i].copy) r = ipcref_view_copy(&it[i].view, &it[i].source);
      views[i] = it[i].view;
    }
    if (r == IPCREF_OK)
      r = ipcref_send_meta(po->p, views, (int)n, meta, (size_t)meta_len);
    Py_END_ALLOW_THREADS
  }
  for (i = 0; i < made; i++) {
    ipcref_view_release(&it[i].view);
    ipcref_view_release(&it[i].source);
  }
  po->busy = 0;
  if (made != n) return NULL;
  if (r == IPCREF_EAGAIN) { /* say which wait */
    int w = ipcref_peer_wants(po->p);
    snprintf(last_message, sizeof last_message, "%s",
             w == IPCREF_WANTS_ROOM ? "the other side holds its max_bytes_held"
             : w == POLLOUT         ? "its socket is full"
                                    : "its hello has not come yet");
  }
  if (r != IPCREF_OK) return raise_result(r);
  Py_RETURN_NONE;
}

/* _recv(timeout_ms): ([_Buffer, ...], meta bytes) of one whole message. */
static PyObject *peer_recv(PeerObject *po, PyObject *args) {
  int ms, n = 0, i;
  ipcref_view v[IPCREF_MSG_MAX_VIEWS];
  ipcref_result r;
  PyObject *list = NULL, *meta = NULL, *out = NULL;
  const void *m;
  size_t mlen = 0;
  if (!PyArg_ParseTuple(args, "i", &ms) || !peer_enter(po, "recv")) return NULL;
  CALL_BEGIN();
  Py_BEGIN_ALLOW_THREADS r = ipcref_recv(po->p, &v[0], ms);
  if (r == IPCREF_OK)
    for (n = 1; n < IPCREF_MSG_MAX_VIEWS && ipcref_recv_pending(po->p) > 0 &&
                ipcref_recv(po->p, &v[n], 0) == IPCREF_OK;
         n++)
      continue;
  Py_END_ALLOW_THREADS po->busy = 0;
  if (r != IPCREF_OK) return raise_result(r);
  m = ipcref_recv_meta(po->p, &mlen);
  meta = PyBytes_FromStringAndSize((const char *)m, (Py_ssize_t)mlen);
  list = PyList_New(n);
  for (i = 0; i < n; i++) {
    PyObject *b = list && meta ? buffer_new(&v[i], po->ctx->ctx) : NULL;
    if (!b) { /* buffer_new took v[i] (zeroed): a no-op here */
      for (; i < n; i++) ipcref_view_release(&v[i]);
      break;
    }
    PyList_SET_ITEM(list, i, b);
  }
  if (list && meta && !PyErr_Occurred()) out = PyTuple_Pack(2, list, meta);
  Py_XDECREF(list);
  Py_XDECREF(meta);
  return out;
}

static PyObject *peer_fileno(PeerObject *po, PyObject *noargs) {
  int fd;
  (void)noargs;
  if (!po->p) {
    PyErr_SetString(PyExc_ValueError, "fileno on a closed Peer");
    return NULL;
  }
  CALL_BEGIN();
  errno = 0;
  fd = ipcref_peer_poll_fd(po->p);
  if (fd < 0) /* reported: a forked child's copy; else errno says */
    return raise_result(last_message[0] ? IPCREF_EDEAD : IPCREF_ESYS);
  return PyLong_FromLong(fd);
}

static PyObject *peer_pid(PeerObject *po, PyObject *noargs) {
  int pid;
  (void)noargs;
  if (!peer_enter(po, "pid")) return NULL;
  CALL_BEGIN();
  Py_BEGIN_ALLOW_THREADS pid = ipcref_peer_pid(po->p);
  Py_END_ALLOW_THREADS po->busy = 0;
  if (pid <= 0) return raise_result(IPCREF_EDEAD); /* a forked child's */
  return PyLong_FromLong(pid);
}

static PyObject *peer_stats(PeerObject *po, PyObject *noargs) {
  ipcref_peer_info in;
  ipcref_result r;
  (void)noargs;
  if (!peer_enter(po, "stats")) return NULL;
  CALL_BEGIN();
  r = ipcref_peer_stats(po->p, &in);
  po->busy = 0;
  if (r != IPCREF_OK) return raise_result(r);
  return Py_BuildValue(
      "{s:i,s:O,s:n,s:n,s:n,s:n,s:n,s:K,s:K,s:i,s:i,s:n,s:n}", "pid", in.pid,
      "alive", in.alive ? Py_True : Py_False, "leases", (Py_ssize_t)in.leases,
      "bytes_held", (Py_ssize_t)in.bytes_held, "forwarded",
      (Py_ssize_t)in.forwarded, "forwarded_bytes",
      (Py_ssize_t)in.forwarded_bytes, "pending", (Py_ssize_t)in.pending,
      "sent_channel", (unsigned long long)in.sent_channel, "sent_socket",
      (unsigned long long)in.sent_socket, "channel_out", in.channel_out,
      "channel_in", in.channel_in, "maps", (Py_ssize_t)in.maps, "mapped_bytes",
      (Py_ssize_t)in.mapped_bytes);
}

/* _set_options(send_timeout_ms, hello_timeout_ms, max_bytes_held,
 * ring_bytes, spin_us, max_maps, max_mapped_bytes). */
static PyObject *peer_set_options(PeerObject *po, PyObject *args) {
  ipcref_peer_options o;
  PyObject *arg[4];
  unsigned long long cap = 0, ring = 0, maps = 0, mapped = 0;
  ipcref_result r;
  memset(&o, 0, sizeof o);
  if (!PyArg_ParseTuple(args, "iiOOiOO", &o.send_timeout_ms,
                        &o.hello_timeout_ms, &arg[0], &arg[1], &o.spin_us,
                        &arg[2], &arg[3]) ||
      size_arg(arg[0], "max_bytes_held", SIZE_MAX, &cap) ||
      size_arg(arg[1], "ring_bytes", SIZE_MAX, &ring) ||
      size_arg(arg[2], "max_maps", SIZE_MAX, &maps) ||
      size_arg(arg[3], "max_mapped_bytes", SIZE_MAX, &mapped) ||
      !peer_enter(po, "set_options"))
    return NULL;
  o.max_bytes_held = (size_t)cap;
  o.ring_bytes = (size_t)ring;
  o.max_maps = (size_t)maps;
  o.max_mapped_bytes = (size_t)mapped;
  CALL_BEGIN();
  r = ipcref_peer_set_options(po->p, &o);
  po->busy = 0;
  if (r != IPCREF_OK) return raise_result(r);
  Py_RETURN_NONE;
}

static PyMethodDef peer_methods[] = {
    {"_set_options", (PyCFunction)peer_set_options, METH_VARARGS, NULL},
    {"close", (PyCFunction)peer_close, METH_NOARGS, NULL},
    {"_send", (PyCFunction)peer_send, METH_VARARGS, NULL},
    {"_recv", (PyCFunction)peer_recv, METH_VARARGS, NULL},
    {"fileno", (PyCFunction)peer_fileno, METH_NOARGS, NULL},
    {"_pid", (PyCFunction)peer_pid, METH_NOARGS, NULL},
    {"stats", (PyCFunction)peer_stats, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject PeerType = {PyVarObject_HEAD_INIT(NULL, 0).tp_name =
                                    "ipcref._ipcref._Peer",
                                .tp_basicsize = sizeof(PeerObject),
                                .tp_dealloc = (destructor)peer_dealloc,
                                .tp_flags = Py_TPFLAGS_DEFAULT,
                                .tp_doc = "An ipcref peer.",
                                .tp_methods = peer_methods};

/* ---- the module -------------------------------------------------------------
 */

static PyObject *set_errors(PyObject *self, PyObject *args) {
  PyObject *e[4];
  (void)self;
  if (!PyArg_ParseTuple(args, "OOOO", &e[0], &e[1], &e[2], &e[3])) return NULL;
  /* Held for good; a second call (a reload) drops the first ones. */
  Py_INCREF(e[0]);
  Py_INCREF(e[1]);
  Py_INCREF(e[2]);
  Py_INCREF(e[3]);
  Py_XSETREF(err_base, e[0]);
  Py_XSETREF(err_timeout, e[1]);
  Py_XSETREF(err_wouldblock, e[2]);
  Py_XSETREF(err_peergone, e[3]);
  Py_RETURN_NONE;
}

/* _owns(address, nbytes): whether the bytes lie in a live _Buffer's
 * memory (sent zero copy), or would be copied. */
static PyObject *owns(PyObject *self, PyObject *args) {
  unsigned long long addr, n;
  (void)self;
  if (!PyArg_ParseTuple(args, "KK", &addr, &n)) return NULL;
  return PyBool_FromLong(registry_find((uintptr_t)addr,
                                       (uintptr_t)(addr + (n ? n : 1)),
                                       NULL) != NULL);
}

static PyMethodDef module_methods[] = {
    {"_set_errors", set_errors, METH_VARARGS, NULL},
    {"_owns", owns, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT,
                                        "_ipcref",
                                        "ipcref's C extension",
                                        -1,
                                        module_methods,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL};

static int add_type(PyObject *m, PyTypeObject *t, const char *name) {
  if (PyType_Ready(t) < 0) return -1;
  Py_INCREF(t);
  if (PyModule_AddObject(m, name, (PyObject *)t) == 0) return 0;
  Py_DECREF(t); /* taken only on success */
  return -1;
}

PyMODINIT_FUNC PyInit__ipcref(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (add_type(m, &BufferType, "_Buffer") || add_type(m, &PeerType, "_Peer") ||
      add_type(m, &ContextType, "_Context") ||
      PyModule_AddIntConstant(m, "META_MAX", IPCREF_META_MAX) ||
      PyModule_AddIntConstant(m, "MAX_VIEWS", IPCREF_MSG_MAX_VIEWS)) {
    Py_DECREF(m);
    return NULL;
  }
  (void)ipcref_set_error_hook(&the_hook);
  return m;
}
