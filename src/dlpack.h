/* dlpack: views to and from DLPack tensors, for handing tensors to other
 * frameworks (NumPy, PyTorch, JAX, CuPy, ...) and taking theirs, without
 * copying. Present only when <dlpack/dlpack.h> (v0.6 or later) is included
 * before ipcref.h; the versioned structs (DLManagedTensorVersioned) only
 * with a DLPack 1.x header.
 *
 * Export. ipcref_view_to_dlpack gives a DLManagedTensor that holds its own
 * reference to the view's buffer: the consumer calls its deleter once, when
 * it is done, and that releases the reference. `data` points at element
 * (0,...,0), never NULL (PyTorch 1.13 leaks a tensor whose data is NULL),
 * and `byte_offset` is 0 (PyTorch 1.13 ignores byte_offset); `strides` are
 * always set (in elements; 0 and negative strides pass as they are); the
 * device is the buffer's (kDLCPU 0 for host memory, kDLCUDA or kDLROCM for
 * a backend's device memory). The tensor is shared with the consumer: by
 * ipcref's rules it may write only when the buffer is open for shared
 * writes (ipcref_buf_set_shared_mut); the versioned export says so with
 * DLPACK_FLAG_BITMASK_READ_ONLY.
 *
 * Read-only memory. A consumer maps what it receives from another process
 * read-only (unless the producer's context has the option writable_shares),
 * and a store there kills the process with SIGSEGV. The versioned export of
 * such memory is flagged READ_ONLY whatever the buffer's flags say. A legacy
 * tensor cannot say read-only, and its consumers take it as writable
 * (PyTorch 1.13 lets t.add_(1) write it), so ipcref_view_to_dlpack refuses
 * memory this process cannot write: IPCREF_ENEEDCOPY, and the error hook
 * (ipcref_set_error_hook) hears the two ways out: a private copy
 * (ipcref_view_make_mut copies the elements into memory of our own), or a
 * producer whose context has writable_shares, whose consumers map its
 * segments writable; then every holder may write, as with
 * torch.multiprocessing, and the holders synchronize their writes
 * themselves. ipcref_buf_set_shared_mut changes no mapping: set by the
 * producer it stays in the producer's process, and set on a consumer's
 * read-only mapping it does not make the legacy export go ahead (the
 * mapping decides). A private copy-on-write mapping is no way out either: a
 * page once written would hide the producer's bytes from every later view
 * of any block on that page.
 *
 * Import. ipcref_view_from_dlpack adopts a producer's tensor: the view's
 * buffer wraps the producer's memory, from the lowest to the highest byte
 * that the shape and strides reach (negative strides reach below `data`),
 * and the producer's deleter runs exactly once, when the last reference to
 * that buffer goes (views derived from the imported one keep it alive), on
 * the thread that drops it (a Python producer's deleter may need the GIL).
 * On success ownership of the managed tensor passes to ipcref: do not call
 * its deleter yourself. A legacy tensor carries no read-only flag: the view
 * is writable by the usual rule (while it holds the only reference), and
 * writes land in the producer's memory. On error NOTHING is taken: the
 * deleter is not called and the caller still owns the tensor (usually it
 * calls the deleter). The checks, in this order, and their codes: `t` or
 * `out` NULL: EINVAL; a device other than kDLCPU id 0, kDLCUDA or kDLROCM:
 * ENODEV (device memory is adopted as such: see ipcref_buf_device);
 * ndim < 0 or > IPCREF_MAX_DIMS: ERANGE; lanes != 1 or a (code, bits) pair
 * with no ipcref dtype: EINVAL; shape NULL with ndim > 0, or data NULL for
 * a non-empty tensor: EINVAL; a negative size, or an element count, stride
 * extent or byte size that overflows, or memory that would wrap the address
 * space: ERANGE; the allocator failing: ENOMEM. NULL strides mean compact
 * row-major. Each EINVAL (and the versioned import's EPROTO) is told to the
 * error hook, naming the call and the check ("ipcref_view_from_dlpack:
 * shape is NULL with ndim > 0").
 *
 * Types, both ways:
 *   BOOL  kDLBool 8 (code 6; DLPack >= 0.8 names it, older headers do not;
 *         NumPy 1.24 and PyTorch 1.13 have no bool in DLPack and refuse it,
 *         later releases use kDLBool 8)
 *   I8..I64  kDLInt 8..64     U8..U64  kDLUInt 8..64
 *   F16 kDLFloat 16   BF16 kDLBfloat 16   F32/F64 kDLFloat 32/64
 *   C64 kDLComplex 64   C128 kDLComplex 128
 * Anything else (vector lanes, fp8, opaque handles) is EINVAL on import. */

