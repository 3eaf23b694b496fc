/* view: strided, zero-copy views over a buffer. A view is a value type (a
 * struct you own) holding one strong reference to its buffer; every
 * operation that makes a view is O(ndim) metadata and copies no data, except
 * the ones that say they copy (contiguous, copy, reshape_copy, make_mut). */

#ifndef IPCREF_MAX_DIMS
#define IPCREF_MAX_DIMS 8
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. Complex types are pairs of floats (C64: 2 x f32). */
typedef enum ipcref_dtype {
  IPCREF_BOOL,
  IPCREF_I8,
  IPCREF_I16,
  IPCREF_I32,
  IPCREF_I64,
  IPCREF_U8,
  IPCREF_U16,
  IPCREF_U32,
  IPCREF_U64,
  IPCREF_F16,
  IPCREF_BF16,
  IPCREF_F32,
  IPCREF_F64,
  IPCREF_C64,
  IPCREF_C128,
  IPCREF_DTYPE_COUNT /* not a type: the number of them */
} ipcref_dtype;

/* A view: `shape` and `strides` (in elements; 0 broadcasts, negative runs
 * backwards) for dims [0, ndim); `byte_offset` is where element (0,...,0)
 * lies in the buffer's data. Treat the fields as read-only: the operations
 * below keep them consistent with the buffer, and they check every view
 * they are given. A zeroed struct is an empty view that releases safely. */
typedef struct ipcref_view {
  ipcref_buf *buf;
  int64_t byte_offset;
  ipcref_dtype dtype;
  int ndim;
  int64_t shape[IPCREF_MAX_DIMS];
  int64_t strides[IPCREF_MAX_DIMS];
} ipcref_view;

/* Out parameters. Every `out` below is overwritten as if uninitialized
 * (release what it held first), except that it may be the input view
 * itself: the input's reference then moves to the result, so calls chain in
 * place: ipcref_view_slice(&v, 0, 2, 10, 1, &v). On error `out` is left
 * unchanged, and so is everything else.
 *
 * Dims. A `dim` argument may be negative and counts from the end (-1 is the
 * last dim), as in Python.
 *
 * Errors. EINVAL: a NULL pointer, a bad dtype, a dim out of range, a step
 * of 0, a shape that is not a permutation/expansion/... of the input, or a
 * view whose fields are inconsistent with its buffer. ERANGE: an index out
 * of range, ndim over IPCREF_MAX_DIMS, a negative size, a shape whose
 * element count or byte size overflows int64/size_t, or a view that would
 * reach outside its buffer. Every EINVAL is told to the error hook
 * (ipcref_set_error_hook) as "function: reason", naming the argument and
 * the check: "ipcref_view_slice: dim 2 out of range for a 2-d view". */

/* The size in bytes of one element; 0 for an invalid dtype. */
IPCREF_API size_t ipcref_dtype_size(ipcref_dtype dt);

/* The dtype's name ("f32", "c128", ...); "invalid" for an invalid one. */
IPCREF_API const char *ipcref_dtype_name(ipcref_dtype dt);

/* A new C-contiguous view over a new (uninitialized, 64-byte aligned)
 * buffer. Errors: EINVAL (out NULL, dt invalid, shape NULL with ndim > 0),
 * ERANGE, ENOMEM. */
IPCREF_API ipcref_result ipcref_view_new(ipcref_dtype dt, int ndim,
                                         const int64_t *shape,
                                         ipcref_view *out);

/* A C-contiguous view of `b` from its first byte (retains b). The elements
 * must fit in the buffer (else ERANGE). ndim 0 is a scalar (one element).
 * EINVAL: b or out NULL, dt invalid, shape NULL with ndim > 0. EDEAD: b
 * was released, as far as its header still says so (a weak reference or
 * a shared buffer's context keeps it; IPCREF_CHECKED: always). */
IPCREF_API ipcref_result ipcref_view_of(ipcref_buf *b, ipcref_dtype dt,
                                        int ndim, const int64_t *shape,
                                        ipcref_view *out);

