/* The view layer against a naive model. Each sequence makes a random base
 * (any of the 15 dtypes, 0 to 4 dims, sizes 0 to 6) filled with distinct
 * values, then applies a random chain of view operations both to an
 * ipcref_view and to a model: a shape, element strides and an element
 * offset into the buffer, with its own naive Python slicing, reshape (by
 * brute force over the element addresses), expand, and so on. After every
 * step every element address read through ipcref_view_ptr and the iterator
 * must be the model's, and numel, is_contiguous and data_mut must agree.
 * At the end of a chain contiguous() and copy() (into a fresh and into a
 * strided destination, and broadcast) must give the right values.
 *
 * IPCREF_TEST_OPS scales the work: ops/10 sequences (at least 200), so the
 * default 10^6 runs 10^5 sequences. Seeds are fixed; a failing sequence
 * prints its seed and the calls that led to the failure. Every allocation
 * goes through a counting allocator: nothing may be left alive. */
#define _GNU_SOURCE /* the sharing layer needs GNU declarations */
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"

#include "counting_alloc.h"
#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"

#define MAXD IPCREF_MAX_DIMS
#define CAP  4096 /* the most elements a view in a chain may have */

/* ------------------------------------------------------------------ rng */

static uint64_t rng_state;

static uint64_t rnd64(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* Uniform in [0, n); 0 when n <= 0. */
static int64_t rnd(int64_t n) {
  return n <= 0 ? 0 : (int64_t)(rnd64() % (uint64_t)n);
}
/* Uniform in [lo, hi]. */
static int64_t rnd_range(int64_t lo, int64_t hi) {
  return hi < lo ? lo : lo + rnd(hi - lo + 1);
}

/* ------------------------------------------------------------------ failures
 */

/* A failing check stops its sequence; the first few print their seed and
 * the calls made so far. */
static long failing_seqs;
static uint64_t cur_seed;
static const char *cur_test = "";
static char trace[16384];
static size_t trace_len;

static void tracef(const char *fmt, ...) {
  va_list ap;
  int n;
  if (trace_len >= sizeof trace - 1) return;
  va_start(ap, fmt);
  n = vsnprintf(trace + trace_len, sizeof trace - trace_len, fmt, ap);
  va_end(ap);
  if (n > 0) trace_len += (size_t)n;
  if (trace_len > sizeof trace - 1) trace_len = sizeof trace - 1;
}

static void model_fail(int line, const char *what) {
  failing_seqs++;
  if (failing_seqs <= 12) {
    printf("    %s seed %llu: line %d: %s failed\n", cur_test,
           (unsigned long long)cur_seed, line, what);
    printf("      after: %s\n", trace_len ? trace : "(nothing)");
  }
}

#define MCHECK(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      model_fail(__LINE__, #cond);                                             \
      return 0;                                                                \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------------ the model
 */

static const size_t elem_sizes[IPCREF_DTYPE_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4,
                                                      8, 2, 2, 4, 8, 8, 16};

static long ops_done, needcopy_seen, copies_seen; /* for the summary */
static ipcref_dtype g_dt; /* the dtype of the current sequence */
static int64_t es;        /* its size */

typedef struct model {
  ipcref_buf *buf; /* the buffer the view must hold */
  char *data;      /* its data */
  int64_t nbuf;    /* elements in it */
  int ndim;
  int64_t shape[MAXD];
  int64_t stride[MAXD]; /* elements */
  int64_t off;          /* element offset of (0,...,0) */
} model;

static int64_t shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  int d;
  for (d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static int64_t m_numel(const model *m) {
  return shape_numel(m->ndim, m->shape);
}

/* C-contiguous, size-1 dims ignored, empty counts as contiguous. */
static int m_contig(const model *m) {
  int64_t want = 1;
  int d;
  if (m_numel(m) == 0) return 1;
  for (d = m->ndim - 1; d >= 0; d--) {
    if (m->shape[d] == 1) continue;
    if (m->stride[d] != want) return 0;
    want *= m->shape[d];
  }
  return 1;
}

static int64_t m_addr(const model *m, const int64_t *idx) {
  int64_t a = m->off;
  int d;
  for (d = 0; d < m->ndim; d++) a += idx[d] * m->stride[d];
  return a;
}

/* The next index in C order; 0 after the last one. */
static int next_index(int ndim, const int64_t *shape, int64_t *idx) {
  int d;
  for (d = ndim - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return 1;
    idx[d] = 0;
  }
  return 0;
}

static void c_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  int d;
  for (d = ndim - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d] > 0 ? shape[d] : 1;
  }
}

/* The element offsets of the model's elements in C order; returns count. */
static int64_t m_addrs(const model *m, int64_t *out) {
  int64_t idx[MAXD], n = 0;
  if (m_numel(m) == 0) return 0;
  memset(idx, 0, sizeof idx);
  do out[n++] = m_addr(m, idx);
  while (next_index(m->ndim, m->shape, idx));
  return n;
}

/* The element values in C order, copied out. */
static int64_t m_values(const model *m, unsigned char *out) {
  static int64_t a[CAP];
  int64_t n = m_addrs(m, a), k;
  for (k = 0; k < n; k++) memcpy(out + k * es, m->data + a[k] * es, (size_t)es);
  return n;
}

/* The value stored at base element k: distinct for every k the widest
 * types can tell apart. */
static void fill_value(int64_t k, unsigned char *out) {
  uint64_t v = (uint64_t)k * 0x0101010101010101ull + 0x5A + (uint64_t)k;
  int64_t b;
  for (b = 0; b < es; b++)
    out[b] = (unsigned char)(v >> (8 * (b % 8))) ^ (b >= 8 ? 0xff : 0);
  out[0] = (unsigned char)(k + 1);
  if (es >= 2) out[1] = (unsigned char)((k + 1) >> 8);
}

/* The model of a fresh C-contiguous view. */
static void model_of_view(model *m, const ipcref_view *v) {
  memset(m, 0, sizeof *m);
  m->buf = v->buf;
  m->data = (char *)ipcref_buf_data(v->buf);
  m->nbuf = (int64_t)(ipcref_buf_size(v->buf) / (size_t)es);
  m->ndim = v->ndim;
  memcpy(m->shape, v->shape, sizeof m->shape);
  c_strides(m->ndim, m->shape, m->stride);
  m->off = v->byte_offset / es;
}

/* ------------------------------------------------------------------ checking a
 * view */

static int check_view(const ipcref_view *v, const model *m) {
  int64_t idx[MAXD], n = m_numel(m), a;
  ipcref_view_iter it;
  char *want;
  void *p;
  int d;
  MCHECK(v->buf == m->buf);
  MCHECK(v->dtype == g_dt);
  MCHECK(v->ndim == m->ndim);
  for (d = 0; d < m->ndim; d++) MCHECK(v->shape[d] == m->shape[d]);
  MCHECK(ipcref_view_numel(v) == n);
  MCHECK(ipcref_view_is_contiguous(v) == m_contig(m));
  memset(&it, 0, sizeof it);
  MCHECK(ipcref_view_iter_init(v, &it) == IPCREF_OK);
  memset(idx, 0, sizeof idx);
  if (n > 0) {
    do {
      a = m_addr(m, idx);
      MCHECK(a >= 0 && a < m->nbuf); /* the model itself stays inside */
      want = m->data + a * es;
      MCHECK(ipcref_view_ptr(v, idx) == want);
      MCHECK(ipcref_view_iter_next(&it) == want);
    } while (next_index(m->ndim, m->shape, idx));
  }
  MCHECK(ipcref_view_iter_next(&it) == NULL);
  MCHECK(ipcref_view_iter_next(&it) == NULL); /* stays done */
  if (m->ndim > 0) {
    /* Out of range in one dim: NULL. */
    d = (int)rnd(m->ndim);
    memset(idx, 0, sizeof idx);
    idx[d] = m->shape[d];
    MCHECK(ipcref_view_ptr(v, idx) == NULL);
    idx[d] = -1;
    MCHECK(ipcref_view_ptr(v, idx) == NULL);
    idx[d] = INT64_MIN;
    MCHECK(ipcref_view_ptr(v, idx) == NULL);
    idx[d] = INT64_MAX;
    MCHECK(ipcref_view_ptr(v, idx) == NULL);
  }
  if (n > 0) {
    memset(idx, 0, sizeof idx);
    p = ipcref_view_data_mut(v);
    if (ipcref_buf_strong_count(v->buf) == 1)
      MCHECK(p == m->data + m_addr(m, idx) * es);
    else
      MCHECK(p == NULL);
  }
  return 1;
}