#if defined(DLPACK_VERSION) || defined(DLPACK_MAJOR_VERSION)
#define IPCREF_HAVE_DLPACK 1
#if defined(DLPACK_MAJOR_VERSION)
#define IPCREF_HAVE_DLPACK_VERSIONED 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The DLPack type of an ipcref dtype (lanes 1). EINVAL: out NULL or an
 * invalid dtype (*out unchanged). */
IPCREF_API ipcref_result ipcref_dtype_to_dlpack(ipcref_dtype dt,
                                                DLDataType *out);

/* The ipcref dtype of a DLPack type. EINVAL: out NULL, lanes != 1, or no
 * ipcref dtype has that code and size (*out unchanged). */
IPCREF_API ipcref_result ipcref_dtype_from_dlpack(DLDataType dt,
                                                  ipcref_dtype *out);

/* Exports `v` (see above). The view is checked as every view operation
 * checks it, and keeps its own reference. Memory this process cannot write
 * (a consumer's read-only mapping of another process's segment, even an
 * empty view of it, even when the buffer is marked for shared writes: the
 * mapping decides; a versioned import flagged READ_ONLY likewise) is
 * refused with ENEEDCOPY, and the error hook gets a
 * message that names the ways out: a private copy (ipcref_view_make_mut),
 * or a producer context with the option writable_shares (the producer's
 * ipcref_buf_set_shared_mut alone does not make the consumer's mapping
 * writable). A device block received without writable_shares is refused
 * the same way (ipcref keeps to the producer's choice, and cannot copy it:
 * ipcref_view_make_mut gives EDEVICE). Memory that is writable here (our
 * own; a consumer's mapping of a producer with writable_shares) goes out
 * as before. Errors: EINVAL (NULL, an invalid view), ENEEDCOPY (read-only
 * memory), ENOMEM; on error *out is unchanged and no reference is taken. */
IPCREF_API ipcref_result ipcref_view_to_dlpack(const ipcref_view *v,
                                               DLManagedTensor **out);

/* Imports `t` into `out` (see above for ownership and errors). `out` is
 * overwritten as if uninitialized. */
IPCREF_API ipcref_result ipcref_view_from_dlpack(DLManagedTensor *t,
                                                 ipcref_view *out);

#ifdef IPCREF_HAVE_DLPACK_VERSIONED
/* As ipcref_view_to_dlpack, for the DLPack 1.x versioned struct: version
 * {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}, flags READ_ONLY unless the
 * buffer is open for shared writes and its memory is writable here. Memory
 * mapped read-only goes out too, flagged READ_ONLY (never ENEEDCOPY). */
IPCREF_API ipcref_result ipcref_view_to_dlpack_versioned(
    const ipcref_view *v, struct DLManagedTensorVersioned **out);

/* As ipcref_view_from_dlpack, for the versioned struct. A major version
 * other than DLPACK_MAJOR_VERSION is EPROTO (the error hook hears both
 * numbers; nothing else is read; the
 * caller still owns `t` and, as DLPack says, should call its deleter).
 * A tensor flagged READ_ONLY gives a view that is never writable: its
 * buffer is read-only here, as a consumer's read-only mapping is (whoever
 * holds it, and whatever ipcref_buf_set_shared_mut says), so
 * ipcref_view_make_mut copies, ipcref_view_to_dlpack refuses it with
 * ENEEDCOPY and ipcref_view_to_dlpack_versioned flags it READ_ONLY. */