/* Another view of the same elements (one more reference). */
IPCREF_API ipcref_result ipcref_view_clone(const ipcref_view *v,
                                           ipcref_view *out);

/* Releases the view's reference and zeroes it; NULL or a zeroed view is a
 * no-op, and so is releasing twice. */
IPCREF_API void ipcref_view_release(ipcref_view *v);

/* Python slicing on one dim: elements start, start+step, ... before stop.
 * Negative start/stop count from the end; out-of-range bounds are clamped,
 * as Python does. For an omitted bound pass IPCREF_SLICE_MIN/MAX: a[::-1]
 * is slice(v, 0, IPCREF_SLICE_MAX, IPCREF_SLICE_MIN, -1). Step 0: EINVAL. */
#define IPCREF_SLICE_MIN INT64_MIN
#define IPCREF_SLICE_MAX INT64_MAX
IPCREF_API ipcref_result ipcref_view_slice(const ipcref_view *v, int dim,
                                           int64_t start, int64_t stop,
                                           int64_t step, ipcref_view *out);

/* Element `index` of `dim` (negative counts from the end); the dim is
 * dropped. ERANGE when the index is out of range. */
IPCREF_API ipcref_result ipcref_view_select(const ipcref_view *v, int dim,
                                            int64_t index, ipcref_view *out);

/* `length` elements of `dim` from `start` (negative start counts from the
 * end). ERANGE unless 0 <= start and start + length <= size. */
IPCREF_API ipcref_result ipcref_view_narrow(const ipcref_view *v, int dim,
                                            int64_t start, int64_t length,
                                            ipcref_view *out);

/* Reorders the dims: out dim i is input dim perm[i]. `perm` has ndim
 * entries and must be a permutation (negative entries count from the end). */
IPCREF_API ipcref_result ipcref_view_permute(const ipcref_view *v,
                                             const int *perm, ipcref_view *out);

/* Swaps two dims. */
IPCREF_API ipcref_result ipcref_view_transpose(const ipcref_view *v, int d0,
                                               int d1, ipcref_view *out);

/* The same elements in C order with a new shape, without copying. One entry
 * of `shape` may be -1 (inferred). ERANGE/EINVAL when the element count
 * differs; IPCREF_ENEEDCOPY when the strides do not allow the new shape
 * without a copy (use ipcref_view_reshape_copy). */
IPCREF_API ipcref_result ipcref_view_reshape(const ipcref_view *v, int ndim,
                                             const int64_t *shape,
                                             ipcref_view *out);

/* As reshape, copying into a new contiguous buffer when it must. */
IPCREF_API ipcref_result ipcref_view_reshape_copy(const ipcref_view *v,
                                                  int ndim,
                                                  const int64_t *shape,
                                                  ipcref_view *out);

/* Merges dims start_dim..end_dim (inclusive) into one, without copying
 * (IPCREF_ENEEDCOPY when the strides do not allow it). flatten(v, 0, -1)
 * makes a 1-d view. A 0-d view becomes 1-d with one element. */
IPCREF_API ipcref_result ipcref_view_flatten(const ipcref_view *v,
                                             int start_dim, int end_dim,
                                             ipcref_view *out);

/* Broadcasts to `shape` (ndim >= v->ndim; new dims are prepended): a dim of
 * size 1 may grow to any size with stride 0; -1 keeps the size. EINVAL:
 * ndim below v's, shape NULL, -1 for a new dim, another dim asked to grow. */
IPCREF_API ipcref_result ipcref_view_expand(const ipcref_view *v, int ndim,
                                            const int64_t *shape,
                                            ipcref_view *out);

/* Removes `dim`, which must have size 1 (EINVAL otherwise); with
 * IPCREF_DIM_ALL removes every dim of size 1. */
#define IPCREF_DIM_ALL INT32_MIN
IPCREF_API ipcref_result ipcref_view_squeeze(const ipcref_view *v, int dim,
                                             ipcref_view *out);

/* Inserts a dim of size 1 before `dim` (0..ndim; negative counts from the
 * end of the result, so -1 appends). */