/* Values of a view read through ipcref_view_ptr, against `want` (C order). */
static int check_values(const ipcref_view *v, const unsigned char *want) {
  int64_t idx[MAXD], k = 0;
  const char *p;
  if (ipcref_view_numel(v) == 0) return 1;
  memset(idx, 0, sizeof idx);
  do {
    p = (const char *)ipcref_view_ptr(v, idx);
    MCHECK(p != NULL);
    MCHECK(memcmp(p, want + k * es, (size_t)es) == 0);
    k++;
  } while (next_index(v->ndim, v->shape, idx));
  return 1;
}

/* ------------------------------------------------------------------ calling
 * with `out` */

/* Every op writes either into the input itself (in place) or into a
 * scratch struct full of garbage ("overwritten as if uninitialized"). On
 * error both must be left byte-identical and the count unchanged. */
typedef struct outctx {
  int inplace;
  ipcref_view tmp, before, garbage;
  size_t count;
  ipcref_view *out;
} outctx;

static void out_begin(outctx *o, ipcref_view *cur) {
  o->inplace = (int)rnd(2);
  memset(&o->garbage, 0xA5, sizeof o->garbage);
  o->tmp = o->garbage;
  o->before = *cur;
  o->count = ipcref_buf_strong_count(cur->buf);
  o->out = o->inplace ? cur : &o->tmp;
}

static int out_unchanged(const outctx *o, const ipcref_view *cur) {
  MCHECK(memcmp(cur, &o->before, sizeof *cur) == 0);
  MCHECK(memcmp(&o->tmp, &o->garbage, sizeof o->tmp) == 0);
  MCHECK(ipcref_buf_strong_count(cur->buf) == o->count);
  return 1;
}

/* After a successful call: the result becomes `cur`. When the result views
 * the same buffer, the count went up by one unless in place. */
static int out_take(outctx *o, ipcref_view *cur, int same_buf) {
  if (!o->inplace) {
    MCHECK(memcmp(cur, &o->before, sizeof *cur) == 0); /* input untouched */
    if (same_buf) {
      MCHECK(o->tmp.buf == cur->buf);
      MCHECK(ipcref_buf_strong_count(cur->buf) == o->count + 1);
    }
    ipcref_view_release(cur);
    *cur = o->tmp;
  } else if (same_buf) {
    MCHECK(ipcref_buf_strong_count(cur->buf) == o->count);
  }
  return 1;
}

/* A result that must be a copy in a new contiguous buffer holding `vals`:
 * the model moves to that buffer. */
static int adopt_copy(const ipcref_view *v, model *m, ipcref_buf *old,
                      const unsigned char *vals) {
  copies_seen++;
  MCHECK(v->buf != NULL && v->buf != old);
  MCHECK(ipcref_buf_strong_count(v->buf) == 1);
  MCHECK(v->byte_offset >= 0 && v->byte_offset % es == 0);
  MCHECK(ipcref_view_is_contiguous(v));
  m->buf = v->buf;
  m->data = (char *)ipcref_buf_data(v->buf);
  m->nbuf = (int64_t)(ipcref_buf_size(v->buf) / (size_t)es);
  m->off = v->byte_offset / es;
  c_strides(m->ndim, m->shape, m->stride);
  MCHECK(m->off + m_numel(m) <= m->nbuf);
  return check_values(v, vals);
}

/* ------------------------------------------------------------------ argument
 * pickers */

/* A dim argument for dim d of an ndim view: d or its negative form. */
static int dim_arg(int d, int ndim) {
  return rnd(2) ? d : d - ndim;
}

static int64_t pick_bound(int64_t len) {
  switch (rnd(12)) {
  case 0: return IPCREF_SLICE_MIN;
  case 1: return IPCREF_SLICE_MAX;
  case 2: return INT64_MIN + (int64_t)rnd(3);
  case 3: return INT64_MAX - (int64_t)rnd(3);
  default: return rnd_range(-len - 2, len + 2);
  }
}

static int64_t pick_step(void) {
  switch (rnd(24)) {
  case 0: return INT64_MAX;
  case 1: return INT64_MIN;
  case 2: return INT64_MIN + 1;
  case 3: return rnd(2) ? 1000 : -1000;
  default: return rnd(2) ? rnd_range(1, 3) : -rnd_range(1, 3);
  }
}

/* Python's slice.indices(len) and the length it gives. */
static void py_slice(int64_t len, int64_t step, int64_t *start, int64_t *stop,
                     int64_t *n) {
  int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1;
  uint64_t ustep;
  if (*start < 0) {
    *start += len;
    if (*start < lower) *start = lower;
  } else if (*start > upper) {
    *start = upper;
  }
  if (*stop < 0) {
    *stop += len;
    if (*stop < lower) *stop = lower;
  } else if (*stop > upper) {
    *stop = upper;
  }
  if (step > 0) {
    ustep = (uint64_t)step;
    *n = *start < *stop ? (int64_t)((uint64_t)(*stop - *start - 1) / ustep) + 1
                        : 0;
  } else {
    ustep = (uint64_t)0 - (uint64_t)step;
    *n = *stop < *start ? (int64_t)((uint64_t)(*start - *stop - 1) / ustep) + 1
                        : 0;
  }
}

/* Can the elements at C-order addresses `a[0..n)` be seen with `shape`
 * through some strides? If so, the strides and offset. Brute force: the
 * strides are fixed by the unit steps, then every address is checked. */
static int reshape_strides(const int64_t *a, int64_t n, int ndim,
                           const int64_t *shape, int64_t *strides,
                           int64_t *off) {
  int64_t unit = 1, idx[MAXD], k = 0, addr;
  int d;
  if (n == 0) {
    c_strides(ndim, shape, strides);
    *off = 0;
    return 1;
  }
  for (d = ndim - 1; d >= 0; d--) {
    strides[d] = shape[d] > 1 ? a[unit] - a[0] : 0;
    unit *= shape[d];
  }
  *off = a[0];
  memset(idx, 0, sizeof idx);
  do {
    addr = a[0];
    for (d = 0; d < ndim; d++) addr += idx[d] * strides[d];
    if (addr != a[k++]) return 0;
  } while (next_index(ndim, shape, idx));
  return 1;
}

/* A random shape with `n` elements (n > 0) of 0 to 5 dims. */
static int gen_shape(int64_t n, int64_t *shape) {
  int nd = (int)rnd(6), d;
  int64_t rem = n, div;
  if (n == 0) {
    nd = 1 + (int)rnd(4);
    for (d = 0; d < nd; d++) shape[d] = rnd(4);
    shape[rnd(nd)] = 0;
    return nd;
  }
  if (n > 1 && nd == 0) nd = 1;
  for (d = 0; d < nd - 1; d++) {
    int64_t divs[64], ndivs = 0, i;
    for (i = 1; i * i <= rem && ndivs < 62; i++)
      if (rem % i == 0) {
        divs[ndivs++] = i;
        divs[ndivs++] = rem / i;
      }
    div = rnd(3) == 0 ? 1 : divs[rnd(ndivs)];
    shape[d] = div;
    rem /= div;
  }
  if (nd > 0) shape[nd - 1] = rem;
  /* Move the big remainder somewhere random. */
  if (nd > 1) {
    int j = (int)rnd(nd);
    int64_t t = shape[j];
    shape[j] = shape[nd - 1];
    shape[nd - 1] = t;
  }
  return nd;
}

/* ------------------------------------------------------------------ the ops */

