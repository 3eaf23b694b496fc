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
 * reach outside its buffer. */

/* The size in bytes of one element; 0 for an invalid dtype. */
IPCREF_API size_t ipcref_dtype_size(ipcref_dtype dt);

/* The dtype's name ("f32", "c128", ...); "invalid" for an invalid one. */
IPCREF_API const char *ipcref_dtype_name(ipcref_dtype dt);

/* A new C-contiguous view over a new (uninitialized, 64-byte aligned)
 * buffer. Errors: EINVAL, ERANGE, ENOMEM. */
IPCREF_API ipcref_result ipcref_view_new(ipcref_dtype dt, int ndim,
                                         const int64_t *shape,
                                         ipcref_view *out);

/* A C-contiguous view of `b` from its first byte (retains b). The elements
 * must fit in the buffer. ndim 0 is a scalar (one element). */
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
 * size 1 may grow to any size with stride 0; -1 keeps the size. */
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
 * multiple of the dtype size). ERANGE when an element would lie outside the
 * buffer. */
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
 * dst has a broadcast (stride 0) dim of size > 1 or dtypes differ; EDEVICE
 * when either is device memory. */
IPCREF_API ipcref_result ipcref_view_copy(const ipcref_view *dst,
                                          const ipcref_view *src);

/* Writing. A view's elements may be written only when its buffer is
 * uniquely owned (this view holds the only reference), or when the buffer
 * was opened for shared writes with ipcref_buf_set_shared_mut, in which
 * case the users synchronize among themselves. ipcref_view_data_mut returns
 * the address of element (0,...,0) for writing, or NULL when the view is
 * not writable (or invalid). */
IPCREF_API void *ipcref_view_data_mut(const ipcref_view *v);