IPCREF_API ipcref_result ipcref_view_unsqueeze(const ipcref_view *v, int dim,
                                               ipcref_view *out);

/* Reverses `dim` (a negative stride). */
IPCREF_API ipcref_result ipcref_view_flip(const ipcref_view *v, int dim,
                                          ipcref_view *out);

/* Any shape and strides over v's buffer, from `byte_offset` (absolute, a
 * multiple of the dtype size, else EINVAL). ERANGE when an element would
 * lie outside the buffer. */
IPCREF_API ipcref_result ipcref_view_as_strided(const ipcref_view *v, int ndim,
                                                const int64_t *shape,
                                                const int64_t *strides,
                                                int64_t byte_offset,
                                                ipcref_view *out);

/* 1 when the view is C-contiguous (dims of size 1 ignored; an empty view
 * is contiguous), else 0 (also for an invalid view). */
IPCREF_API int ipcref_view_is_contiguous(const ipcref_view *v);

/* The number of elements; 0 for NULL or an invalid view. */
IPCREF_API int64_t ipcref_view_numel(const ipcref_view *v);

/* The address of the element at `index` (ndim entries, each 0 <= i <
 * shape); NULL when out of range or invalid. Read-only unless the view is
 * writable (see ipcref_view_data_mut). */
IPCREF_API void *ipcref_view_ptr(const ipcref_view *v, const int64_t *index);

/* The address of element (0, ..., 0), for reading: what the view's
 * strides start from (a device address for device memory, see
 * ipcref_buf_device). NULL for NULL or an invalid view. Writing through
 * it is allowed only as ipcref_view_data_mut says. */
IPCREF_API const void *ipcref_view_data(const ipcref_view *v);

/* Materializes: when v is contiguous, `out` is another view of the same
 * storage (retained, no copy); otherwise a new contiguous buffer holding a
 * copy of the elements (EDEVICE for device memory: the host cannot copy
 * it). */
IPCREF_API ipcref_result ipcref_view_contiguous(const ipcref_view *v,
                                                ipcref_view *out);

/* Writes the elements of `src` into `dst`. Same dtype; src's shape must
 * broadcast to dst's (as expand). Any strides on either side; when the two
 * overlap in memory the result is as if src was read completely first.
 * EBUSY when dst is not writable (see ipcref_view_data_mut); EINVAL when
 * either view is invalid, dtypes differ, src does not broadcast to dst, or
 * dst has a broadcast (stride 0) dim of size > 1; EDEVICE when either is
 * device memory. */
IPCREF_API ipcref_result ipcref_view_copy(const ipcref_view *dst,
                                          const ipcref_view *src);

/* Writing. A view's elements may be written only when its buffer is
 * uniquely owned (this view holds the only reference, and no consumer in
 * another process holds the buffer it was sent: see ipcref_buf_get_mut),
 * or when the buffer was opened for shared writes with
 * ipcref_buf_set_shared_mut, in which case the users synchronize among
 * themselves. ipcref_view_data_mut returns
 * the address of element (0,...,0) for writing, or NULL when the view is
 * not writable (or invalid). */
IPCREF_API void *ipcref_view_data_mut(const ipcref_view *v);

/* Makes v writable: when its buffer is shared or held by a consumer (and
 * not opened for shared writes), copies the viewed elements into a new
 * contiguous buffer and points v there (its strides change); else does nothing.
 * EINVAL (an invalid view), ENOMEM and EDEVICE (device memory) leave v
 * unchanged. */
IPCREF_API ipcref_result ipcref_view_make_mut(ipcref_view *v);

/* An iterator over a view's elements in C order, for users' own loops:
 *     ipcref_view_iter it; void *p;
 *     ipcref_view_iter_init(&v, &it);
 *     while ((p = ipcref_view_iter_next(&it)) != NULL) use(p);
 * The view must stay alive while the iterator is used. */