enum {
  OP_SLICE,
  OP_SELECT,
  OP_NARROW,
  OP_PERMUTE,
  OP_TRANSPOSE,
  OP_RESHAPE,
  OP_RESHAPE_COPY,
  OP_FLATTEN,
  OP_EXPAND,
  OP_SQUEEZE,
  OP_UNSQUEEZE,
  OP_FLIP,
  OP_AS_STRIDED,
  OP_CLONE,
  OP_CONTIGUOUS,
  OP_MAKE_MUT,
  OP_COUNT
};

static unsigned char snap[CAP * 16];
static int64_t addrs[CAP];

static int op_slice(ipcref_view *cur, model *m) {
  outctx o;
  int d, dim;
  int64_t len, start, stop, step, s, e, n;
  ipcref_result rc;
  if (m->ndim == 0) {
    out_begin(&o, cur);
    tracef("slice(0-d) ");
    rc = ipcref_view_slice(cur, 0, 0, 1, 1, o.out);
    MCHECK(rc == IPCREF_EINVAL);
    return out_unchanged(&o, cur);
  }
  d = (int)rnd(m->ndim);
  dim = dim_arg(d, m->ndim);
  len = m->shape[d];
  start = pick_bound(len);
  stop = pick_bound(len);
  step = rnd(40) == 0 ? 0 : pick_step();
  out_begin(&o, cur);
  tracef("slice(%d, %lld, %lld, %lld)%s ", dim, (long long)start,
         (long long)stop, (long long)step, o.inplace ? "=" : "");
  rc = ipcref_view_slice(cur, dim, start, stop, step, o.out);
  if (step == 0) {
    MCHECK(rc == IPCREF_EINVAL);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  s = start;
  e = stop;
  py_slice(len, step, &s, &e, &n);
  if (n > 0) m->off += s * m->stride[d];
  m->stride[d] = n > 1 ? m->stride[d] * step : 0;
  m->shape[d] = n;
  return 1;
}

static void drop_dim(model *m, int d) {
  int k;
  for (k = d; k < m->ndim - 1; k++) {
    m->shape[k] = m->shape[k + 1];
    m->stride[k] = m->stride[k + 1];
  }
  m->ndim--;
}

static int op_select(ipcref_view *cur, model *m) {
  outctx o;
  int d, dim, bad;
  int64_t len, index;
  ipcref_result rc;
  if (m->ndim == 0) {
    out_begin(&o, cur);
    tracef("select(0-d) ");
    rc = ipcref_view_select(cur, 0, 0, o.out);
    MCHECK(rc == IPCREF_EINVAL);
    return out_unchanged(&o, cur);
  }
  d = (int)rnd(m->ndim);
  dim = dim_arg(d, m->ndim);
  len = m->shape[d];
  bad = len == 0 || rnd(20) == 0;
  if (bad) {
    switch (rnd(4)) {
    case 0: index = len; break;
    case 1: index = -len - 1; break;
    case 2: index = INT64_MIN; break;
    default: index = INT64_MAX; break;
    }
  } else {
    index = rnd(len);
  }
  if (!bad && rnd(2)) index -= len;
  out_begin(&o, cur);
  tracef("select(%d, %lld)%s ", dim, (long long)index, o.inplace ? "=" : "");
  rc = ipcref_view_select(cur, dim, index, o.out);
  if (bad) {
    MCHECK(rc == IPCREF_ERANGE);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  if (index < 0) index += len;
  m->off += index * m->stride[d];
  drop_dim(m, d);
  return 1;
}

static int op_narrow(ipcref_view *cur, model *m) {
  outctx o;
  int d, dim, bad = 0;
  int64_t len, start, length, sarg;
  ipcref_result rc;
  if (m->ndim == 0) return 1;
  d = (int)rnd(m->ndim);
  dim = dim_arg(d, m->ndim);
  len = m->shape[d];
  start = rnd_range(0, len);
  length = rnd_range(0, len - start);
  sarg = start < len && rnd(2) ? start - len : start;
  if (rnd(20) == 0) {
    bad = 1;
    switch (rnd(4)) {
    case 0: length = len - start + 1; break;
    case 1: length = -1; break;
    case 2: sarg = -len - 1; break;
    default:
      sarg = INT64_MAX;
      length = INT64_MAX;
      break;
    }
  }
  out_begin(&o, cur);
  tracef("narrow(%d, %lld, %lld)%s ", dim, (long long)sarg, (long long)length,
         o.inplace ? "=" : "");
  rc = ipcref_view_narrow(cur, dim, sarg, length, o.out);
  if (bad) {
    MCHECK(rc == IPCREF_ERANGE);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  if (length > 0) m->off += start * m->stride[d];
  m->shape[d] = length;
  return 1;
}

static int op_permute(ipcref_view *cur, model *m) {
  outctx o;
  int perm[MAXD + 1], arg[MAXD + 1], d, j, t;
  int64_t shape[MAXD], stride[MAXD];
  ipcref_result rc;
  for (d = 0; d < m->ndim; d++) perm[d] = d;
  for (d = m->ndim - 1; d > 0; d--) {
    j = (int)rnd(d + 1);
    t = perm[d];
    perm[d] = perm[j];
    perm[j] = t;
  }
  for (d = 0; d < m->ndim; d++) arg[d] = dim_arg(perm[d], m->ndim);
  out_begin(&o, cur);
  tracef("permute(");
  for (d = 0; d < m->ndim; d++) tracef("%d,", arg[d]);
  tracef(")%s ", o.inplace ? "=" : "");
  rc = ipcref_view_permute(cur, arg, o.out);
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  for (d = 0; d < m->ndim; d++) {
    shape[d] = m->shape[perm[d]];
    stride[d] = m->stride[perm[d]];
  }
  memcpy(m->shape, shape, sizeof shape);
  memcpy(m->stride, stride, sizeof stride);
  return 1;
}

static int op_transpose(ipcref_view *cur, model *m) {
  outctx o;
  int d0, d1;
  int64_t t;
  ipcref_result rc;
  if (m->ndim == 0) return 1;
  d0 = (int)rnd(m->ndim);
  d1 = (int)rnd(m->ndim);
  out_begin(&o, cur);
  tracef("transpose(%d, %d)%s ", d0, d1, o.inplace ? "=" : "");
  rc = ipcref_view_transpose(cur, dim_arg(d0, m->ndim), dim_arg(d1, m->ndim),
                             o.out);
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  t = m->shape[d0], m->shape[d0] = m->shape[d1], m->shape[d1] = t;
  t = m->stride[d0], m->stride[d0] = m->stride[d1], m->stride[d1] = t;
  return 1;
}

/* reshape, reshape_copy and flatten: `kind` is the op. */
static int op_reshape(ipcref_view *cur, model *m, int kind) {
  outctx o;
  int nd, d, s = 0, e = 0, sarg = 0, earg = 0, possible, wrong = 0;
  int64_t shape[MAXD], arg[MAXD], strides[MAXD], off, n = m_numel(m);
  ipcref_result rc;
  ipcref_buf *old = cur->buf;
  m_addrs(m, addrs);
  if (kind == OP_FLATTEN) {
    if (m->ndim == 0) {
      nd = 1;
      shape[0] = 1;
      sarg = 0;
      earg = -1;
    } else {
      s = (int)rnd(m->ndim);
      e = (int)rnd_range(s, m->ndim - 1);
      sarg = dim_arg(s, m->ndim);
      earg = dim_arg(e, m->ndim);
      nd = 0;
      for (d = 0; d < s; d++) shape[nd++] = m->shape[d];
      shape[nd] = 1;
      for (d = s; d <= e; d++) shape[nd] *= m->shape[d];
      nd++;
      for (d = e + 1; d < m->ndim; d++) shape[nd++] = m->shape[d];
    }
  } else {
    nd = gen_shape(n, shape);
    memcpy(arg, shape, sizeof arg);
    if (n > 0 && nd > 0 && rnd(15) == 0) {
      arg[rnd(nd)] += 1; /* now the count differs */
      wrong = 1;
    } else if (n > 0 && nd > 0 && rnd(3) == 0) {
      arg[rnd(nd)] = -1;
    }
  }
  possible = reshape_strides(addrs, n, nd, shape, strides, &off);
  m_values(m, snap);
  out_begin(&o, cur);
  if (kind == OP_FLATTEN) {
    tracef("flatten(%d, %d)%s ", sarg, earg, o.inplace ? "=" : "");
    rc = ipcref_view_flatten(cur, sarg, earg, o.out);
  } else {
    tracef("%s(", kind == OP_RESHAPE ? "reshape" : "reshape_copy");
    for (d = 0; d < nd; d++) tracef("%lld,", (long long)arg[d]);
    tracef(")%s ", o.inplace ? "=" : "");
    if (kind == OP_RESHAPE)
      rc = ipcref_view_reshape(cur, nd, arg, o.out);
    else
      rc = ipcref_view_reshape_copy(cur, nd, arg, o.out);
  }
  if (wrong) {
    MCHECK(rc == IPCREF_EINVAL || rc == IPCREF_ERANGE);
    return out_unchanged(&o, cur);
  }
  if (!possible) needcopy_seen++;
  if (!possible && kind != OP_RESHAPE_COPY) {
    MCHECK(rc == IPCREF_ENEEDCOPY);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, possible)) return 0;
  m->ndim = nd;
  memcpy(m->shape, shape, sizeof shape);
  if (possible) {
    memcpy(m->stride, strides, sizeof strides);
    m->off = off;
    MCHECK(cur->buf == old);
    return 1;
  }
  return adopt_copy(cur, m, old, snap);
}

static int op_expand(ipcref_view *cur, model *m) {
  outctx o;
  int nd, lead, d, bad = 0;
  int64_t arg[MAXD], shape[MAXD], stride[MAXD], numel;
  ipcref_result rc;
  nd = m->ndim + (int)rnd(3);
  if (nd > MAXD) nd = MAXD;
  lead = nd - m->ndim;
  for (d = 0; d < lead; d++) {
    shape[d] = rnd(30) == 0 ? 0 : rnd_range(1, 3);
    stride[d] = 0;
    arg[d] = shape[d];
  }
  for (d = 0; d < m->ndim; d++) {
    int64_t sz = m->shape[d];
    shape[lead + d] = sz;
    stride[lead + d] = m->stride[d];
    arg[lead + d] = rnd(2) ? -1 : sz;
    if (sz == 1 && rnd(2)) {
      shape[lead + d] = rnd_range(1, 4);
      arg[lead + d] = shape[lead + d];
      if (shape[lead + d] != 1) stride[lead + d] = 0;
    }
  }
  numel = shape_numel(nd, shape);
  if (numel > 2048) return 1;
  if (m->ndim > 0 && rnd(25) == 0) {
    /* A dim whose size is not 1 cannot change. */
    d = (int)rnd(m->ndim);
    if (m->shape[d] != 1) {
      arg[lead + d] = m->shape[d] + 1;
      bad = 1;
    }
  }
  out_begin(&o, cur);
  tracef("expand(");
  for (d = 0; d < nd; d++) tracef("%lld,", (long long)arg[d]);
  tracef(")%s ", o.inplace ? "=" : "");
  rc = ipcref_view_expand(cur, nd, arg, o.out);
  if (bad) {
    MCHECK(rc == IPCREF_EINVAL);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  m->ndim = nd;
  memcpy(m->shape, shape, sizeof shape);
  memcpy(m->stride, stride, sizeof stride);
  return 1;
}

static int op_squeeze(ipcref_view *cur, model *m) {
  outctx o;
  int ones[MAXD], nones = 0, d, dim, bad = 0;
  ipcref_result rc;
  for (d = 0; d < m->ndim; d++)
    if (m->shape[d] == 1) ones[nones++] = d;
  if (nones == 0 || rnd(3) == 0) {
    dim = IPCREF_DIM_ALL;
    d = -1;
  } else {
    d = ones[rnd(nones)];
    dim = dim_arg(d, m->ndim);
  }
  if (m->ndim > 0 && rnd(20) == 0) {
    int k = (int)rnd(m->ndim);
    if (m->shape[k] != 1) {
      d = k;
      dim = dim_arg(k, m->ndim);
      bad = 1;
    }
  }
  out_begin(&o, cur);
  tracef("squeeze(%d)%s ", dim, o.inplace ? "=" : "");
  rc = ipcref_view_squeeze(cur, dim, o.out);
  if (bad) {
    MCHECK(rc == IPCREF_EINVAL);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  if (dim == IPCREF_DIM_ALL) {
    for (d = m->ndim - 1; d >= 0; d--)
      if (m->shape[d] == 1) drop_dim(m, d);
  } else {
    drop_dim(m, d);
  }
  return 1;
}

static int op_unsqueeze(ipcref_view *cur, model *m) {
  outctx o;
  int d, dim, k, full = m->ndim == MAXD;
  ipcref_result rc;
  d = (int)rnd(m->ndim + 1);
  dim = rnd(2) ? d : d - (m->ndim + 1);
  out_begin(&o, cur);
  tracef("unsqueeze(%d)%s ", dim, o.inplace ? "=" : "");
  rc = ipcref_view_unsqueeze(cur, dim, o.out);
  if (full) {
    MCHECK(rc == IPCREF_ERANGE);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  for (k = m->ndim; k > d; k--) {
    m->shape[k] = m->shape[k - 1];
    m->stride[k] = m->stride[k - 1];
  }
  m->shape[d] = 1;
  m->stride[d] = 0;
  m->ndim++;
  return 1;
}

static int op_flip(ipcref_view *cur, model *m) {
  outctx o;
  int d, dim;
  ipcref_result rc;
  if (m->ndim == 0) return 1;
  d = (int)rnd(m->ndim);
  dim = dim_arg(d, m->ndim);
  out_begin(&o, cur);
  tracef("flip(%d)%s ", dim, o.inplace ? "=" : "");
  rc = ipcref_view_flip(cur, dim, o.out);
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  if (m->shape[d] > 0) m->off += (m->shape[d] - 1) * m->stride[d];
  m->stride[d] = -m->stride[d];
  return 1;
}

static int op_as_strided(ipcref_view *cur, model *m) {
  outctx o;
  int nd = (int)rnd(5), d, bad = 0;
  int64_t shape[MAXD], strides[MAXD], lo = 0, hi = 0, n, off, first, last;
  ipcref_result rc;
  for (d = 0; d < nd; d++) {
    shape[d] = rnd(25) == 0 ? 0 : rnd_range(1, 4);
    strides[d] = rnd(6) == 0 ? 0 : rnd_range(-5, 5);
    if (strides[d] < 0) lo += (shape[d] - 1) * strides[d];
    if (strides[d] > 0) hi += (shape[d] - 1) * strides[d];
  }
  n = shape_numel(nd, shape);
  if (n == 0) {
    if (m->nbuf == 0) return 1;
    first = 0;
    last = m->nbuf - 1;
  } else {
    first = -lo;
    last = m->nbuf - 1 - hi;
  }
  if (last < first) return 1;
  off = rnd_range(first, last);
  if (n > 0 && rnd(15) == 0) {
    bad = 1;
    off = rnd(2) ? first - 1 : last + 1;
  }
  out_begin(&o, cur);
  tracef("as_strided(");
  for (d = 0; d < nd; d++)
    tracef("%lld:%lld,", (long long)shape[d], (long long)strides[d]);
  tracef(" @%lld)%s ", (long long)(off * es), o.inplace ? "=" : "");
  rc = ipcref_view_as_strided(cur, nd, shape, strides, off * es, o.out);
  if (bad) {
    MCHECK(rc == IPCREF_ERANGE);
    return out_unchanged(&o, cur);
  }
  MCHECK(rc == IPCREF_OK);
  if (!out_take(&o, cur, 1)) return 0;
  m->ndim = nd;
  memcpy(m->shape, shape, sizeof shape);
  memcpy(m->stride, strides, sizeof strides);
  m->off = off;
  return 1;
}

static int op_clone(ipcref_view *cur, model *m) {
  ipcref_view c;
  size_t count = ipcref_buf_strong_count(cur->buf);
  memset(&c, 0xA5, sizeof c);
  tracef("clone ");
  MCHECK(ipcref_view_clone(cur, &c) == IPCREF_OK);
  MCHECK(ipcref_buf_strong_count(cur->buf) == count + 1);
  if (!check_view(&c, m)) {
    ipcref_view_release(&c);
    return 0;
  }
  /* Keep one of the two at random. */
  if (rnd(2)) {
    ipcref_view_release(cur);
    *cur = c;
  } else {
    ipcref_view_release(&c);
  }
  MCHECK(ipcref_buf_strong_count(cur->buf) == count);
  return 1;
}

static int op_contiguous(ipcref_view *cur, model *m) {
  outctx o;
  int contig = m_contig(m);
  ipcref_buf *old = cur->buf;
  m_values(m, snap);
  out_begin(&o, cur);
  tracef("contiguous%s ", o.inplace ? "=" : "");
  MCHECK(ipcref_view_contiguous(cur, o.out) == IPCREF_OK);
  if (!out_take(&o, cur, contig)) return 0;
  if (contig) {
    MCHECK(cur->buf == old);
    return 1;
  }
  return adopt_copy(cur, m, old, snap);
}

static int op_make_mut(ipcref_view *cur, model *m) {
  ipcref_view before = *cur;
  size_t count = ipcref_buf_strong_count(cur->buf);
  ipcref_buf *old = cur->buf;
  long allocs = total_allocs;
  m_values(m, snap);
  tracef("make_mut ");
  MCHECK(ipcref_view_make_mut(cur) == IPCREF_OK);
  if (count == 1) {
    /* Unique: nothing happens at all. */
    MCHECK(memcmp(cur, &before, sizeof before) == 0);
    MCHECK(total_allocs == allocs);
    return 1;
  }
  MCHECK(ipcref_buf_strong_count(old) == count - 1);
  if (!adopt_copy(cur, m, old, snap)) return 0;
  MCHECK(m_numel(m) == 0 || ipcref_view_data_mut(cur) != NULL);
  return 1;
}

static int do_op(int op, ipcref_view *cur, model *m) {
  switch (op) {
  case OP_SLICE: return op_slice(cur, m);
  case OP_SELECT: return op_select(cur, m);
  case OP_NARROW: return op_narrow(cur, m);
  case OP_PERMUTE: return op_permute(cur, m);
  case OP_TRANSPOSE: return op_transpose(cur, m);
  case OP_RESHAPE:
  case OP_RESHAPE_COPY:
  case OP_FLATTEN: return op_reshape(cur, m, op);
  case OP_EXPAND: return op_expand(cur, m);
  case OP_SQUEEZE: return op_squeeze(cur, m);
  case OP_UNSQUEEZE: return op_unsqueeze(cur, m);
  case OP_FLIP: return op_flip(cur, m);
  case OP_AS_STRIDED: return op_as_strided(cur, m);
  case OP_CLONE: return op_clone(cur, m);
  case OP_CONTIGUOUS: return op_contiguous(cur, m);
  default: return op_make_mut(cur, m);
  }
}

/* ------------------------------------------------------------------ end of a
 * chain */

/* Strides for a layout of `shape` where no two elements share an address:
 * a random dim order, random gaps and signs. Sets the offset of element 0
 * and the number of elements the layout spans. */
static void injective_layout(int nd, const int64_t *shape, int64_t *strides,
                             int64_t *off, int64_t *span) {
  int order[MAXD], d, j, t;
  int64_t s = 1 + rnd(2), lo = 0, hi = 0;
  for (d = 0; d < nd; d++) order[d] = d;
  for (d = nd - 1; d > 0; d--) {
    j = (int)rnd(d + 1);
    t = order[d], order[d] = order[j], order[j] = t;
  }
  for (j = nd - 1; j >= 0; j--) {
    d = order[j];
    strides[d] = rnd(3) == 0 ? -s : s;
    s = s * (shape[d] > 0 ? shape[d] : 1) + rnd(2);
  }
  for (d = 0; d < nd; d++) {
    if (shape[d] == 0) continue;
    if (strides[d] < 0)
      lo += (shape[d] - 1) * strides[d];
    else
      hi += (shape[d] - 1) * strides[d];
  }
  *off = -lo + rnd(2);
  *span = *off + hi + 1 + rnd(2);
}

static unsigned char vals[CAP * 16];

/* copy(cur) into a destination laid out by injective_layout; every element
 * lands where it should and nothing else in the buffer changes. */
static int check_copy_strided(const ipcref_view *cur, const model *m) {
  int64_t strides[MAXD], off, span, idx[MAXD], k = 0, a;
  ipcref_view d;
  model dm;
  unsigned char *data, *hit, *before_buf;
  int r = 1;
  injective_layout(m->ndim, m->shape, strides, &off, &span);
  MCHECK(ipcref_view_new(g_dt, 1, &span, &d) == IPCREF_OK);
  data = (unsigned char *)ipcref_view_data_mut(&d);
  if (!data) ipcref_view_release(&d);
  MCHECK(data != NULL);
  for (k = 0; k < span * es; k++) data[k] = (unsigned char)(0xC3 ^ k);
  hit = (unsigned char *)malloc((size_t)span);
  before_buf = (unsigned char *)malloc((size_t)(span * es));
  if (!hit || !before_buf) abort();
  memcpy(before_buf, data, (size_t)(span * es));
  tracef("| dst as_strided(");
  for (k = 0; k < m->ndim; k++)
    tracef("%lld:%lld,", (long long)m->shape[k], (long long)strides[k]);
  tracef(" @%lld of %lld) ", (long long)(off * es), (long long)span);
  if (ipcref_view_as_strided(&d, m->ndim, m->shape, strides, off * es, &d) !=
      IPCREF_OK) {
    ipcref_view_release(&d);
    free(hit);
    free(before_buf);
    MCHECK(!"as_strided for the strided destination");
  }
  if (ipcref_buf_strong_count(d.buf) != 1 ||
      ipcref_view_copy(&d, cur) != IPCREF_OK) {
    ipcref_view_release(&d);
    free(hit);
    free(before_buf);
    MCHECK(!"copy into a strided destination");
  }
  dm.buf = d.buf;
  dm.data = (char *)data;
  dm.nbuf = span;
  dm.ndim = m->ndim;
  memcpy(dm.shape, m->shape, sizeof dm.shape);
  memcpy(dm.stride, strides, sizeof dm.stride);
  dm.off = off;
  memset(hit, 0, (size_t)span);
  k = 0;
  memset(idx, 0, sizeof idx);
  if (m_numel(m) > 0) {
    do {
      a = m_addr(&dm, idx);
      hit[a] = 1;
      if (memcmp(data + a * es, vals + k * es, (size_t)es) != 0) r = 0;
      if (ipcref_view_ptr(&d, idx) != data + a * es) r = 0;
      k++;
    } while (next_index(m->ndim, m->shape, idx));
  }
  for (a = 0; a < span; a++)
    if (!hit[a] && memcmp(data + a * es, before_buf + a * es, (size_t)es) != 0)
      r = 0;
  ipcref_view_release(&d);
  free(hit);
  free(before_buf);
  MCHECK(r);
  return 1;
}

static int final_checks(ipcref_view *cur, model *m) {
  ipcref_view c, d;
  int64_t n = m_numel(m), shape[MAXD], k;
  int contig = m_contig(m), d0, broadcast = 0, r;
  size_t count = ipcref_buf_strong_count(cur->buf);
  m_values(m, vals);

  /* contiguous(): a view of the same storage when already contiguous. */
  memset(&c, 0xA5, sizeof c);
  MCHECK(ipcref_view_contiguous(cur, &c) == IPCREF_OK);
  r = ipcref_view_is_contiguous(&c) && check_values(&c, vals) &&
      (contig
           ? c.buf == cur->buf && ipcref_buf_strong_count(cur->buf) == count + 1
           : c.buf != cur->buf && ipcref_buf_strong_count(c.buf) == 1);
  ipcref_view_release(&c);
  MCHECK(r);
  MCHECK(ipcref_buf_strong_count(cur->buf) == count);

  /* copy() into a fresh C-contiguous destination. */
  memset(&d, 0xA5, sizeof d);
  MCHECK(ipcref_view_new(g_dt, m->ndim, m->shape, &d) == IPCREF_OK);
  r = ipcref_view_copy(&d, cur) == IPCREF_OK && check_values(&d, vals);
  /* A copy of a view onto itself changes nothing. */
  r = r && ipcref_view_copy(&d, &d) == IPCREF_OK && check_values(&d, vals);
  ipcref_view_release(&d);
  MCHECK(r);

  /* copy() broadcasting over a new leading dim. */
  if (m->ndim < MAXD && n * 3 <= CAP) {
    shape[0] = rnd_range(1, 3);
    memcpy(shape + 1, m->shape, sizeof(int64_t) * (size_t)m->ndim);
    MCHECK(ipcref_view_new(g_dt, m->ndim + 1, shape, &d) == IPCREF_OK);
    r = ipcref_view_copy(&d, cur) == IPCREF_OK;
    for (k = 0; r && k < shape[0]; k++) {
      ipcref_view s;
      memset(&s, 0, sizeof s);
      r = ipcref_view_select(&d, 0, k, &s) == IPCREF_OK &&
          check_values(&s, vals);
      ipcref_view_release(&s);
    }
    ipcref_view_release(&d);
    MCHECK(r);
  }

  /* copy() into a strided destination. */
  if (!check_copy_strided(cur, m)) return 0;

  /* Writing into a shared buffer is refused and changes nothing. */
  for (d0 = 0; d0 < m->ndim; d0++)
    if (m->shape[d0] > 1 && m->stride[d0] == 0) broadcast = 1;
  if (!broadcast && n > 0 && ipcref_buf_strong_count(cur->buf) > 1) {
    MCHECK(ipcref_view_new(g_dt, m->ndim, m->shape, &d) == IPCREF_OK);
    memset(ipcref_view_data_mut(&d), 0x3C, (size_t)(n * es));
    r = ipcref_view_copy(cur, &d) == IPCREF_EBUSY && check_values(cur, vals);
    ipcref_view_release(&d);
    MCHECK(r);
  }

  /* contiguous() in place. */
  if (!op_contiguous(cur, m)) return 0;
  MCHECK(check_values(cur, vals));
  return check_view(cur, m);
}

/* ------------------------------------------------------------------ a sequence
 */

static int run_sequence(uint64_t seed, ipcref_view *base, ipcref_view *cur) {
  model m;
  ipcref_view t;
  int64_t shape[MAXD], n, k;
  int ndim, d, nops, i;
  unsigned char *p, v[16];
  cur_seed = seed;
  rng_state = seed;
  trace_len = 0;
  trace[0] = 0;
  g_dt = (ipcref_dtype)rnd(IPCREF_DTYPE_COUNT);
  es = (int64_t)elem_sizes[g_dt];
  MCHECK(ipcref_dtype_size(g_dt) == (size_t)es);
  ndim = (int)rnd(5);
  for (d = 0; d < ndim; d++)
    shape[d] = rnd(12) == 0 ? 0 : rnd_range(1, ndim <= 2 ? 6 : 4);
  tracef("%s[", ipcref_dtype_name(g_dt));
  for (d = 0; d < ndim; d++) tracef("%lld,", (long long)shape[d]);
  tracef("] ");
  memset(&t, 0xA5, sizeof t);
  MCHECK(ipcref_view_new(g_dt, ndim, shape, &t) == IPCREF_OK);
  *base = t;
  MCHECK(base->byte_offset == 0 && base->ndim == ndim);
  n = shape_numel(ndim, shape);
  MCHECK(ipcref_buf_size(base->buf) >= (size_t)(n * es));
  MCHECK(((uintptr_t)ipcref_buf_data(base->buf) & 63) == 0);
  p = (unsigned char *)ipcref_view_data_mut(base);
  MCHECK(n == 0 || p == ipcref_buf_data(base->buf));
  for (k = 0; k < n; k++) fill_value(k, p + k * es);
  model_of_view(&m, base);
  if (!check_view(base, &m)) return 0;
  MCHECK(ipcref_view_clone(base, cur) == IPCREF_OK);

  nops = 1 + (int)rnd(12);
  for (i = 0; i < nops; i++) {
    ops_done++;
    if (!do_op((int)rnd(OP_COUNT), cur, &m)) return 0;
    if (!check_view(cur, &m)) return 0;
  }
  tracef("| end ");
  if (!final_checks(cur, &m)) return 0;

  /* Nothing ever wrote into the base. */
  for (k = 0; k < n; k++) {
    fill_value(k, v);
    MCHECK(memcmp(p + k * es, v, (size_t)es) == 0);
  }
  return 1;
}

static void test_model(void) {
  long ops = harness_env_long("IPCREF_TEST_OPS", 1000000);
  long nseq = ops / 10, s;
  ipcref_view base, cur, zero;
  cur_test = "model";
  if (nseq < 200) nseq = 200;
  failing_seqs = 0;
  memset(&zero, 0, sizeof zero);
  for (s = 0; s < nseq && failing_seqs < 50; s++) {
    memset(&base, 0, sizeof base);
    memset(&cur, 0, sizeof cur);
    run_sequence(0x1234567ull + (uint64_t)s * 7919u, &base, &cur);
    /* Release in a random order; released views are zeroed, and releasing
     * again is a no-op. */
    if (rnd(2)) {
      ipcref_view_release(&cur);
      ipcref_view_release(&base);
    } else {
      ipcref_view_release(&base);
      ipcref_view_release(&cur);
    }
    CHECK(memcmp(&cur, &zero, sizeof cur) == 0);
    CHECK(memcmp(&base, &zero, sizeof base) == 0);
    ipcref_view_release(&cur);
    ipcref_view_release(&base);
    if (live_allocs != 0) {
      CHECK_EQ(live_allocs, 0);
      printf("    leak after seed %llu: %s\n", (unsigned long long)cur_seed,
             trace);
      break;
    }
  }
  printf("    %ld sequences, %ld ops (%ld without a view, %ld copies), "
         "%ld failing\n",
         s, ops_done, needcopy_seen, copies_seen, failing_seqs);
  CHECK_EQ(failing_seqs, 0);
}

/* ------------------------------------------------------------------
 * overlapping copies */

static void fill_i32(ipcref_view *v, int64_t n) {
  int32_t *p = (int32_t *)ipcref_view_data_mut(v);
  int64_t k;
  for (k = 0; k < n; k++) p[k] = (int32_t)k;
}

static void test_copy_overlap_fixed(void) {
  ipcref_view a, dst, src;
  int64_t n = 10, k, sq[2] = {5, 5};
  int32_t *p, want[25];
  memset(&a, 0, sizeof a);
  memset(&dst, 0, sizeof dst);
  memset(&src, 0, sizeof src);
  CHECK_EQ(ipcref_view_new(IPCREF_I32, 1, &n, &a), IPCREF_OK);
  fill_i32(&a, n);
  p = (int32_t *)ipcref_buf_data(a.buf);

  /* a[1:] = a[:-1] on a shared buffer: refused until opened for shared
   * writes, and nothing changes. */
  CHECK_EQ(ipcref_view_slice(&a, 0, 1, IPCREF_SLICE_MAX, 1, &dst), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&a, 0, IPCREF_SLICE_MIN, -1, 1, &src), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&dst, &src), IPCREF_EBUSY);
  for (k = 0; k < n; k++) CHECK_EQ(p[k], k);
  ipcref_buf_set_shared_mut(a.buf, 1);
  CHECK_EQ(ipcref_view_copy(&dst, &src), IPCREF_OK);
  CHECK_EQ(p[0], 0);
  for (k = 1; k < n; k++) CHECK_EQ(p[k], k - 1);
  ipcref_view_release(&dst);
  ipcref_view_release(&src);

  /* a[:-1] = a[1:] */
  fill_i32(&a, n);
  CHECK_EQ(ipcref_view_slice(&a, 0, IPCREF_SLICE_MIN, -1, 1, &dst), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&a, 0, 1, IPCREF_SLICE_MAX, 1, &src), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&dst, &src), IPCREF_OK);
  for (k = 0; k < n - 1; k++) CHECK_EQ(p[k], k + 1);
  CHECK_EQ(p[n - 1], n - 1);
  ipcref_view_release(&dst);
  ipcref_view_release(&src);

  /* a = a[::-1] */
  fill_i32(&a, n);
  CHECK_EQ(
      ipcref_view_slice(&a, 0, IPCREF_SLICE_MAX, IPCREF_SLICE_MIN, -1, &src),
      IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&a, &src), IPCREF_OK);
  for (k = 0; k < n; k++) CHECK_EQ(p[k], n - 1 - k);
  ipcref_view_release(&src);

  /* a[::2] = a[3:8] (interleaved overlap) */
  fill_i32(&a, n);
  CHECK_EQ(ipcref_view_slice(&a, 0, 0, IPCREF_SLICE_MAX, 2, &dst), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&a, 0, 3, 8, 1, &src), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&dst, &src), IPCREF_OK);
  for (k = 0; k < n; k++) CHECK_EQ(p[k], k % 2 == 0 ? 3 + k / 2 : k);
  ipcref_view_release(&dst);
  ipcref_view_release(&src);

  /* Closing shared writes again: refused again. */
  ipcref_buf_set_shared_mut(a.buf, 0);
  CHECK_EQ(ipcref_view_slice(&a, 0, 1, IPCREF_SLICE_MAX, 1, &dst), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&a, 0, 0, -1, 1, &src), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&dst, &src), IPCREF_EBUSY);
  ipcref_view_release(&dst);
  ipcref_view_release(&src);
  ipcref_view_release(&a);

  /* A square transposed in place: a = a.T */
  CHECK_EQ(ipcref_view_new(IPCREF_I32, 2, sq, &a), IPCREF_OK);
  fill_i32(&a, 25);
  p = (int32_t *)ipcref_buf_data(a.buf);
  CHECK_EQ(ipcref_view_transpose(&a, 0, 1, &src), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&a, &src), IPCREF_EBUSY);
  ipcref_buf_set_shared_mut(a.buf, 1);
  CHECK_EQ(ipcref_view_copy(&a, &src), IPCREF_OK);
  for (k = 0; k < 25; k++) want[k] = (int32_t)((k % 5) * 5 + k / 5);
  CHECK(memcmp(p, want, sizeof want) == 0);
  /* And the transpose view now reads the original order. */
  for (k = 0; k < 25; k++) {
    int64_t idx[2] = {k / 5, k % 5};
    int32_t *q = (int32_t *)ipcref_view_ptr(&src, idx);
    CHECK(q != NULL && *q == k);
  }
  ipcref_view_release(&src);
  ipcref_view_release(&a);
  CHECK_EQ(live_allocs, 0);
}