IPCREF_API ipcref_result ipcref_view_from_dlpack_versioned(
    struct DLManagedTensorVersioned *t, ipcref_view *out);
#endif

#ifdef __cplusplus
}
#endif

#endif /* DLPACK */

#if !defined(DLPACK_VERSION) && !defined(DLPACK_MAJOR_VERSION)
/* <dlpack/dlpack.h> was not included before this header, so the DLPack
 * calls are not declared: a call to one is a single error that names the
 * fix (not an implicit declaration, then a link error). Its arguments are
 * still used (in an unevaluated sizeof), so nothing else is reported. */
int ipcref__dlpack_args(int first, ...);
#define IPCREF__NO_DLPACK(...)                                                 \
  ((void)sizeof(ipcref__dlpack_args(0, __VA_ARGS__)),                          \
   ipcref_include_dlpack_h_before_ipcref_h)
#define ipcref_dtype_to_dlpack(...)            IPCREF__NO_DLPACK(__VA_ARGS__)
#define ipcref_dtype_from_dlpack(...)          IPCREF__NO_DLPACK(__VA_ARGS__)
#define ipcref_view_to_dlpack(...)             IPCREF__NO_DLPACK(__VA_ARGS__)
#define ipcref_view_from_dlpack(...)           IPCREF__NO_DLPACK(__VA_ARGS__)
#define ipcref_view_to_dlpack_versioned(...)   IPCREF__NO_DLPACK(__VA_ARGS__)
#define ipcref_view_from_dlpack_versioned(...) IPCREF__NO_DLPACK(__VA_ARGS__)
#endif

/* @implementation */

#if defined(DLPACK_VERSION) || defined(DLPACK_MAJOR_VERSION)

/* kDLBool appeared in DLPack 0.8; the value is the same in every header. */
#define IPCREF__DL_BOOL 6u

static const struct {
  uint8_t code, bits;
} ipcref__dl_types[IPCREF_DTYPE_COUNT] = {
    {IPCREF__DL_BOOL, 8}, /* BOOL */
    {(uint8_t)kDLInt, 8},      {(uint8_t)kDLInt, 16},
    {(uint8_t)kDLInt, 32},     {(uint8_t)kDLInt, 64},
    {(uint8_t)kDLUInt, 8},     {(uint8_t)kDLUInt, 16},
    {(uint8_t)kDLUInt, 32},    {(uint8_t)kDLUInt, 64},
    {(uint8_t)kDLFloat, 16},   {(uint8_t)kDLBfloat, 16},
    {(uint8_t)kDLFloat, 32},   {(uint8_t)kDLFloat, 64},
    {(uint8_t)kDLComplex, 64}, {(uint8_t)kDLComplex, 128}};

IPCREF_API ipcref_result ipcref_dtype_to_dlpack(ipcref_dtype dt,
                                                DLDataType *out) {
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if ((int)dt < 0 || (int)dt >= (int)IPCREF_DTYPE_COUNT)
    return ipcref__invalid(__func__, "dt is not a valid dtype");
  out->code = ipcref__dl_types[dt].code;
  out->bits = ipcref__dl_types[dt].bits;
  out->lanes = 1;
  return IPCREF_OK;
}

/* The ipcref dtype of `dt` into *out: NULL, or why there is none. */
IPCREF__PRIVATE const char *ipcref__dl_dtype(DLDataType dt, ipcref_dtype *out) {
  int i;
  if (dt.lanes != 1) return "dtype.lanes is not 1 (no vector types)";
  for (i = 0; i < (int)IPCREF_DTYPE_COUNT; i++) {
    if (ipcref__dl_types[i].code == dt.code &&
        ipcref__dl_types[i].bits == dt.bits) {
      *out = (ipcref_dtype)i;
      return NULL;
    }
  }
  return "no ipcref dtype has that dtype.code and dtype.bits";
}