typedef struct ipcref_view_iter {
  char *base; /* element (0,...,0) */
  int64_t remaining;
  int ndim;
  int started;
  int64_t index[IPCREF_MAX_DIMS];
  int64_t shape[IPCREF_MAX_DIMS];
  int64_t byte_strides[IPCREF_MAX_DIMS];
  char *cur;
} ipcref_view_iter;

/* EINVAL: it NULL, or an invalid view. */
IPCREF_API ipcref_result ipcref_view_iter_init(const ipcref_view *v,
                                               ipcref_view_iter *it);
/* The next element's address, or NULL once all were visited. */
IPCREF_API void *ipcref_view_iter_next(ipcref_view_iter *it);

#ifdef __cplusplus
}
#endif

/* @implementation */

static const unsigned char ipcref__dtype_sizes[IPCREF_DTYPE_COUNT] = {
    1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16};
static const char *const ipcref__dtype_names[IPCREF_DTYPE_COUNT] = {
    "bool", "i8",  "i16",  "i32", "i64", "u8",  "u16", "u32",
    "u64",  "f16", "bf16", "f32", "f64", "c64", "c128"};

IPCREF_API size_t ipcref_dtype_size(ipcref_dtype dt) {
  return (unsigned)dt < IPCREF_DTYPE_COUNT ? ipcref__dtype_sizes[dt] : 0;
}

IPCREF_API const char *ipcref_dtype_name(ipcref_dtype dt) {
  return (unsigned)dt < IPCREF_DTYPE_COUNT ? ipcref__dtype_names[dt]
                                           : "invalid";
}

/* ---- checks -------------------------------------------------------------
 * A view is valid when its buffer exists, its dtype and ndim are in range,
 * every size is >= 0, the element count fits in int64, and every element it
 * can reach lies inside the buffer (an empty view only needs its offset in
 * [0, size]). Every operation checks its input this way, so a view whose
 * public fields were damaged cannot make the library read or write outside
 * a buffer; results are built so that they are valid by construction, and
 * the operations that take arbitrary geometry check their result too. */

/* [lo, hi): the bytes of the buffer a view can reach, relative to its data.
 * 0 when some product overflows. `numel` receives the element count. */
IPCREF__PRIVATE IPCREF__INLINE int ipcref__view_span(const ipcref_view *v,
                                                     int64_t *lo, int64_t *hi,
                                                     int64_t *numel) {
  int64_t item = (int64_t)ipcref__dtype_sizes[v->dtype], n = 1, neg = 0,
          pos = 0, reach;
  int d;
  int big = 0, empty = 0; /* an overflowed count is fine when empty */
  for (d = 0; d < v->ndim; d++) {
    if (v->shape[d] < 0) return 0;
    empty |= v->shape[d] == 0;
    big |= __builtin_mul_overflow(n, v->shape[d], &n);
  }
  if (empty)
    n = 0;
  else if (big)
    return 0;
  *numel = n;
  if (n == 0) { /* an empty view reaches nothing; its strides are moot */
    *lo = *hi = v->byte_offset;
    return 1;
  }
  for (d = 0; d < v->ndim; d++) {
    if (v->shape[d] < 2) continue;
    if (__builtin_mul_overflow(v->shape[d] - 1, v->strides[d], &reach) ||
        __builtin_mul_overflow(reach, item, &reach))
      return 0;
    if (reach < 0) {
      if (__builtin_add_overflow(neg, reach, &neg)) return 0;
    } else if (__builtin_add_overflow(pos, reach, &pos)) {
      return 0;
    }
  }
  if (__builtin_add_overflow(v->byte_offset, neg, lo) ||
      __builtin_add_overflow(v->byte_offset, pos, hi) ||
      __builtin_add_overflow(*hi, item, hi))
    return 0;
  return 1;
}

/* 1 when every element of `v` (its buf not read) lies in bytes [0, size)
 * of its buffer: the geometry a buffer of `size` bytes can back. */