/* Random overlapping pairs in one buffer open for shared writes: the
 * result is as if src was read completely first. */
static int overlap_case(uint64_t seed) {
  ipcref_view a, dst, src;
  int64_t nbuf = 64, shape[MAXD], dstr[MAXD], sstr[MAXD], doff, span, lo, hi;
  int64_t sshape[MAXD], idx[MAXD], n, k, soff, first, last;
  int nd, snd, d, r = 1;
  model dm, sm;
  unsigned char *p;
  static unsigned char old[64 * 16], want[64 * 16], sv[CAP * 16];
  cur_seed = seed;
  rng_state = seed;
  trace_len = 0;
  trace[0] = 0;
  g_dt = (ipcref_dtype)rnd(IPCREF_DTYPE_COUNT);
  es = (int64_t)elem_sizes[g_dt];
  memset(&a, 0, sizeof a);
  memset(&dst, 0, sizeof dst);
  memset(&src, 0, sizeof src);
  MCHECK(ipcref_view_new(g_dt, 1, &nbuf, &a) == IPCREF_OK);
  p = (unsigned char *)ipcref_view_data_mut(&a);
  for (k = 0; k < nbuf; k++) fill_value(k, p + k * es);
  ipcref_buf_set_shared_mut(a.buf, 1);

  /* dst: injective; src: anything of a shape that broadcasts to dst's. */
  do {
    nd = (int)rnd(4);
    for (d = 0; d < nd; d++) shape[d] = rnd_range(1, 4);
    injective_layout(nd, shape, dstr, &doff, &span);
  } while (span > nbuf);
  doff += rnd(nbuf - span + 1);
  snd = (int)rnd(nd + 1);
  lo = hi = 0;
  for (d = 0; d < snd; d++) {
    sshape[d] = rnd(3) == 0 ? 1 : shape[nd - snd + d];
    sstr[d] = rnd_range(-4, 4);
    if (sstr[d] < 0)
      lo += (sshape[d] - 1) * sstr[d];
    else
      hi += (sshape[d] - 1) * sstr[d];
  }
  first = -lo;
  last = nbuf - 1 - hi;
  if (last < first) {
    ipcref_view_release(&a);
    return 1;
  }
  soff = rnd_range(first, last);
  tracef("%s dst(", ipcref_dtype_name(g_dt));
  for (d = 0; d < nd; d++)
    tracef("%lld:%lld,", (long long)shape[d], (long long)dstr[d]);
  tracef(" @%lld) src(", (long long)doff);
  for (d = 0; d < snd; d++)
    tracef("%lld:%lld,", (long long)sshape[d], (long long)sstr[d]);
  tracef(" @%lld)", (long long)soff);
  r = ipcref_view_as_strided(&a, nd, shape, dstr, doff * es, &dst) ==
          IPCREF_OK &&
      ipcref_view_as_strided(&a, snd, sshape, sstr, soff * es, &src) ==
          IPCREF_OK;
  if (r) {
    memset(&dm, 0, sizeof dm);
    dm.data = (char *)p;
    dm.nbuf = nbuf;
    dm.ndim = nd;
    memcpy(dm.shape, shape, sizeof shape);
    memcpy(dm.stride, dstr, sizeof dstr);
    dm.off = doff;
    /* The expected values: src read first, broadcast to dst's shape. */
    memset(&sm, 0, sizeof sm);
    sm.data = (char *)p;
    sm.nbuf = nbuf;
    sm.ndim = nd;
    memcpy(sm.shape, shape, sizeof shape);
    for (d = 0; d < nd; d++) {
      int sd = d - (nd - snd);
      sm.stride[d] = sd < 0 || sshape[sd] == 1 ? 0 : sstr[sd];
    }
    sm.off = soff;
    n = m_values(&sm, sv);
    memcpy(old, p, (size_t)(nbuf * es));
    memcpy(want, p, (size_t)(nbuf * es));
    memset(idx, 0, sizeof idx);
    k = 0;
    if (n > 0) {
      do {
        memcpy(want + m_addr(&dm, idx) * es, sv + k * es, (size_t)es);
        k++;
      } while (next_index(nd, shape, idx));
    }
    r = ipcref_view_copy(&dst, &src) == IPCREF_OK &&
        memcmp(p, want, (size_t)(nbuf * es)) == 0;
  }
  ipcref_view_release(&dst);
  ipcref_view_release(&src);
  ipcref_view_release(&a);
  MCHECK(r);
  return 1;
}