IPCREF_API ipcref_result ipcref_dtype_from_dlpack(DLDataType dt,
                                                  ipcref_dtype *out) {
  const char *why;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  why = ipcref__dl_dtype(dt, out);
  return why ? ipcref__invalid(__func__, why) : IPCREF_OK;
}

/* The devices: host memory (kDLCPU, id 0), and the device memory the
 * backends share (kDLCUDA and kDLROCM, any ordinal); a buffer carries its
 * device, so what is exported reports where it lives. */
IPCREF__PRIVATE ipcref_result ipcref__dlpack_device_in(DLDevice d,
                                                       ipcref_device *out) {
  if ((d.device_type == kDLCPU && d.device_id == 0) ||
      ((d.device_type == kDLCUDA || d.device_type == kDLROCM) &&
       d.device_id >= 0)) {
    out->type = (int32_t)d.device_type;
    out->id = (int32_t)d.device_id;
    return IPCREF_OK;
  }
  return IPCREF_ENODEV;
}

IPCREF__PRIVATE void ipcref__dlpack_device_out(DLDevice *d,
                                               const ipcref_buf *b) {
  ipcref_device dev = ipcref_buf_device(b);
  d->device_type = (DLDeviceType)dev.type;
  d->device_id = dev.id;
}

/* ---- export */

/* What an exported tensor owns: a reference to the view, and the arrays the
 * DLTensor points to. One allocation for all. */
typedef struct ipcref__dlpack_keep {
  ipcref_view view;
  int64_t shape[IPCREF_MAX_DIMS];
  int64_t strides[IPCREF_MAX_DIMS];
} ipcref__dlpack_keep;

/* Fills `t` from keep->view (already checked and retained). */
IPCREF__PRIVATE void ipcref__dlpack_fill(ipcref__dlpack_keep *k, DLTensor *t) {
  const ipcref_view *v = &k->view;
  char *base = (char *)ipcref_buf_data(v->buf);
  int i;
  for (i = 0; i < v->ndim; i++) {
    k->shape[i] = v->shape[i];
    k->strides[i] = v->strides[i];
  }
  /* Element (0,...,0) itself, with byte_offset 0: NumPy adds byte_offset
   * but other consumers (older PyTorch) ignore it. Never NULL, although
   * DLPack 1.x suggests NULL for an empty tensor: PyTorch 1.13 never calls
   * the deleter of a tensor whose data is NULL. Only an empty view can have
   * a NULL buffer (an adopted empty tensor); it gets an address that is
   * never read. */
  t->data = base ? (void *)(base + v->byte_offset) : (void *)k;
  ipcref__dlpack_device_out(&t->device, v->buf);
  t->ndim = v->ndim;
  ipcref_dtype_to_dlpack(v->dtype, &t->dtype);
  t->shape = k->shape;
  t->strides = k->strides;
  t->byte_offset = 0;
}

typedef struct ipcref__dlpack_export {
  DLManagedTensor mt; /* first: the address the consumer gets */
  ipcref__dlpack_keep keep;
} ipcref__dlpack_export;

IPCREF__PRIVATE void ipcref__dlpack_export_deleter(DLManagedTensor *self) {
  ipcref__dlpack_export *e;
  if (!self) return;
  e = (ipcref__dlpack_export *)self->manager_ctx;
  ipcref_view_release(&e->keep.view);
  IPCREF_FREE(e);
}

/* 1 when this process may store into the buffer's memory at all: not a
 * read-only mapping of another process's segment, nor an import flagged
 * READ_ONLY. */
IPCREF__PRIVATE int ipcref__dlpack_writable_here(const ipcref_buf *b) {
  return !ipcref__buf_read_only(b);
}