IPCREF__PRIVATE IPCREF__INLINE int ipcref__view_fits(const ipcref_view *v,
                                                     uint64_t size) {
  int64_t lo, hi, n;
  if (!ipcref__view_span(v, &lo, &hi, &n)) return 0;
  if (v->byte_offset < 0 || (uint64_t)v->byte_offset > size) return 0;
  return n == 0 || (lo >= 0 && (uint64_t)hi <= size);
}

/* 1 when `v` is a view its buffer can back. Under IPCREF_CHECKED a view
 * of a released buffer is reported, naming the public function `fn`. */
IPCREF__PRIVATE IPCREF__INLINE int ipcref__view_valid_in(const ipcref_view *v,
                                                         const char *fn) {
  (void)fn;
  if (!v || !v->buf || (unsigned)v->dtype >= IPCREF_DTYPE_COUNT ||
      v->ndim < 0 || v->ndim > IPCREF_MAX_DIMS)
    return 0;
#ifdef IPCREF_CHECKED
  if (ipcref__buf_dead(v->buf, fn)) return 0;
#endif
  return ipcref__view_fits(v, v->buf->size);
}
#define ipcref__view_valid(v) ipcref__view_valid_in((v), __func__)

/* The element count of a view already known to be valid. */
IPCREF__PRIVATE int64_t ipcref__numel(const ipcref_view *v) {
  int64_t n = 1;
  int d;
  for (d = 0; d < v->ndim; d++)
    if (v->shape[d] == 0) return 0; /* the others may multiply past int64 */
  for (d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

/* Why `v`, which ipcref__view_valid_in refused, is not a valid view (a
 * phrase after the argument's name); NULL when that was told already (a
 * released buffer under IPCREF_CHECKED: EDEAD). */
IPCREF__PRIVATE const char *ipcref__view_why(const ipcref_view *v) {
  int64_t lo, hi, n;
  int d;
  if (!v) return "is NULL";
  if (!v->buf) return "has no buffer (a zeroed or released view)";
  if ((unsigned)v->dtype >= IPCREF_DTYPE_COUNT) return "has an invalid dtype";
  if (v->ndim < 0 || v->ndim > IPCREF_MAX_DIMS)
    return "has ndim out of range (0..IPCREF_MAX_DIMS)";
#ifdef IPCREF_CHECKED
  if (__atomic_load_n(&v->buf->strong, __ATOMIC_ACQUIRE) == 0) return NULL;
#endif
  for (d = 0; d < v->ndim; d++)
    if (v->shape[d] < 0) return "has a negative size";
  if (!ipcref__view_span(v, &lo, &hi, &n))
    return "has an element count or byte extent that overflows";
  return "reaches outside its buffer (byte_offset, shape or strides)";
}

/* Public function `fn` refuses its view argument `arg`: EINVAL, told as
 * "fn: arg why" (unless told already). */
IPCREF__PRIVATE IPCREF__NOINLINE IPCREF__COLD ipcref_result
ipcref__view_invalid(const ipcref_view *v, const char *fn, const char *arg) {
  const char *why = ipcref__view_why(v);
  ipcref__msg m;
  if (!why) return IPCREF_EINVAL;
  m.n = 0;
  ipcref__msg_str(&m, fn);
  ipcref__msg_str(&m, ": ");
  ipcref__msg_str(&m, arg);
  ipcref__msg_str(&m, " ");
  ipcref__msg_str(&m, why);
  ipcref__report(IPCREF_EINVAL, m.s);
  return IPCREF_EINVAL;
}

/* The check of a result whose geometry came from the caller: EINVAL for
 * bad fields, ERANGE for elements outside the buffer or overflow. */
IPCREF__PRIVATE ipcref_result ipcref__view_check_new(const ipcref_view *v) {
  return ipcref__view_fits(v, v->buf->size) ? IPCREF_OK : IPCREF_ERANGE;
}

/* Python's dim rule: -ndim <= dim < ndim. */
IPCREF__PRIVATE IPCREF__INLINE int ipcref__dim(int dim, int ndim, int *out) {
  if (dim < -ndim || dim >= ndim) return 0;
  *out = dim < 0 ? dim + ndim : dim;
  return 1;
}

/* Public function `fn` refuses dim argument `name` (`dim`, out of range for
 * an `ndim`-d view): EINVAL, told as "fn: name 3 out of range for a 2-d
 * view". */
IPCREF__PRIVATE IPCREF__NOINLINE IPCREF__COLD ipcref_result
ipcref__bad_dim(const char *fn, const char *name, int dim, int ndim) {
  ipcref__msg m;
  m.n = 0;
  ipcref__msg_str(&m, fn);
  ipcref__msg_str(&m, ": ");
  ipcref__msg_str(&m, name);
  ipcref__msg_str(&m, " ");
  ipcref__msg_int(&m, dim);
  ipcref__msg_str(&m, " out of range for a ");
  ipcref__msg_int(&m, ndim);
  ipcref__msg_str(&m, "-d view");
  ipcref__report(IPCREF_EINVAL, m.s);
  return IPCREF_EINVAL;
}

/* The element count of a shape given by the caller: ERANGE for ndim out of
 * range, a negative size, or an overflow of int64 or of size_t bytes;
 * EINVAL (not told: the caller tells it) for shape NULL with ndim > 0. */
IPCREF__PRIVATE ipcref_result ipcref__shape_numel(int ndim,
                                                  const int64_t *shape,
                                                  size_t item, int64_t *numel) {
  int64_t n = 1, bytes;
  int d;
  if (ndim < 0 || ndim > IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  if (ndim > 0 && !shape) return IPCREF_EINVAL;
  for (d = 0; d < ndim; d++) {
    if (shape[d] < 0) return IPCREF_ERANGE;
    if (shape[d] == 0) n = 0; /* empty, however large the rest */
  }
  for (d = 0; d < ndim && n != 0; d++)
    if (__builtin_mul_overflow(n, shape[d], &n)) return IPCREF_ERANGE;
  if (__builtin_mul_overflow(n, (int64_t)item, &bytes) ||
      (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
    return IPCREF_ERANGE;
  *numel = n;
  return IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__contiguous_strides(int ndim, const int64_t *shape,
                                                int64_t *strides) {
  int64_t s = 1;
  int d;
  for (d = ndim - 1; d >= 0; d--) {
    strides[d] = s;
    /* Only an empty view can overflow here, and its strides are moot. */
    if (shape[d] > 1 && __builtin_mul_overflow(s, shape[d], &s)) s = 1;
  }
}

/* Stores a finished result. When `out` is the input, the input's reference
 * moves to the result; otherwise the result takes a reference of its own. */
IPCREF__PRIVATE IPCREF__INLINE ipcref_result ipcref__view_finish(
    const ipcref_view *in, const ipcref_view *r, ipcref_view *out) {
  if (out != in) ipcref_buf_retain(r->buf);
  *out = *r;
  return IPCREF_OK;
}

/* Makes `out` the input view, holding its own reference (or, when it is
 * the input, keeping the input's), ready to be changed in place. Called
 * only after every check passed, with everything read from `v` already
 * in locals (`out` may be `v`). */
IPCREF__PRIVATE IPCREF__INLINE ipcref_view *
ipcref__view_out(const ipcref_view *v, ipcref_view *out) {
  if (out != v) {
    *out = *v;
    ipcref_buf_retain(out->buf);
  }
  return out;
}

/* The checks every view operation begins with, refusals told naming the
 * function and the argument. */
#define IPCREF__CHECK_IN(v, out)                                               \
  do {                                                                         \
    if (!(out)) return ipcref__invalid(__func__, "out is NULL");               \
    if (!ipcref__view_valid(v)) return ipcref__view_invalid(v, __func__, "v"); \
  } while (0)

/* The checks of a new view's arguments (shape checked by
 * ipcref__shape_numel, whose EINVAL this tells). */
#define IPCREF__CHECK_NEW(out, dt)                                             \
  do {                                                                         \
    if (!(out)) return ipcref__invalid(__func__, "out is NULL");               \
    if ((unsigned)(dt) >= IPCREF_DTYPE_COUNT)                                  \
      return ipcref__invalid(__func__, "dt is not a valid dtype");             \
  } while (0)
#define IPCREF__NO_SHAPE "shape is NULL with ndim > 0"

/* ---- making and dropping views --------------------------------------- */

/* Large fresh outputs are mostly page faults; transparent huge pages cut
 * their number by 512. Linux only, and only where the OS is allowed. */
#define IPCREF__HUGE_MIN   ((size_t)4 << 20)
#define IPCREF__HUGE_ALIGN ((size_t)2 << 20)
#if defined(__linux__) && !defined(IPCREF_NO_SHARING)
#include <sys/mman.h>
#endif

IPCREF__PRIVATE ipcref_result ipcref__buf_for(size_t bytes, ipcref_buf **out) {
  ipcref_result r;
#if defined(__linux__) && !defined(IPCREF_NO_SHARING) && defined(MADV_HUGEPAGE)
  if (bytes >= IPCREF__HUGE_MIN) {
    r = ipcref_buf_new_aligned(bytes, IPCREF__HUGE_ALIGN, out);
    if (r == IPCREF_OK) {
      size_t len = bytes & ~(IPCREF__HUGE_ALIGN - 1);
      (void)madvise((*out)->data, len, MADV_HUGEPAGE); /* advice only */
    }
    return r;
  }
#endif
  r = ipcref_buf_new(bytes, out);
  return r;
}

IPCREF_API ipcref_result ipcref_view_new(ipcref_dtype dt, int ndim,
                                         const int64_t *shape,
                                         ipcref_view *out) {
  ipcref_view r;
  ipcref_buf *b;
  int64_t n;
  ipcref_result res;
  IPCREF__CHECK_NEW(out, dt);
  res = ipcref__shape_numel(ndim, shape, ipcref__dtype_sizes[dt], &n);
  if (res == IPCREF_EINVAL) return ipcref__invalid(__func__, IPCREF__NO_SHAPE);
  if (res != IPCREF_OK) return res;
  res = ipcref__buf_for((size_t)n * ipcref__dtype_sizes[dt], &b);
  if (res != IPCREF_OK) return res;
  memset(&r, 0, sizeof r);
  r.buf = b;
  r.dtype = dt;
  r.ndim = ndim;
  if (ndim) memcpy(r.shape, shape, (size_t)ndim * sizeof(int64_t));
  ipcref__contiguous_strides(ndim, r.shape, r.strides);
  *out = r;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_of(ipcref_buf *b, ipcref_dtype dt,
                                        int ndim, const int64_t *shape,
                                        ipcref_view *out) {
  ipcref_view r;
  int64_t n;
  ipcref_result res;
  if (!b) return ipcref__invalid(__func__, "b is NULL");
  IPCREF__CHECK_NEW(out, dt);
  if (ipcref__buf_dead(b, __func__)) return IPCREF_EDEAD; /* see checked */
  res = ipcref__shape_numel(ndim, shape, ipcref__dtype_sizes[dt], &n);
  if (res == IPCREF_EINVAL) return ipcref__invalid(__func__, IPCREF__NO_SHAPE);
  if (res != IPCREF_OK) return res;
  if ((uint64_t)n * ipcref__dtype_sizes[dt] > b->size) return IPCREF_ERANGE;
  memset(&r, 0, sizeof r);
  r.buf = ipcref_buf_retain(b);
  r.dtype = dt;
  r.ndim = ndim;
  if (ndim) memcpy(r.shape, shape, (size_t)ndim * sizeof(int64_t));
  ipcref__contiguous_strides(ndim, r.shape, r.strides);
  *out = r;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_clone(const ipcref_view *v,
                                           ipcref_view *out) {
  IPCREF__CHECK_IN(v, out);
  if (out == v) return IPCREF_OK;
  return ipcref__view_finish(v, v, out);
}

IPCREF_API void ipcref_view_release(ipcref_view *v) {
  if (!v) return;
  ipcref_buf_release(v->buf);
  memset(v, 0, sizeof *v);
}
