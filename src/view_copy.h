/* view_copy: the operations that copy data: contiguous, copy,
 * reshape_copy, make_mut. Dims are merged where both sides allow it; 2-d
 * f32 transposes go through cache tiles and SSE2 register transposes;
 * large outputs use streaming stores. No lock. */

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

/* Plans the copy of `src` into `dst` (same shape and dtype): byte
 * strides, dims of size 1 dropped, neighbours contiguous on both sides
 * merged. */
IPCREF__PRIVATE void ipcref__plan(ipcref__copy_plan *p, const ipcref_view *dst,
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
IPCREF__PRIVATE int64_t ipcref__gather2_4(char *d, const char *s, int64_t n,
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

/* Copies `n` elements of `item` bytes along one dim: one memcpy when both
 * sides are contiguous, else element by element with a fixed size. */
IPCREF__PRIVATE void ipcref__copy_run(char *d, int64_t ds, const char *s,
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
IPCREF__PRIVATE int ipcref__transpose4(char *d, int64_t drs, const char *s,
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

/* A 2-d copy in square tiles, for a side contiguous along rows and the
 * other along columns: each tile stays in cache on both sides. */
IPCREF__PRIVATE void ipcref__copy_tiled(char *d, int64_t drs, int64_t dcs,
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

/* One 2-d copy: the f32 register transpose, tiles, or row by row. */
IPCREF__PRIVATE void ipcref__copy_2d(char *d, int64_t drs, int64_t dcs,
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
IPCREF__PRIVATE void ipcref__copy_fence(const ipcref__copy_plan *p) {
#ifdef IPCREF__SSE2
  if (p->stream) _mm_sfence();
#else
  (void)p;
#endif
}

/* Runs a plan: its two innermost dims as one 2-d copy (or one run), the
 * outer dims counted like an odometer. */
IPCREF__PRIVATE void ipcref__copy_plan_run(const ipcref__copy_plan *p, char *d,
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
    /* The odometer over the outer dims. A dim that wraps goes back by
     * (shape-1) strides, which the views reach; shape * stride (a step
     * past the last index) may overflow int64. */
    for (k = outer - 1; k >= 0; k--) {
      if (++idx[k] < p->shape[k]) {
        d += p->ds[k];
        s += p->ss[k];
        break;
      }
      d -= (p->shape[k] - 1) * p->ds[k];
      s -= (p->shape[k] - 1) * p->ss[k];
      idx[k] = 0;
    }
    if (k < 0) break;
  }
  ipcref__copy_fence(p);
}

/* Copies src into dst: same dtype and ndim, shapes equal, both valid, no
 * overlap. */
IPCREF__PRIVATE void ipcref__copy_elements(const ipcref_view *dst,
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

IPCREF__PRIVATE int ipcref__view_writable(const ipcref_view *v) {
  if (ipcref__buf_read_only(v->buf)) return 0;
  return ipcref_buf_is_shared_mut(v->buf) || ipcref__buf_sole(v->buf);
}

/* The absolute address range [lo, hi) a non-empty valid view touches. */
IPCREF__PRIVATE void ipcref__view_range(const ipcref_view *v, uintptr_t *lo,
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
  const char *why;
  int d;
  if (!ipcref__view_valid(dst))
    return ipcref__view_invalid(dst, __func__, "dst");
  if (!ipcref__view_valid(src))
    return ipcref__view_invalid(src, __func__, "src");
  if (dst->dtype != src->dtype)
    return ipcref__invalid(__func__, "dst and src have different dtypes");
  if (!ipcref__buf_on_host(dst->buf) || !ipcref__buf_on_host(src->buf))
    return IPCREF_EDEVICE;
  /* Broadcast src to dst's shape (metadata only; no reference taken). */
  if (ipcref__expand(src, dst->ndim, dst->shape, &from, &why) != IPCREF_OK)
    return ipcref__invalid(__func__, "src does not broadcast to dst's shape");
  for (d = 0; d < dst->ndim; d++)
    if (dst->strides[d] == 0 && dst->shape[d] > 1)
      return ipcref__invalid(__func__, "dst has a broadcast dim (stride 0, "
                                       "size > 1): it would be written twice");
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
  if (!ipcref__view_valid(v)) return ipcref__view_invalid(v, __func__, "v");
  if (ipcref__view_writable(v)) return IPCREF_OK;
  if (!ipcref__buf_on_host(v->buf)) return IPCREF_EDEVICE;
  res = ipcref_view_new(v->dtype, v->ndim, v->shape, &r);
  if (res != IPCREF_OK) return res;
  ipcref__copy_elements(&r, v);
  ipcref_view_release(v);
  *v = r;
  return IPCREF_OK;
}