IPCREF_API ipcref_result ipcref_view_to_dlpack(const ipcref_view *v,
                                               DLManagedTensor **out) {
  ipcref__dlpack_export *e;
  ipcref_view keep;
  ipcref_result r;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if (!ipcref__view_valid(v)) return ipcref__view_invalid(v, __func__, "v");
  /* A legacy tensor looks writable to every consumer: memory that a store
   * would fault on does not go out that way (see the header comment). */
  if (!ipcref__dlpack_writable_here(v->buf)) {
    ipcref__report(
        IPCREF_ENEEDCOPY,
        "ipcref_view_to_dlpack: the view's memory is read-only in this "
        "process (mapped read-only from another one, or a DLPack import "
        "flagged READ_ONLY), and a legacy DLPack tensor cannot say "
        "read-only: a consumer that writes it would crash (or write what "
        "its producer lent read-only). Make a private copy first "
        "(ipcref_view_make_mut), or, for received memory, have the "
        "producer open its shares for writing (ipcref_ctx_options "
        "writable_shares: every holder may then write; the producer's "
        "ipcref_buf_set_shared_mut alone does not make this mapping "
        "writable). With a DLPack 1.x header, "
        "ipcref_view_to_dlpack_versioned exports it flagged READ_ONLY.");
    return IPCREF_ENEEDCOPY;
  }
  r = ipcref_view_clone(v, &keep);
  if (r != IPCREF_OK) return r;
  e = (ipcref__dlpack_export *)IPCREF_MALLOC(sizeof *e);
  if (!e) {
    ipcref_view_release(&keep);
    return IPCREF_ENOMEM;
  }
  memset(e, 0, sizeof *e);
  e->keep.view = keep;
  ipcref__dlpack_fill(&e->keep, &e->mt.dl_tensor);
  e->mt.manager_ctx = e;
  e->mt.deleter = ipcref__dlpack_export_deleter;
  *out = &e->mt;
  return IPCREF_OK;
}

/* ---- import */

/* What the wrapped buffer's release callback gets: which managed tensor to
 * delete. */
typedef struct ipcref__dlpack_adopt {
  void *managed;
  int versioned;
} ipcref__dlpack_adopt;

IPCREF__PRIVATE void ipcref__dlpack_import_release(void *user, void *data) {
  ipcref__dlpack_adopt *im = (ipcref__dlpack_adopt *)user;
  (void)data;
  if (!im->versioned) {
    DLManagedTensor *t = (DLManagedTensor *)im->managed;
    if (t->deleter) t->deleter(t);
  }
#ifdef IPCREF_HAVE_DLPACK_VERSIONED
  else {
    struct DLManagedTensorVersioned *t =
        (struct DLManagedTensorVersioned *)im->managed;
    if (t->deleter) t->deleter(t);
  }
#endif
  IPCREF_FREE(im);
}

/* The import's first checks, in the documented order: the device, the
 * rank, the element type, and a shape wherever there are dimensions. A
 * refusal names public function `fn`. */