static void test_copy_overlap_random(void) {
  long ops = harness_env_long("IPCREF_TEST_OPS", 1000000);
  long n = ops / 100, s;
  cur_test = "overlap";
  failing_seqs = 0;
  if (n < 200) n = 200;
  for (s = 0; s < n && failing_seqs < 20; s++)
    overlap_case(0xABCDEFull + (uint64_t)s * 104729u);
  printf("    %ld cases, %ld failing\n", s, failing_seqs);
  CHECK_EQ(failing_seqs, 0);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ the copy
 * engine's paths */

/* The chain above keeps views small; the copy engine has paths of its own
 * for big ones (row runs, tiles from 8x8, 4-byte transposes from 64x64 with
 * ragged edges, every-other-element gathers, streaming stores from 4 MB).
 * Each is checked here against element-by-element arithmetic. */

/* Element (r, c) of a (rows, cols) C-contiguous view filled by fill_value. */
static int check_transposed(const ipcref_view *t, const char *src, int64_t rows,
                            int64_t cols) {
  int64_t i, j, idx[2];
  const char *p;
  for (i = 0; i < cols; i++)
    for (j = 0; j < rows; j++) {
      idx[0] = i, idx[1] = j;
      p = (const char *)ipcref_view_ptr(t, idx);
      MCHECK(p != NULL);
      MCHECK(memcmp(p, src + (j * cols + i) * es, (size_t)es) == 0);
    }
  return 1;
}

static int copy_paths_case(ipcref_dtype dt, int64_t rows, int64_t cols) {
  ipcref_view a, t, c, d, f;
  int64_t shape[2] = {rows, cols}, k, pitch = rows + 3, n;
  int64_t dshape[2] = {cols, rows}, dstr[2] = {pitch, 1}, idx[2];
  char *src;
  int r = 1;
  g_dt = dt;
  es = (int64_t)elem_sizes[dt];
  cur_seed = 0;
  trace_len = 0;
  tracef("%s %lldx%lld", ipcref_dtype_name(dt), (long long)rows,
         (long long)cols);
  memset(&a, 0, sizeof a);
  memset(&t, 0, sizeof t);
  memset(&c, 0, sizeof c);
  memset(&d, 0, sizeof d);
  memset(&f, 0, sizeof f);
  MCHECK(ipcref_view_new(dt, 2, shape, &a) == IPCREF_OK);
  src = (char *)ipcref_view_data_mut(&a);
  for (k = 0; k < rows * cols; k++)
    fill_value(k, (unsigned char *)src + k * es);
  /* contiguous() of the transpose */
  r = ipcref_view_transpose(&a, 0, 1, &t) == IPCREF_OK &&
      ipcref_view_contiguous(&t, &c) == IPCREF_OK &&
      (c.buf != a.buf) == (rows > 1 && cols > 1) &&
      check_transposed(&c, src, rows, cols);
  /* copy() of the transpose into a destination with padded rows */
  n = (cols - 1) * pitch + rows;
  if (r) {
    r = ipcref_view_new(dt, 1, &n, &d) == IPCREF_OK &&
        ipcref_view_as_strided(&d, 2, dshape, dstr, 0, &d) == IPCREF_OK &&
        ipcref_view_copy(&d, &t) == IPCREF_OK &&
        check_transposed(&d, src, rows, cols);
  }
  /* contiguous() of the transpose flipped along both dims */
  if (r) {
    ipcref_view_release(&c);
    r = ipcref_view_flip(&t, 0, &f) == IPCREF_OK &&
        ipcref_view_flip(&f, 1, &f) == IPCREF_OK &&
        ipcref_view_contiguous(&f, &c) == IPCREF_OK;
    for (k = 0; r && k < rows * cols; k++) {
      int64_t i = k / rows, j = k % rows; /* c[i][j] = t[cols-1-i][rows-1-j] */
      idx[0] = i, idx[1] = j;
      r = memcmp(ipcref_view_ptr(&c, idx),
                 src + ((rows - 1 - j) * cols + (cols - 1 - i)) * es,
                 (size_t)es) == 0;
    }
  }
  ipcref_view_release(&a);
  ipcref_view_release(&t);
  ipcref_view_release(&c);
  ipcref_view_release(&d);
  ipcref_view_release(&f);
  MCHECK(r);
  return 1;
}

static void test_copy_paths(void) {
  static const ipcref_dtype dts[5] = {IPCREF_U8, IPCREF_BF16, IPCREF_F32,
                                      IPCREF_I64, IPCREF_C128};
  static const int64_t sizes[][2] = {{1, 300},  {300, 1},  {8, 8},
                                     {9, 33},   {200, 3},  {64, 64},
                                     {67, 130}, {130, 67}, {128, 192}};
  ipcref_view a, s, c;
  int64_t n = 1001, k, i, big[2] = {1024, 1100};
  float *p, *q;
  int di, si;
  cur_test = "copy paths";
  failing_seqs = 0;
  for (di = 0; di < 5; di++)
    for (si = 0; si < (int)(sizeof sizes / sizeof sizes[0]); si++)
      copy_paths_case(dts[di], sizes[si][0], sizes[si][1]);
  CHECK_EQ(failing_seqs, 0);

  /* Every other f32 element (a gather), from an even and an odd start;
   * the second size writes past 4 MB (streaming stores). */
  memset(&a, 0, sizeof a);
  memset(&s, 0, sizeof s);
  memset(&c, 0, sizeof c);
  for (i = 0; i < 4; i++) {
    if (i % 2 == 0) {
      ipcref_view_release(&a);
      n = i == 0 ? 1001 : 2 * 1048576 + 5;
      CHECK_EQ(ipcref_view_new(IPCREF_F32, 1, &n, &a), IPCREF_OK);
      p = (float *)ipcref_view_data_mut(&a);
      for (k = 0; k < n; k++) p[k] = (float)k;
    }
    CHECK_EQ(ipcref_view_slice(&a, 0, i % 2, IPCREF_SLICE_MAX, 2, &s),
             IPCREF_OK);
    CHECK_EQ(ipcref_view_contiguous(&s, &c), IPCREF_OK);
    q = (float *)ipcref_buf_data(c.buf);
    CHECK_EQ(c.shape[0], (n - i % 2 + 1) / 2);
    for (k = 0; k < c.shape[0]; k++)
      if (q[k] != (float)(i % 2 + 2 * k)) {
        CHECK(q[k] == (float)(i % 2 + 2 * k));
        break;
      }
    ipcref_view_release(&s);
    ipcref_view_release(&c);
  }
  ipcref_view_release(&a);

  /* A transpose past 4 MB: streaming stores. */
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 2, big, &a), IPCREF_OK);
  p = (float *)ipcref_view_data_mut(&a);
  for (k = 0; k < big[0] * big[1]; k++) p[k] = (float)k;
  CHECK_EQ(ipcref_view_transpose(&a, 0, 1, &s), IPCREF_OK);
  CHECK_EQ(ipcref_view_contiguous(&s, &c), IPCREF_OK);
  q = (float *)ipcref_buf_data(c.buf);
  for (k = 0; k < big[0] * big[1]; k++) {
    int64_t r0 = k % big[0], c0 = k / big[0]; /* c[c0][r0] = a[r0][c0] */
    if (q[k] != (float)(r0 * big[1] + c0)) {
      CHECK(q[k] == (float)(r0 * big[1] + c0));
      break;
    }
  }
  ipcref_view_release(&c);
  /* And the same transpose in place over itself (square part). */
  {
    int64_t sq[2] = {1024, 1024}, st[2] = {1100, 1};
    ipcref_view x, xt;
    memset(&x, 0, sizeof x);
    memset(&xt, 0, sizeof xt);
    for (k = 0; k < big[0] * big[1]; k++) p[k] = (float)k;
    ipcref_buf_set_shared_mut(a.buf, 1);
    CHECK_EQ(ipcref_view_as_strided(&a, 2, sq, st, 0, &x), IPCREF_OK);
    CHECK_EQ(ipcref_view_transpose(&x, 0, 1, &xt), IPCREF_OK);
    CHECK_EQ(ipcref_view_copy(&x, &xt), IPCREF_OK);
    for (k = 0; k < big[0] * big[1]; k++) {
      int64_t r0 = k / big[1], c0 = k % big[1];
      float want = c0 < 1024 ? (float)(c0 * 1100 + r0) : (float)k;
      if (p[k] != want) {
        CHECK(p[k] == want);
        break;
      }
    }
    ipcref_view_release(&x);
    ipcref_view_release(&xt);
  }
  ipcref_view_release(&s);
  ipcref_view_release(&a);
  CHECK_EQ(live_allocs, 0);
}

static void test_no_leaks(void) {
  CHECK_EQ(live_allocs, 0);
  CHECK(total_allocs > 0);
}

int main(void) {
  RUN(test_copy_overlap_fixed);
  RUN(test_copy_overlap_random);
  RUN(test_copy_paths);
  RUN(test_model);
  RUN(test_no_leaks);
  return harness_finish();
}