/* Makes v writable: when its buffer is shared (and not opened for shared
 * writes), copies the viewed elements into a new contiguous buffer and
 * points v there (its strides change); else does nothing. ENOMEM and
 * EDEVICE (device memory) leave v unchanged. */
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
IPCREF_PRIVATE IPCREF__INLINE int ipcref__view_span(const ipcref_view *v,
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

/* 1 when `v` is a view its buffer can back. Under IPCREF_CHECKED a view
 * of a released buffer is reported, naming the public function `fn`. */
IPCREF_PRIVATE IPCREF__INLINE int ipcref__view_valid_in(const ipcref_view *v,
                                                        const char *fn) {
  int64_t lo, hi, n;
  (void)fn;
  if (!v || !v->buf || (unsigned)v->dtype >= IPCREF_DTYPE_COUNT ||
      v->ndim < 0 || v->ndim > IPCREF_MAX_DIMS)
    return 0;
#ifdef IPCREF_CHECKED
  if (ipcref__buf_dead(v->buf, fn)) return 0;
#endif
  if (!ipcref__view_span(v, &lo, &hi, &n)) return 0;
  if (v->byte_offset < 0 || (uint64_t)v->byte_offset > v->buf->size) return 0;
  return n == 0 || (lo >= 0 && (uint64_t)hi <= v->buf->size);
}
#define ipcref__view_valid(v) ipcref__view_valid_in((v), __func__)

/* The element count of a view already known to be valid. */
IPCREF_PRIVATE int64_t ipcref__numel(const ipcref_view *v) {
  int64_t n = 1;
  int d;
  for (d = 0; d < v->ndim; d++)
    if (v->shape[d] == 0) return 0; /* the others may multiply past int64 */
  for (d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

/* The check of a result whose geometry came from the caller: EINVAL for
 * bad fields, ERANGE for elements outside the buffer or overflow. */
IPCREF_PRIVATE ipcref_result ipcref__view_check_new(const ipcref_view *v) {
  int64_t lo, hi, n;
  int d;
  for (d = 0; d < v->ndim; d++)
    if (v->shape[d] < 0) return IPCREF_ERANGE;
  if (!ipcref__view_span(v, &lo, &hi, &n)) return IPCREF_ERANGE;
  if (v->byte_offset < 0 || (uint64_t)v->byte_offset > v->buf->size)
    return IPCREF_ERANGE;
  if (n != 0 && (lo < 0 || (uint64_t)hi > v->buf->size)) return IPCREF_ERANGE;
  return IPCREF_OK;
}

/* Python's dim rule: -ndim <= dim < ndim. */
IPCREF_PRIVATE IPCREF__INLINE int ipcref__dim(int dim, int ndim, int *out) {
  if (dim < -ndim || dim >= ndim) return 0;
  *out = dim < 0 ? dim + ndim : dim;
  return 1;
}

/* The element count of a shape given by the caller: ERANGE for ndim out of
 * range, a negative size, or an overflow of int64 or of size_t bytes. */
IPCREF_PRIVATE ipcref_result ipcref__shape_numel(int ndim, const int64_t *shape,
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

IPCREF_PRIVATE void ipcref__contiguous_strides(int ndim, const int64_t *shape,
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
IPCREF_PRIVATE IPCREF__INLINE ipcref_result ipcref__view_finish(
    const ipcref_view *in, const ipcref_view *r, ipcref_view *out) {
  if (out != in) ipcref_buf_retain(r->buf);
  *out = *r;
  return IPCREF_OK;
}

/* Makes `out` the input view, holding its own reference (or, when it is
 * the input, keeping the input's), ready to be changed in place. Called
 * only after every check passed, with everything read from `v` already
 * in locals (`out` may be `v`). */
IPCREF_PRIVATE IPCREF__INLINE ipcref_view *
ipcref__view_out(const ipcref_view *v, ipcref_view *out) {
  if (out != v) {
    *out = *v;
    ipcref_buf_retain(out->buf);
  }
  return out;
}

#define IPCREF__CHECK_IN(v, out)                                               \
  do {                                                                         \
    if (!(out) || !ipcref__view_valid(v)) return IPCREF_EINVAL;                \
  } while (0)

/* ---- making and dropping views --------------------------------------- */

/* Large fresh outputs are mostly page faults; transparent huge pages cut
 * their number by 512. Linux only, and only where the OS is allowed. */
#define IPCREF__HUGE_MIN   ((size_t)4 << 20)
#define IPCREF__HUGE_ALIGN ((size_t)2 << 20)
#if defined(__linux__) && !defined(IPCREF_NO_SHARING)
#include <sys/mman.h>
#endif

IPCREF_PRIVATE ipcref_result ipcref__buf_for(size_t bytes, ipcref_buf **out) {
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
  if (!out || (unsigned)dt >= IPCREF_DTYPE_COUNT) return IPCREF_EINVAL;
  res = ipcref__shape_numel(ndim, shape, ipcref__dtype_sizes[dt], &n);
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
  if (!out || !b || (unsigned)dt >= IPCREF_DTYPE_COUNT) return IPCREF_EINVAL;
  res = ipcref__shape_numel(ndim, shape, ipcref__dtype_sizes[dt], &n);
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

/* ---- the O(1) operations --------------------------------------------- */

/* Removes dim d of r (its offset already accounted for). */
IPCREF_PRIVATE void ipcref__drop_dim(ipcref_view *r, int d) {
  int i;
  for (i = d; i + 1 < r->ndim; i++) {
    r->shape[i] = r->shape[i + 1];
    r->strides[i] = r->strides[i + 1];
  }
  r->ndim--;
  r->shape[r->ndim] = 0;
  r->strides[r->ndim] = 0;
}

IPCREF_PRIVATE int64_t ipcref__item(const ipcref_view *v) {
  return (int64_t)ipcref__dtype_sizes[v->dtype];
}

IPCREF_API ipcref_result ipcref_view_slice(const ipcref_view *v, int dim,
                                           int64_t start, int64_t stop,
                                           int64_t step, ipcref_view *out) {
  ipcref_view *r;
  int64_t len, n, stride, offset;
  int d, stride_ok;
  IPCREF__CHECK_IN(v, out);
  if (!ipcref__dim(dim, v->ndim, &d) || step == 0) return IPCREF_EINVAL;
  len = v->shape[d];
  if (step < -INT64_MAX) step = -INT64_MAX; /* so that -step exists */
  /* Python's clamping (PySlice_AdjustIndices). */
  if (start < 0) {
    start += len;
    if (start < 0) start = step < 0 ? -1 : 0;
  } else if (start >= len) {
    start = step < 0 ? len - 1 : len;
  }
  if (stop < 0) {
    stop += len;
    if (stop < 0) stop = step < 0 ? -1 : 0;
  } else if (stop >= len) {
    stop = step < 0 ? len - 1 : len;
  }
  if (step == 1) /* the common case, without a division */
    n = start < stop ? stop - start : 0;
  else if (step > 0)
    n = start < stop ? (stop - start - 1) / step + 1 : 0;
  else
    n = stop < start ? (start - stop - 1) / (-step) + 1 : 0;
  /* An empty view keeps its offset: with another dim at 0 the start may
   * lie past the buffer's end. */
  offset = v->byte_offset;
  if (n > 0 && ipcref__numel(v) > 0)
    offset += start * v->strides[d] * ipcref__item(v);
  /* With two or more elements left the new stride lies inside the old
   * dim's reach, so it cannot overflow; with fewer it does not matter, and
   * the old one is kept where the product would overflow. */
  stride_ok = !__builtin_mul_overflow(v->strides[d], step, &stride);
  r = ipcref__view_out(v, out);
  r->shape[d] = n;
  r->byte_offset = offset;
  if (stride_ok) r->strides[d] = stride;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_select(const ipcref_view *v, int dim,
                                            int64_t index, ipcref_view *out) {
  ipcref_view *r;
  int64_t offset;
  int d;
  IPCREF__CHECK_IN(v, out);
  if (!ipcref__dim(dim, v->ndim, &d)) return IPCREF_EINVAL;
  if (index < 0) index += v->shape[d];
  if (index < 0 || index >= v->shape[d]) return IPCREF_ERANGE;
  offset = v->byte_offset;
  if (ipcref__numel(v) > 0) /* empty views keep their offset */
    offset += index * v->strides[d] * ipcref__item(v);
  r = ipcref__view_out(v, out);
  r->byte_offset = offset;
  ipcref__drop_dim(r, d);
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_narrow(const ipcref_view *v, int dim,
                                            int64_t start, int64_t length,
                                            ipcref_view *out) {
  ipcref_view *r;
  int64_t offset;
  int d;
  IPCREF__CHECK_IN(v, out);
  if (!ipcref__dim(dim, v->ndim, &d)) return IPCREF_EINVAL;
  if (start < 0) start += v->shape[d];
  if (start < 0 || start > v->shape[d] || length < 0 ||
      length > v->shape[d] - start)
    return IPCREF_ERANGE;
  offset = v->byte_offset;
  if (length > 0 && ipcref__numel(v) > 0) /* empty views keep theirs */
    offset += start * v->strides[d] * ipcref__item(v);
  r = ipcref__view_out(v, out);
  r->shape[d] = length;
  r->byte_offset = offset;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_permute(const ipcref_view *v,
                                             const int *perm,
                                             ipcref_view *out) {
  ipcref_view r;
  unsigned seen = 0;
  int i, d;
  IPCREF__CHECK_IN(v, out);
  if (!perm && v->ndim > 0) return IPCREF_EINVAL;
  r = *v;
  for (i = 0; i < v->ndim; i++) {
    if (!ipcref__dim(perm[i], v->ndim, &d) || (seen & (1u << d)))
      return IPCREF_EINVAL;
    seen |= 1u << d;
    r.shape[i] = v->shape[d];
    r.strides[i] = v->strides[d];
  }
  return ipcref__view_finish(v, &r, out);
}

IPCREF_API ipcref_result ipcref_view_transpose(const ipcref_view *v, int d0,
                                               int d1, ipcref_view *out) {
  ipcref_view *r;
  int64_t size_a, stride_a, size_b, stride_b;
  int a, b;
  IPCREF__CHECK_IN(v, out);
  if (!ipcref__dim(d0, v->ndim, &a) || !ipcref__dim(d1, v->ndim, &b))
    return IPCREF_EINVAL;
  size_a = v->shape[a], stride_a = v->strides[a];
  size_b = v->shape[b], stride_b = v->strides[b];
  r = ipcref__view_out(v, out);
  r->shape[a] = size_b;
  r->strides[a] = stride_b;
  r->shape[b] = size_a;
  r->strides[b] = stride_a;
  return IPCREF_OK;
}

/* The strides that let `v` be seen with `shape` (same element count)
 * without a copy, or 0 when there are none. Dims are merged into chunks of
 * memory-contiguous runs; each chunk must split exactly into new dims (the
 * rule of PyTorch's computeStride). */
IPCREF_PRIVATE int ipcref__reshape_strides(const ipcref_view *v, int ndim,
                                           const int64_t *shape,
                                           int64_t *strides) {
  int64_t chunk_stride, tensor_n = 1, view_n = 1;
  int td, vd = ndim - 1;
  if (v->ndim == 0) {
    ipcref__contiguous_strides(ndim, shape, strides);
    return 1;
  }
  chunk_stride = v->strides[v->ndim - 1];
  for (td = v->ndim - 1; td >= 0; td--) {
    int64_t span;
    tensor_n *= v->shape[td];
    /* A chunk ends where the next dim out does not continue it; a stride
     * product that overflows cannot continue anything. */
    if (td == 0 || (v->shape[td - 1] != 1 &&
                    (__builtin_mul_overflow(tensor_n, chunk_stride, &span) ||
                     v->strides[td - 1] != span))) {
      while (vd >= 0 && (view_n < tensor_n || shape[vd] == 1)) {
        if (__builtin_mul_overflow(view_n, chunk_stride, &strides[vd]))
          return 0;
        view_n *= shape[vd];
        vd--;
      }
      if (view_n != tensor_n) return 0;
      if (td > 0) {
        chunk_stride = v->strides[td - 1];
        tensor_n = 1;
        view_n = 1;
      }
    }
  }
  return vd == -1;
}

/* Resolves a requested shape (one -1 may be inferred) against `numel`. */
IPCREF_PRIVATE ipcref_result ipcref__infer_shape(int ndim, const int64_t *in,
                                                 int64_t numel,
                                                 int64_t *shape) {
  int64_t known = 1;
  int d, infer = -1;
  if (ndim < 0 || ndim > IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  if (ndim > 0 && !in) return IPCREF_EINVAL;
  for (d = 0; d < ndim; d++) {
    shape[d] = in[d];
    if (in[d] == -1) {
      if (infer >= 0) return IPCREF_EINVAL;
      infer = d;
    } else if (in[d] < 0) {
      return IPCREF_ERANGE;
    } else if (in[d] == 0) {
      known = 0; /* empty, however large the rest */
    }
  }
  for (d = 0; d < ndim && known != 0; d++)
    if (in[d] != -1 && __builtin_mul_overflow(known, in[d], &known))
      return IPCREF_ERANGE;
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) return IPCREF_EINVAL;
    shape[infer] = numel / known;
  } else if (known != numel) {
    return IPCREF_EINVAL;
  }
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_reshape(const ipcref_view *v, int ndim,
                                             const int64_t *shape,
                                             ipcref_view *out) {
  ipcref_view r;
  ipcref_result res;
  IPCREF__CHECK_IN(v, out);
  r = *v;
  res = ipcref__infer_shape(ndim, shape, ipcref__numel(v), r.shape);
  if (res != IPCREF_OK) return res;
  r.ndim = ndim;
  if (ipcref__numel(v) == 0)
    ipcref__contiguous_strides(ndim, r.shape, r.strides);
  else if (!ipcref__reshape_strides(v, ndim, r.shape, r.strides))
    return IPCREF_ENEEDCOPY;
  if (ndim < IPCREF_MAX_DIMS) {
    memset(r.shape + ndim, 0, (size_t)(IPCREF_MAX_DIMS - ndim) * 8);
    memset(r.strides + ndim, 0, (size_t)(IPCREF_MAX_DIMS - ndim) * 8);
  }
  if (ipcref__view_check_new(&r) != IPCREF_OK) return IPCREF_ENEEDCOPY;
  return ipcref__view_finish(v, &r, out);
}

IPCREF_API ipcref_result ipcref_view_reshape_copy(const ipcref_view *v,
                                                  int ndim,
                                                  const int64_t *shape,
                                                  ipcref_view *out) {
  ipcref_view tmp;
  int64_t resolved[IPCREF_MAX_DIMS];
  ipcref_result res = ipcref_view_reshape(v, ndim, shape, out);
  if (res != IPCREF_ENEEDCOPY) return res;
  /* Check the shape first, so that a bad one costs no copy. */
  res = ipcref__infer_shape(ndim, shape, ipcref__numel(v), resolved);
  if (res != IPCREF_OK) return res;
  res = ipcref_view_contiguous(v, &tmp);
  if (res != IPCREF_OK) return res;
  res = ipcref_view_reshape(&tmp, ndim, resolved, &tmp);
  if (res != IPCREF_OK) { /* cannot happen: tmp is contiguous */
    ipcref_view_release(&tmp);
    return res;
  }
  if (out == v) ipcref_view_release(out);
  *out = tmp;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_flatten(const ipcref_view *v,
                                             int start_dim, int end_dim,
                                             ipcref_view *out) {
  int64_t shape[IPCREF_MAX_DIMS];
  int s, e, d, n = 0;
  IPCREF__CHECK_IN(v, out);
  if (v->ndim == 0) {
    if ((start_dim != 0 && start_dim != -1) || (end_dim != 0 && end_dim != -1))
      return IPCREF_EINVAL;
    shape[0] = 1;
    return ipcref_view_reshape(v, 1, shape, out);
  }
  if (!ipcref__dim(start_dim, v->ndim, &s) ||
      !ipcref__dim(end_dim, v->ndim, &e) || s > e)
    return IPCREF_EINVAL;
  for (d = 0; d < s; d++) shape[n++] = v->shape[d];
  shape[n] = 1;
  for (d = s; d <= e; d++)
    if (__builtin_mul_overflow(shape[n], v->shape[d], &shape[n]))
      return IPCREF_ERANGE; /* the merged size cannot be represented */
  n++;
  for (d = e + 1; d < v->ndim; d++) shape[n++] = v->shape[d];
  return ipcref_view_reshape(v, n, shape, out);
}

IPCREF_API ipcref_result ipcref_view_expand(const ipcref_view *v, int ndim,
                                            const int64_t *shape,
                                            ipcref_view *out) {
  ipcref_view r;
  int64_t n = 1;
  int i, lead;
  IPCREF__CHECK_IN(v, out);
  if (ndim > IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  if (ndim < v->ndim || (ndim > 0 && !shape)) return IPCREF_EINVAL;
  lead = ndim - v->ndim;
  r = *v;
  r.ndim = ndim;
  for (i = 0; i < ndim; i++) {
    int64_t want = shape[i];
    if (i < lead) { /* a new leading dim */
      if (want < 0) return want == -1 ? IPCREF_EINVAL : IPCREF_ERANGE;
      r.shape[i] = want;
      r.strides[i] = 0;
    } else {
      int64_t have = v->shape[i - lead], st = v->strides[i - lead];
      if (want == -1 || want == have) {
        r.shape[i] = have;
        r.strides[i] = st;
      } else if (want < 0) {
        return IPCREF_ERANGE;
      } else if (have == 1) {
        r.shape[i] = want;
        r.strides[i] = 0;
      } else {
        return IPCREF_EINVAL;
      }
    }
  }
  /* The count (zero when any size is) and its bytes must fit. */
  for (i = 0; i < ndim; i++)
    if (r.shape[i] == 0) n = 0;
  for (i = 0; i < ndim && n != 0; i++)
    if (__builtin_mul_overflow(n, r.shape[i], &n)) return IPCREF_ERANGE;
  if (__builtin_mul_overflow(n, ipcref__item(v), &n)) return IPCREF_ERANGE;
  return ipcref__view_finish(v, &r, out);
}

IPCREF_API ipcref_result ipcref_view_squeeze(const ipcref_view *v, int dim,
                                             ipcref_view *out) {
  ipcref_view r;
  int d;
  IPCREF__CHECK_IN(v, out);
  r = *v;
  if (dim == IPCREF_DIM_ALL) {
    for (d = r.ndim - 1; d >= 0; d--)
      if (r.shape[d] == 1) ipcref__drop_dim(&r, d);
  } else {
    if (!ipcref__dim(dim, v->ndim, &d) || v->shape[d] != 1)
      return IPCREF_EINVAL;
    ipcref__drop_dim(&r, d);
  }
  return ipcref__view_finish(v, &r, out);
}

IPCREF_API ipcref_result ipcref_view_unsqueeze(const ipcref_view *v, int dim,
                                               ipcref_view *out) {
  ipcref_view r;
  int d, i;
  IPCREF__CHECK_IN(v, out);
  if (v->ndim >= IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  if (!ipcref__dim(dim, v->ndim + 1, &d)) return IPCREF_EINVAL;
  r = *v;
  for (i = v->ndim; i > d; i--) {
    r.shape[i] = r.shape[i - 1];
    r.strides[i] = r.strides[i - 1];
  }
  r.shape[d] = 1;
  /* Any stride suits a dim of size 1; PyTorch's choice keeps the view
   * contiguous-looking. */
  if (d >= v->ndim ||
      __builtin_mul_overflow(v->shape[d], v->strides[d], &r.strides[d]))
    r.strides[d] = 1;
  r.ndim++;
  return ipcref__view_finish(v, &r, out);
}

IPCREF_API ipcref_result ipcref_view_flip(const ipcref_view *v, int dim,
                                          ipcref_view *out) {
  ipcref_view *r;
  int64_t offset, stride;
  int d;
  IPCREF__CHECK_IN(v, out);
  if (!ipcref__dim(dim, v->ndim, &d)) return IPCREF_EINVAL;
  offset = v->byte_offset;
  stride = v->strides[d];
  if (v->shape[d] > 1 && ipcref__numel(v) > 0) { /* inside: no overflow */
    offset += (v->shape[d] - 1) * stride * ipcref__item(v);
    stride = -stride;
  }
  r = ipcref__view_out(v, out);
  r->byte_offset = offset;
  r->strides[d] = stride;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_as_strided(const ipcref_view *v, int ndim,
                                                const int64_t *shape,
                                                const int64_t *strides,
                                                int64_t byte_offset,
                                                ipcref_view *out) {
  ipcref_view r;
  ipcref_result res;
  IPCREF__CHECK_IN(v, out);
  if (ndim < 0 || ndim > IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  if (ndim > 0 && (!shape || !strides)) return IPCREF_EINVAL;
  if (byte_offset % ipcref__item(v) != 0) return IPCREF_EINVAL;
  memset(&r, 0, sizeof r);
  r.buf = v->buf;
  r.dtype = v->dtype;
  r.ndim = ndim;
  r.byte_offset = byte_offset;
  if (ndim) {
    memcpy(r.shape, shape, (size_t)ndim * sizeof(int64_t));
    memcpy(r.strides, strides, (size_t)ndim * sizeof(int64_t));
  }
  res = ipcref__view_check_new(&r);
  if (res != IPCREF_OK) return res;
  return ipcref__view_finish(v, &r, out);
}

IPCREF_API int ipcref_view_is_contiguous(const ipcref_view *v) {
  int64_t expect = 1;
  int d;
  if (!ipcref__view_valid(v)) return 0;
  if (ipcref__numel(v) == 0) return 1;
  for (d = v->ndim - 1; d >= 0; d--) {
    if (v->shape[d] == 1) continue;
    if (v->strides[d] != expect) return 0;
    expect *= v->shape[d];
  }
  return 1;
}

IPCREF_API int64_t ipcref_view_numel(const ipcref_view *v) {
  return ipcref__view_valid(v) ? ipcref__numel(v) : 0;
}

IPCREF_API void *ipcref_view_ptr(const ipcref_view *v, const int64_t *index) {
  int64_t off;
  int d;
  if (!ipcref__view_valid(v) || ipcref__numel(v) == 0) return NULL;
  if (v->ndim > 0 && !index) return NULL;
  off = v->byte_offset;
  for (d = 0; d < v->ndim; d++) {
    if (index[d] < 0 || index[d] >= v->shape[d]) return NULL;
    off += index[d] * v->strides[d] * ipcref__item(v);
  }
  return (char *)v->buf->data + off;
}

/* ---- iteration ------------------------------------------------------- */

IPCREF_API ipcref_result ipcref_view_iter_init(const ipcref_view *v,
                                               ipcref_view_iter *it) {
  int d;
  if (!it || !ipcref__view_valid(v)) return IPCREF_EINVAL;
  memset(it, 0, sizeof *it);
  it->base = (char *)v->buf->data + v->byte_offset;
  it->remaining = ipcref__numel(v);
  it->ndim = v->ndim;
  for (d = 0; d < v->ndim; d++) {
    it->shape[d] = v->shape[d];
    /* A dim of size 1 never steps, and its stride may be anything. */
    it->byte_strides[d] = v->shape[d] > 1 && it->remaining > 0
                              ? v->strides[d] * ipcref__item(v)
                              : 0;
  }
  return IPCREF_OK;
}

IPCREF_API void *ipcref_view_iter_next(ipcref_view_iter *it) {
  int d;
  if (!it || it->remaining <= 0) return NULL;
  it->remaining--;
  if (!it->started) {
    it->started = 1;
    it->cur = it->base;
    return it->cur;
  }
  for (d = it->ndim - 1; d >= 0; d--) {
    it->cur += it->byte_strides[d];
    if (++it->index[d] < it->shape[d]) break;
    it->cur -= it->shape[d] * it->byte_strides[d];
    it->index[d] = 0;
  }
  return it->cur;
}

/* ---- copying ----------------------------------------------------------
 * A copy is planned first: dims of size 1 go, and neighbouring dims that
 * are contiguous with each other on both sides merge, so most copies end
 * as one memcpy, rows of memcpy, a blocked 2-d transpose, or a strided
 * loop over one dim with a fixed element size. */

#if defined(__SSE2__)
#include <emmintrin.h>
#define IPCREF__SSE2 1
#endif

/* Past this many output bytes a copy writes around the cache (streaming
 * stores): the output would not fit anyway, and skipping the read that a
 * cached write of a fresh line costs saves a third of the memory traffic. */
#define IPCREF__STREAM_MIN ((int64_t)4 << 20)

typedef struct ipcref__copy_plan {
  int ndim;
  int stream; /* large output: write around the cache */
  size_t item;
  int64_t shape[IPCREF_MAX_DIMS];
  int64_t ds[IPCREF_MAX_DIMS]; /* destination byte strides */
  int64_t ss[IPCREF_MAX_DIMS]; /* source byte strides */
} ipcref__copy_plan;

IPCREF_PRIVATE void ipcref__plan(ipcref__copy_plan *p, const ipcref_view *dst,
                                 const ipcref_view *src) {
  int d, n = 0;
  int64_t item = ipcref__item(dst);
  p->item = (size_t)item;
  p->stream = ipcref__numel(dst) >= IPCREF__STREAM_MIN / item;
  for (d = 0; d < dst->ndim; d++) {
    if (dst->shape[d] == 1) continue;
    p->shape[n] = dst->shape[d];
    p->ds[n] = dst->strides[d] * item;
    p->ss[n] = src->strides[d] * item;
    n++;
  }
  /* Merge dim d into d+1 when both sides step over d exactly as far as
   * one full run of d+1. */
  for (d = n - 2; d >= 0; d--) {
    int64_t dspan, sspan;
    if (!__builtin_mul_overflow(p->ds[d + 1], p->shape[d + 1], &dspan) &&
        !__builtin_mul_overflow(p->ss[d + 1], p->shape[d + 1], &sspan) &&
        p->ds[d] == dspan && p->ss[d] == sspan) {
      int i;
      p->shape[d + 1] *= p->shape[d];
      for (i = d; i + 1 < n; i++) {
        p->shape[i] = p->shape[i + 1];
        p->ds[i] = p->ds[i + 1];
        p->ss[i] = p->ss[i + 1];
      }
      n--;
    }
  }
  p->ndim = n;
}

/* Every other element of a run of 4-byte elements, four at a time; returns
 * how many it did (the caller finishes the tail). */
IPCREF_PRIVATE int64_t ipcref__gather2_4(char *d, const char *s, int64_t n,
                                         int stream) {
  int64_t i = 0;
#ifdef IPCREF__SSE2
  if (stream && ((uintptr_t)d & 15) == 0) {
    for (; i + 4 <= n; i += 4) {
      __m128 a = _mm_loadu_ps((const float *)(const void *)(s + i * 8));
      __m128 b = _mm_loadu_ps((const float *)(const void *)(s + i * 8 + 16));
      _mm_stream_ps((float *)(void *)(d + i * 4),
                    _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    }
    return i;
  }
  for (; i + 4 <= n; i += 4) {
    __m128 a = _mm_loadu_ps((const float *)(const void *)(s + i * 8));
    __m128 b = _mm_loadu_ps((const float *)(const void *)(s + i * 8 + 16));
    _mm_storeu_ps((float *)(void *)(d + i * 4),
                  _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
  }
#else
  (void)d, (void)s, (void)n, (void)stream;
#endif
  return i;
}

/* One dim, n elements. The element size is a constant in each branch, so
 * compilers turn the copies into plain moves; memcpy keeps unaligned
 * elements well defined. */
#define IPCREF__COPY_RUN(SIZE)                                                 \
  do {                                                                         \
    if (ds == SIZE)                                                            \
      for (i = 0; i < n; i++) memcpy(d + i * SIZE, s + i * ss, SIZE);          \
    else                                                                       \
      for (i = 0; i < n; i++) memcpy(d + i * ds, s + i * ss, SIZE);            \
  } while (0)

IPCREF_PRIVATE void ipcref__copy_run(char *d, int64_t ds, const char *s,
                                     int64_t ss, int64_t n, size_t item,
                                     int stream) {
  int64_t i;
  if (ds == (int64_t)item && ss == (int64_t)item) {
    memcpy(d, s, (size_t)n * item);
    return;
  }
  if (item == 4 && ds == 4 && ss == 8) {
    int64_t done = ipcref__gather2_4(d, s, n, stream);
    d += done * 4;
    s += done * 8;
    n -= done;
  }
  switch (item) {
  case 1: IPCREF__COPY_RUN(1); break;
  case 2: IPCREF__COPY_RUN(2); break;
  case 4: IPCREF__COPY_RUN(4); break;
  case 8: IPCREF__COPY_RUN(8); break;
  default: IPCREF__COPY_RUN(16); break;
  }
}

#ifdef IPCREF__SSE2
/* The 2-d transpose of 4-byte elements: dst rows contiguous, src columns
 * contiguous (dst[r][c] = *(s + r * 4 + c * scs)). Two things make it fast.
 * The source rows are a power of two apart in typical shapes, so reading a
 * column of them hits one cache set again and again; each 64x64 tile is
 * therefore first copied row by row into a small scratch block. From there
 * 4x4 register transposes write whole output lines, around the cache when
 * the output is large. Returns 0 (and does nothing) without scratch. */
#define IPCREF__TT 64
IPCREF_PRIVATE int ipcref__transpose4(char *d, int64_t drs, const char *s,
                                      int64_t scs, int64_t rows, int64_t cols,
                                      int stream) {
  float *tile;
  int64_t r0, c0, r, c;
  if (rows < IPCREF__TT || cols < IPCREF__TT) return 0;
  tile = (float *)IPCREF_MALLOC(IPCREF__TT * IPCREF__TT * sizeof(float));
  if (!tile) return 0;
  stream = stream && ((uintptr_t)d & 15) == 0 && (drs & 15) == 0;
  for (r0 = 0; r0 + IPCREF__TT <= rows; r0 += IPCREF__TT) {
    for (c0 = 0; c0 + IPCREF__TT <= cols; c0 += IPCREF__TT) {
      int64_t nr = r0, nc = c0 + IPCREF__TT; /* the next tile */
      for (c = 0; c < IPCREF__TT; c++)
        memcpy(tile + c * IPCREF__TT, s + (c0 + c) * scs + r0 * 4,
               IPCREF__TT * 4);
      /* Its source lines lie far apart: no hardware prefetcher finds them,
       * so ask for them while this tile is being written. */
      if (nc + IPCREF__TT > cols) nr += IPCREF__TT, nc = 0;
      if (nr + IPCREF__TT <= rows)
        for (c = 0; c < IPCREF__TT; c++) {
          const char *line = s + (nc + c) * scs + nr * 4;
          _mm_prefetch(line, _MM_HINT_T0);
          _mm_prefetch(line + 64, _MM_HINT_T0);
          _mm_prefetch(line + 128, _MM_HINT_T0);
          _mm_prefetch(line + 192, _MM_HINT_T0);
        }
      for (r = 0; r < IPCREF__TT; r += 4) {
        char *o = d + (r0 + r) * drs + c0 * 4;
        for (c = 0; c < IPCREF__TT; c += 4) {
          const float *t = tile + c * IPCREF__TT + r;
          __m128 x0 = _mm_load_ps(t), x1 = _mm_load_ps(t + IPCREF__TT),
                 x2 = _mm_load_ps(t + 2 * IPCREF__TT),
                 x3 = _mm_load_ps(t + 3 * IPCREF__TT);
          _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
          if (stream) {
            _mm_stream_ps((float *)(void *)(o + c * 4), x0);
            _mm_stream_ps((float *)(void *)(o + drs + c * 4), x1);
            _mm_stream_ps((float *)(void *)(o + 2 * drs + c * 4), x2);
            _mm_stream_ps((float *)(void *)(o + 3 * drs + c * 4), x3);
          } else {
            _mm_storeu_ps((float *)(void *)(o + c * 4), x0);
            _mm_storeu_ps((float *)(void *)(o + drs + c * 4), x1);
            _mm_storeu_ps((float *)(void *)(o + 2 * drs + c * 4), x2);
            _mm_storeu_ps((float *)(void *)(o + 3 * drs + c * 4), x3);
          }
        }
      }
    }
  }
  IPCREF_FREE(tile);
  /* The ragged right and bottom edges, element by element. */
  for (r = 0; r < rows; r++)
    for (c = (r < r0 ? c0 : 0); c < cols; c++)
      memcpy(d + r * drs + c * 4, s + r * 4 + c * scs, 4);
  return 1;
}
#endif

/* A 2-d copy where one side walks rows and the other columns (a
 * transpose): done in square tiles that fit in L1, so that both the
 * strided reads and the writes stay in cache. */
#define IPCREF__TILE 32
#define IPCREF__COPY_TILE(SIZE)                                                \
  for (r = r0; r < r1; r++)                                                    \
    for (c = c0; c < c1; c++)                                                  \
  memcpy(d + r * drs + c * dcs, s + r * srs + c * scs, SIZE)

IPCREF_PRIVATE void ipcref__copy_tiled(char *d, int64_t drs, int64_t dcs,
                                       const char *s, int64_t srs, int64_t scs,
                                       int64_t rows, int64_t cols,
                                       size_t item) {
  int64_t r0, c0, r, c;
  for (r0 = 0; r0 < rows; r0 += IPCREF__TILE) {
    int64_t r1 = r0 + IPCREF__TILE < rows ? r0 + IPCREF__TILE : rows;
    for (c0 = 0; c0 < cols; c0 += IPCREF__TILE) {
      int64_t c1 = c0 + IPCREF__TILE < cols ? c0 + IPCREF__TILE : cols;
      switch (item) {
      case 1: IPCREF__COPY_TILE(1); break;
      case 2: IPCREF__COPY_TILE(2); break;
      case 4: IPCREF__COPY_TILE(4); break;
      case 8: IPCREF__COPY_TILE(8); break;
      default: IPCREF__COPY_TILE(16); break;
      }
    }
  }
}

IPCREF_PRIVATE void ipcref__copy_2d(char *d, int64_t drs, int64_t dcs,
                                    const char *s, int64_t srs, int64_t scs,
                                    int64_t rows, int64_t cols, size_t item,
                                    int stream) {
  int64_t r, it = (int64_t)item;
#ifdef IPCREF__SSE2
  if (item == 4 && dcs == 4 && srs == 4 &&
      ipcref__transpose4(d, drs, s, scs, rows, cols, stream))
    return;
#endif
  /* One side contiguous along rows, the other along columns. */
  if (rows >= 8 && cols >= 8 &&
      ((dcs == it && srs == it) || (scs == it && drs == it))) {
    ipcref__copy_tiled(d, drs, dcs, s, srs, scs, rows, cols, item);
    return;
  }
  for (r = 0; r < rows; r++)
    ipcref__copy_run(d + r * drs, dcs, s + r * srs, scs, cols, item, stream);
}

/* Streaming stores are weakly ordered: fence them before anyone (another
 * thread handed the buffer next) can read the result. */
IPCREF_PRIVATE void ipcref__copy_fence(const ipcref__copy_plan *p) {
#ifdef IPCREF__SSE2
  if (p->stream) _mm_sfence();
#else
  (void)p;
#endif
}

IPCREF_PRIVATE void ipcref__copy_plan_run(const ipcref__copy_plan *p, char *d,
                                          const char *s) {
  int64_t idx[IPCREF_MAX_DIMS];
  int outer = p->ndim - 2, k;
  if (p->ndim == 0) {
    memcpy(d, s, p->item);
    return;
  }
  if (p->ndim == 1) {
    ipcref__copy_run(d, p->ds[0], s, p->ss[0], p->shape[0], p->item, p->stream);
    ipcref__copy_fence(p);
    return;
  }
  memset(idx, 0, sizeof idx);
  for (;;) {
    ipcref__copy_2d(d, p->ds[outer], p->ds[outer + 1], s, p->ss[outer],
                    p->ss[outer + 1], p->shape[outer], p->shape[outer + 1],
                    p->item, p->stream);
    /* The odometer over the outer dims. */
    for (k = outer - 1; k >= 0; k--) {
      d += p->ds[k];
      s += p->ss[k];
      if (++idx[k] < p->shape[k]) break;
      d -= p->shape[k] * p->ds[k];
      s -= p->shape[k] * p->ss[k];
      idx[k] = 0;
    }
    if (k < 0) break;
  }
  ipcref__copy_fence(p);
}

/* Copies src into dst: same dtype and ndim, shapes equal, both valid, no
 * overlap. */
IPCREF_PRIVATE void ipcref__copy_elements(const ipcref_view *dst,
                                          const ipcref_view *src) {
  ipcref__copy_plan p;
  if (ipcref__numel(dst) == 0) return;
  ipcref__plan(&p, dst, src);
  ipcref__copy_plan_run(&p, (char *)dst->buf->data + dst->byte_offset,
                        (const char *)src->buf->data + src->byte_offset);
}

IPCREF_API ipcref_result ipcref_view_contiguous(const ipcref_view *v,
                                                ipcref_view *out) {
  ipcref_view r;
  ipcref_result res;
  IPCREF__CHECK_IN(v, out);
  if (ipcref_view_is_contiguous(v)) return ipcref_view_clone(v, out);
  if (!ipcref__buf_on_host(v->buf)) return IPCREF_EDEVICE;
  res = ipcref_view_new(v->dtype, v->ndim, v->shape, &r);
  if (res != IPCREF_OK) return res;
  ipcref__copy_elements(&r, v);
  if (out == v) ipcref_view_release(out);
  *out = r;
  return IPCREF_OK;
}

IPCREF_PRIVATE int ipcref__view_writable(const ipcref_view *v) {
  if (ipcref__buf_read_only(v->buf)) return 0;
  return ipcref_buf_is_shared_mut(v->buf) || ipcref_buf_is_unique(v->buf);
}

/* The absolute address range [lo, hi) a non-empty valid view touches. */
IPCREF_PRIVATE void ipcref__view_range(const ipcref_view *v, uintptr_t *lo,
                                       uintptr_t *hi) {
  int64_t l = 0, h = 0, n;
  (void)ipcref__view_span(v, &l, &h, &n);
  *lo = (uintptr_t)v->buf->data + (uintptr_t)l;
  *hi = (uintptr_t)v->buf->data + (uintptr_t)h;
}

IPCREF_API ipcref_result ipcref_view_copy(const ipcref_view *dst,
                                          const ipcref_view *src) {
  ipcref_view from;
  uintptr_t dlo, dhi, slo, shi;
  ipcref_result res;
  int d;
  if (!ipcref__view_valid(dst) || !ipcref__view_valid(src) ||
      dst->dtype != src->dtype)
    return IPCREF_EINVAL;
  if (!ipcref__buf_on_host(dst->buf) || !ipcref__buf_on_host(src->buf))
    return IPCREF_EDEVICE;
  /* Broadcast src to dst's shape (metadata only; no reference taken). */
  res = ipcref_view_expand(src, dst->ndim, dst->shape, &from);
  if (res != IPCREF_OK) return IPCREF_EINVAL;
  ipcref_buf_release(from.buf); /* expand retained; src keeps it alive */
  for (d = 0; d < dst->ndim; d++)
    if (dst->strides[d] == 0 && dst->shape[d] > 1) return IPCREF_EINVAL;
  if (!ipcref__view_writable(dst)) return IPCREF_EBUSY;
  if (ipcref__numel(dst) == 0) return IPCREF_OK;
  ipcref__view_range(dst, &dlo, &dhi);
  ipcref__view_range(&from, &slo, &shi);
  if (dlo < shi && slo < dhi) {
    /* Overlap: read all of src first, as if it were a separate array. */
    ipcref_view tmp;
    res = ipcref_view_new(from.dtype, from.ndim, from.shape, &tmp);
    if (res != IPCREF_OK) return res;
    ipcref__copy_elements(&tmp, &from);
    ipcref__copy_elements(dst, &tmp);
    ipcref_view_release(&tmp);
    return IPCREF_OK;
  }
  ipcref__copy_elements(dst, &from);
  return IPCREF_OK;
}

IPCREF_API void *ipcref_view_data_mut(const ipcref_view *v) {
  if (!ipcref__view_valid(v) || !ipcref__view_writable(v)) return NULL;
  return (char *)v->buf->data + v->byte_offset;
}

IPCREF_API ipcref_result ipcref_view_make_mut(ipcref_view *v) {
  ipcref_view r;
  ipcref_result res;
  if (!ipcref__view_valid(v)) return IPCREF_EINVAL;
  if (ipcref__view_writable(v)) return IPCREF_OK;
  if (!ipcref__buf_on_host(v->buf)) return IPCREF_EDEVICE;
  res = ipcref_view_new(v->dtype, v->ndim, v->shape, &r);
  if (res != IPCREF_OK) return res;
  ipcref__copy_elements(&r, v);
  ipcref_view_release(v);
  *v = r;
  return IPCREF_OK;
}
