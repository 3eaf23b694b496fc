/* view_ops: the O(1) view operations (slice, select, narrow, permute,
 * transpose, reshape, flatten, expand, squeeze, unsqueeze, flip,
 * as_strided), the queries on a view, and iteration. Metadata only: no
 * data is touched and no lock is taken (a view is a value; its buffer's
 * count is atomic). */

/* Removes dim d of r (its offset already accounted for). */
IPCREF__PRIVATE void ipcref__drop_dim(ipcref_view *r, int d) {
  int i;
  for (i = d; i + 1 < r->ndim; i++) {
    r->shape[i] = r->shape[i + 1];
    r->strides[i] = r->strides[i + 1];
  }
  r->ndim--;
  r->shape[r->ndim] = 0;
  r->strides[r->ndim] = 0;
}

IPCREF__PRIVATE int64_t ipcref__item(const ipcref_view *v) {
  return (int64_t)ipcref__dtype_sizes[v->dtype];
}

IPCREF_API ipcref_result ipcref_view_slice(const ipcref_view *v, int dim,
                                           int64_t start, int64_t stop,
                                           int64_t step, ipcref_view *out) {
  ipcref_view *r;
  int64_t len, n, stride, offset;
  int d, stride_ok;
  IPCREF__CHECK_IN(v, out);
  if (!ipcref__dim(dim, v->ndim, &d))
    return ipcref__bad_dim(__func__, "dim", dim, v->ndim);
  if (step == 0) return ipcref__invalid(__func__, "step is 0");
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
  if (!ipcref__dim(dim, v->ndim, &d))
    return ipcref__bad_dim(__func__, "dim", dim, v->ndim);
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
  if (!ipcref__dim(dim, v->ndim, &d))
    return ipcref__bad_dim(__func__, "dim", dim, v->ndim);
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
  if (!perm && v->ndim > 0)
    return ipcref__invalid(__func__, "perm is NULL with ndim > 0");
  r = *v;
  for (i = 0; i < v->ndim; i++) {
    if (!ipcref__dim(perm[i], v->ndim, &d))
      return ipcref__bad_dim(__func__, "perm entry", perm[i], v->ndim);
    if (seen & (1u << d))
      return ipcref__invalid(__func__, "perm names a dim twice");
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
  if (!ipcref__dim(d0, v->ndim, &a))
    return ipcref__bad_dim(__func__, "d0", d0, v->ndim);
  if (!ipcref__dim(d1, v->ndim, &b))
    return ipcref__bad_dim(__func__, "d1", d1, v->ndim);
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
IPCREF__PRIVATE int ipcref__reshape_strides(const ipcref_view *v, int ndim,
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

/* Resolves a requested shape (one -1 may be inferred) against `numel`,
 * for public function `fn` (named in a refusal). */
IPCREF__PRIVATE ipcref_result ipcref__infer_shape(int ndim, const int64_t *in,
                                                  int64_t numel, int64_t *shape,
                                                  const char *fn) {
  int64_t known = 1;
  int d, infer = -1;
  if (ndim < 0 || ndim > IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  if (ndim > 0 && !in)
    return ipcref__invalid(fn, "shape is NULL with ndim > 0");
  for (d = 0; d < ndim; d++) {
    shape[d] = in[d];
    if (in[d] == -1) {
      if (infer >= 0) return ipcref__invalid(fn, "shape has more than one -1");
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
    if (known == 0 || numel % known != 0)
      return ipcref__invalid(fn, "the -1 in shape cannot be inferred (the "
                                 "other sizes do not divide the count)");
    shape[infer] = numel / known;
  } else if (known != numel) {
    return ipcref__invalid(fn, "shape's element count differs from v's");
  }
  return IPCREF_OK;
}

/* ipcref_view_reshape of a checked view, for public function `fn`. */
IPCREF__PRIVATE ipcref_result ipcref__reshape(const ipcref_view *v, int ndim,
                                              const int64_t *shape,
                                              ipcref_view *out,
                                              const char *fn) {
  ipcref_view r = *v;
  ipcref_result res;
  res = ipcref__infer_shape(ndim, shape, ipcref__numel(v), r.shape, fn);
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

IPCREF_API ipcref_result ipcref_view_reshape(const ipcref_view *v, int ndim,
                                             const int64_t *shape,
                                             ipcref_view *out) {
  IPCREF__CHECK_IN(v, out);
  return ipcref__reshape(v, ndim, shape, out, __func__);
}

IPCREF_API ipcref_result ipcref_view_reshape_copy(const ipcref_view *v,
                                                  int ndim,
                                                  const int64_t *shape,
                                                  ipcref_view *out) {
  ipcref_view tmp;
  int64_t resolved[IPCREF_MAX_DIMS];
  ipcref_result res;
  IPCREF__CHECK_IN(v, out);
  res = ipcref__reshape(v, ndim, shape, out, __func__);
  if (res != IPCREF_ENEEDCOPY) return res;
  /* The shape was checked (ENEEDCOPY comes after): no copy is wasted. */
  res = ipcref__infer_shape(ndim, shape, ipcref__numel(v), resolved, __func__);
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
      return ipcref__invalid(__func__, "start_dim and end_dim must be 0 or "
                                       "-1 for a 0-d view");
    shape[0] = 1;
    return ipcref__reshape(v, 1, shape, out, __func__);
  }
  if (!ipcref__dim(start_dim, v->ndim, &s))
    return ipcref__bad_dim(__func__, "start_dim", start_dim, v->ndim);
  if (!ipcref__dim(end_dim, v->ndim, &e))
    return ipcref__bad_dim(__func__, "end_dim", end_dim, v->ndim);
  if (s > e) return ipcref__invalid(__func__, "start_dim is after end_dim");
  for (d = 0; d < s; d++) shape[n++] = v->shape[d];
  shape[n] = 1;
  for (d = s; d <= e; d++)
    if (__builtin_mul_overflow(shape[n], v->shape[d], &shape[n]))
      return IPCREF_ERANGE; /* the merged size cannot be represented */
  n++;
  for (d = e + 1; d < v->ndim; d++) shape[n++] = v->shape[d];
  return ipcref__reshape(v, n, shape, out, __func__);
}

/* EINVAL, with `what` in *why for the caller to tell. */
IPCREF__PRIVATE ipcref_result ipcref__why(const char **why, const char *what) {
  *why = what;
  return IPCREF_EINVAL;
}

/* `v` (checked) broadcast to `shape`, into *r (no reference taken). An
 * EINVAL says why in *why, for the caller to tell. */
IPCREF__PRIVATE ipcref_result ipcref__expand(const ipcref_view *v, int ndim,
                                             const int64_t *shape,
                                             ipcref_view *r, const char **why) {
  int64_t n = 1;
  int i, lead = ndim - v->ndim;
  if (ndim > IPCREF_MAX_DIMS) return IPCREF_ERANGE;
  if (ndim < v->ndim) return ipcref__why(why, "ndim is below the view's");
  if (ndim > 0 && !shape)
    return ipcref__why(why, "shape is NULL with ndim > 0");
  *r = *v;
  r->ndim = ndim;
  for (i = 0; i < ndim; i++) {
    int64_t want = shape[i];
    if (i < lead) { /* a new leading dim */
      if (want == -1)
        return ipcref__why(why, "-1 for a new leading dim (no size to keep)");
      if (want < 0) return IPCREF_ERANGE;
      r->shape[i] = want;
      r->strides[i] = 0;
    } else {
      int64_t have = v->shape[i - lead], st = v->strides[i - lead];
      if (want == -1 || want == have) {
        r->shape[i] = have;
        r->strides[i] = st;
      } else if (want < 0) {
        return IPCREF_ERANGE;
      } else if (have == 1) {
        r->shape[i] = want;
        r->strides[i] = 0;
      } else {
        return ipcref__why(why, "a dim of size other than 1 cannot grow");
      }
    }
  }
  /* The count (zero when any size is) and its bytes must fit. */
  for (i = 0; i < ndim; i++)
    if (r->shape[i] == 0) n = 0;
  for (i = 0; i < ndim && n != 0; i++)
    if (__builtin_mul_overflow(n, r->shape[i], &n)) return IPCREF_ERANGE;
  if (__builtin_mul_overflow(n, ipcref__item(v), &n)) return IPCREF_ERANGE;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_view_expand(const ipcref_view *v, int ndim,
                                            const int64_t *shape,
                                            ipcref_view *out) {
  ipcref_view r;
  ipcref_result res;
  const char *why;
  IPCREF__CHECK_IN(v, out);
  res = ipcref__expand(v, ndim, shape, &r, &why);
  if (res == IPCREF_EINVAL) return ipcref__invalid(__func__, why);
  if (res != IPCREF_OK) return res;
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
    if (!ipcref__dim(dim, v->ndim, &d))
      return ipcref__bad_dim(__func__, "dim", dim, v->ndim);
    if (v->shape[d] != 1)
      return ipcref__invalid(__func__, "the dim's size is not 1");
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
  if (!ipcref__dim(dim, v->ndim + 1, &d))
    return ipcref__bad_dim(__func__, "dim", dim, v->ndim);
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
  if (!ipcref__dim(dim, v->ndim, &d))
    return ipcref__bad_dim(__func__, "dim", dim, v->ndim);
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
  if (ndim > 0 && !shape)
    return ipcref__invalid(__func__, "shape is NULL with ndim > 0");
  if (ndim > 0 && !strides)
    return ipcref__invalid(__func__, "strides is NULL with ndim > 0");
  if (byte_offset % ipcref__item(v) != 0)
    return ipcref__invalid(__func__, "byte_offset is not a multiple of the "
                                     "dtype's size");
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

IPCREF_API const void *ipcref_view_data(const ipcref_view *v) {
  if (!ipcref__view_valid(v)) return NULL;
  return (const char *)v->buf->data + v->byte_offset;
}

/* ---- iteration ------------------------------------------------------- */

IPCREF_API ipcref_result ipcref_view_iter_init(const ipcref_view *v,
                                               ipcref_view_iter *it) {
  int d;
  if (!it) return ipcref__invalid(__func__, "it is NULL");
  if (!ipcref__view_valid(v)) return ipcref__view_invalid(v, __func__, "v");
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
  /* A dim that wraps goes back by (shape-1) strides, which the view
   * reaches; shape * stride (a step past the last index) may overflow
   * int64. */
  for (d = it->ndim - 1; d >= 0; d--) {
    if (++it->index[d] < it->shape[d]) {
      it->cur += it->byte_strides[d];
      break;
    }
    it->cur -= (it->shape[d] - 1) * it->byte_strides[d];
    it->index[d] = 0;
  }
  return it->cur;
}