IPCREF__PRIVATE ipcref_result ipcref__dlpack_check(const DLTensor *t,
                                                   ipcref_device *dev,
                                                   ipcref_dtype *dt,
                                                   const char *fn) {
  const char *why;
  if (ipcref__dlpack_device_in(t->device, dev) != IPCREF_OK)
    return IPCREF_ENODEV;
  if (t->ndim < 0 || t->ndim > IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  why = ipcref__dl_dtype(t->dtype, dt);
  if (why) return ipcref__invalid(fn, why);
  if (t->ndim > 0 && !t->shape)
    return ipcref__invalid(fn, "shape is NULL with ndim > 0");
  return IPCREF_OK;
}

/* `t`'s geometry as a view with no buffer yet, placed at element
 * (0,...,0) (byte offset 0). Strides: given, or compact row-major (for an
 * empty tensor whose compact strides would overflow, any strides do: those
 * are 0). A negative size is left for ipcref__view_span to refuse. */
IPCREF__PRIVATE void ipcref__dlpack_geometry(const DLTensor *t, ipcref_dtype dt,
                                             ipcref_view *v) {
  int64_t compact = 1;
  int i;
  memset(v, 0, sizeof *v);
  v->dtype = dt;
  v->ndim = t->ndim;
  for (i = t->ndim - 1; i >= 0; i--) {
    v->shape[i] = t->shape[i];
    if (t->strides) {
      v->strides[i] = t->strides[i];
      continue;
    }
    v->strides[i] = compact;
    if (__builtin_mul_overflow(compact, t->shape[i] > 1 ? t->shape[i] : 1,
                               &compact))
      compact = 0;
  }
}

/* The address of the first byte reached, given the bytes [lo, hi) reached
 * relative to element (0,...,0), lo <= 0 <= hi: ERANGE when the size would
 * not fit in ptrdiff_t (hi - lo itself cannot overflow) or the memory
 * would wrap around the address space. 0 for an empty tensor without
 * data. */
IPCREF__PRIVATE ipcref_result ipcref__dlpack_start(const DLTensor *t,
                                                   int64_t lo, int64_t hi,
                                                   int64_t numel,
                                                   uintptr_t *start) {
  uintptr_t addr = (uintptr_t)t->data;
  if (hi > PTRDIFF_MAX + lo) return IPCREF_ERANGE;
  if (t->byte_offset > (uint64_t)PTRDIFF_MAX) return IPCREF_ERANGE;
  if (addr > UINTPTR_MAX - (uintptr_t)t->byte_offset) return IPCREF_ERANGE;
  addr += (uintptr_t)t->byte_offset;
  if (addr < (uintptr_t)(-lo) || addr > UINTPTR_MAX - (uintptr_t)hi)
    return IPCREF_ERANGE;
  *start = numel == 0 && !t->data ? 0 : addr - (uintptr_t)(-lo);
  return IPCREF_OK;
}

/* A buffer over the `size` bytes at `start` on `dev` whose release deletes
 * the managed tensor. A read-only import's buffer is marked so, as a
 * read-only mapping is: no view of it is writable, not even when unique or
 * open for shared writes, make_mut copies, and it never goes out as
 * writable. Nothing is adopted on error. */
IPCREF__PRIVATE ipcref_result ipcref__dlpack_adopt_buf(
    uintptr_t start, size_t size, ipcref_device dev, void *managed,
    int versioned, int read_only, ipcref_buf **out) {
  ipcref__dlpack_adopt *im;
  ipcref_result r;
  im = (ipcref__dlpack_adopt *)IPCREF_MALLOC(sizeof *im);
  if (!im) return IPCREF_ENOMEM;
  im->managed = managed;
  im->versioned = versioned;
  r = ipcref_buf_wrap_device(start ? (void *)start : NULL, size, dev,
                             ipcref__dlpack_import_release, im, out);
  if (r != IPCREF_OK) {
    IPCREF_FREE(im);
    return r;
  }
  if (read_only) ipcref__buf_new_read_only(*out); /* no one else sees it */
  return IPCREF_OK;
}

/* The common import, for public function `fn`: checks `t`, wraps the
 * memory its elements reach and fills *out. Nothing is adopted unless it
 * returns OK. */
IPCREF__PRIVATE ipcref_result
ipcref__dlpack_import(const DLTensor *t, void *managed, int versioned,
                      int read_only, ipcref_view *out, const char *fn) {
  ipcref_dtype dt = IPCREF_U8; /* the check sets it */
  ipcref_device dev;
  ipcref_view v;
  int64_t lo, hi, numel; /* the bytes reached, from element (0,...,0) */
  uintptr_t start;
  ipcref_result r = ipcref__dlpack_check(t, &dev, &dt, fn);
  if (r != IPCREF_OK) return r;
  ipcref__dlpack_geometry(t, dt, &v);
  if (!ipcref__view_span(&v, &lo, &hi, &numel)) return IPCREF_ERANGE;
  if (numel != 0 && !t->data)
    return ipcref__invalid(fn, "data is NULL for a non-empty tensor");
  r = ipcref__dlpack_start(t, lo, hi, numel, &start);
  if (r != IPCREF_OK) return r;
  r = ipcref__dlpack_adopt_buf(start, (size_t)(hi - lo), dev, managed,
                               versioned, read_only, &v.buf);
  if (r != IPCREF_OK) return r;
  /* From here nothing can fail: the view takes the buffer's reference. */
  v.byte_offset = -lo;
  *out = v;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_from_dlpack(DLManagedTensor *t,
                                                 ipcref_view *out) {
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  return ipcref__dlpack_import(&t->dl_tensor, t, 0, 0, out, __func__);
}

#ifdef IPCREF_HAVE_DLPACK_VERSIONED

typedef struct ipcref__dlpack_export_v {
  struct DLManagedTensorVersioned mt; /* first */
  ipcref__dlpack_keep keep;
} ipcref__dlpack_export_v;

IPCREF__PRIVATE void
ipcref__dlpack_export_v_deleter(struct DLManagedTensorVersioned *self) {
  ipcref__dlpack_export_v *e;
  if (!self) return;
  e = (ipcref__dlpack_export_v *)self->manager_ctx;
  ipcref_view_release(&e->keep.view);
  IPCREF_FREE(e);
}

IPCREF_API ipcref_result ipcref_view_to_dlpack_versioned(
    const ipcref_view *v, struct DLManagedTensorVersioned **out) {
  ipcref__dlpack_export_v *e;
  ipcref_view keep;
  ipcref_result r;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if (!ipcref__view_valid(v)) return ipcref__view_invalid(v, __func__, "v");
  r = ipcref_view_clone(v, &keep);
  if (r != IPCREF_OK) return r;
  e = (ipcref__dlpack_export_v *)IPCREF_MALLOC(sizeof *e);
  if (!e) {
    ipcref_view_release(&keep);
    return IPCREF_ENOMEM;
  }
  memset(e, 0, sizeof *e);
  e->keep.view = keep;
  ipcref__dlpack_fill(&e->keep, &e->mt.dl_tensor);
  e->mt.version.major = DLPACK_MAJOR_VERSION;
  e->mt.version.minor = DLPACK_MINOR_VERSION;
  e->mt.manager_ctx = e;
  e->mt.deleter = ipcref__dlpack_export_v_deleter;
  /* The consumer shares the buffer with us: writable only when open for
   * shared writes, as for any other holder, and never memory read-only
   * here (a read-only mapping, an import flagged READ_ONLY), whatever its
   * flags say. */
  e->mt.flags = ipcref_buf_is_shared_mut(keep.buf) &&
                        ipcref__dlpack_writable_here(keep.buf)
                    ? 0
                    : (uint64_t)DLPACK_FLAG_BITMASK_READ_ONLY;
  *out = &e->mt;
  return IPCREF_OK;
}

/* A versioned tensor of another major version: EPROTO, told with both
 * numbers. */
IPCREF__PRIVATE IPCREF__NOINLINE IPCREF__COLD ipcref_result
ipcref__dlpack_bad_version(uint32_t major) {
  ipcref__msg m;
  m.n = 0;
  ipcref__msg_str(&m, "ipcref_view_from_dlpack_versioned: t->version.major "
                      "is ");
  ipcref__msg_int(&m, (int64_t)major);
  ipcref__msg_str(&m, ", not this header's DLPACK_MAJOR_VERSION ");
  ipcref__msg_int(&m, (int64_t)DLPACK_MAJOR_VERSION);
  ipcref__report(IPCREF_EPROTO, m.s);
  return IPCREF_EPROTO;
}

IPCREF_API ipcref_result ipcref_view_from_dlpack_versioned(
    struct DLManagedTensorVersioned *t, ipcref_view *out) {
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if (t->version.major != DLPACK_MAJOR_VERSION)
    return ipcref__dlpack_bad_version(t->version.major);
  return ipcref__dlpack_import(
      &t->dl_tensor, t, 1,
      (t->flags & (uint64_t)DLPACK_FLAG_BITMASK_READ_ONLY) != 0, out, __func__);
}

#endif /* IPCREF_HAVE_DLPACK_VERSIONED */

#endif /* DLPACK */
