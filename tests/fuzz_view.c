/* A libFuzzer target for the view layer. The input bytes are decoded into a
 * base view and a sequence of calls with arbitrary, often hostile, arguments
 * (huge and negative sizes, dims, steps, strides and offsets), on a pool of
 * four views, including in-place calls (out == input) and views whose
 * fields were tampered with. After every call:
 *   - the result code is one of the documented ones;
 *   - on error, `out` and the input are byte-identical and the buffer's
 *     count is unchanged;
 *   - on success, the result is a valid view: every element (up to 4096) is
 *     read through ipcref_view_ptr and the iterator, which must agree and
 *     stay inside the buffer, and contiguous() must give the same values;
 *   - a tampered view the library accepts must also stay inside its buffer;
 *   - every EINVAL is told to the error hook exactly once, as
 *     "ipcref_...: reason", and nothing else is told.
 * ASan and UBSan catch the rest (out-of-bounds, overflow). Any violation
 * aborts. Built and run by tests/fuzz.sh. */
#define _GNU_SOURCE /* the sharing layer needs GNU declarations */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"

#define MAXD   IPCREF_MAX_DIMS
#define NV     4                  /* views in the pool */
#define MAXN   4096               /* element reads per check, at most */
#define MAXOPS 48                 /* calls per input, at most */
#define ALLOC  ((int64_t)1 << 22) /* bytes a copying call may allocate */

#define FUZZ_NAME      "fuzz_view"
#define FUZZ_TRACE_ENV "FUZZ_VIEW_TRACE"
#include "fuzz_common.h"

static void trv(const char *tag, const ipcref_view *v) {
  int d;
  if (!tracing) return;
  tr("  %s: buf=%p off=%lld dt=%d ndim=%d shape=(", tag, (void *)v->buf,
     (long long)v->byte_offset, (int)v->dtype, v->ndim);
  for (d = 0; d < v->ndim && d < MAXD; d++) tr("%lld,", (long long)v->shape[d]);
  tr(") strides=(");
  for (d = 0; d < v->ndim && d < MAXD; d++)
    tr("%lld,", (long long)v->strides[d]);
  tr(")\n");
}

/* ------------------------------------------------------------------ the hook
 * Each EINVAL the library returns names its reason to the error hook, once;
 * nothing else reaches it here. The fuzzer's own refusals (skipped()) are
 * not told. */
static int heard, skip;

static void hook_fn(void *user, ipcref_result code, const char *message) {
  (void)user;
  heard++;
  tr("  hook: %s\n", message);
  if (code != IPCREF_EINVAL) fail("the hook heard a code other than EINVAL");
  if (strncmp(message, "ipcref_", 7) != 0 || !strstr(message, ": "))
    fail("a report that does not start with its function's name");
}

static const ipcref_error_hook hook = {hook_fn, NULL};

/* Before a call: nothing heard yet. */
static void hear_anew(void) {
  heard = 0;
  skip = 0;
}

/* A refusal of the fuzzer's own (too much to copy): the library told
 * nothing. */
static ipcref_result skipped(void) {
  skip = 1;
  return IPCREF_EINVAL;
}

/* After a call: its EINVAL was told exactly once, anything else never. */
static void told(ipcref_result rc) {
  if (heard != (rc == IPCREF_EINVAL && !skip))
    fail(rc == IPCREF_EINVAL ? "an EINVAL not told exactly once"
                             : "a call told the hook but did not refuse");
}

/* ------------------------------------------------------------------ decoding
 */

static int64_t raw64(reader *r) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < 8; i++) v |= (uint64_t)u8(r) << (8 * i);
  return (int64_t)v;
}

static const int64_t specials[] = {INT64_MIN,
                                   INT64_MAX,
                                   INT64_MIN + 1,
                                   INT64_MAX - 1,
                                   -1,
                                   0,
                                   1,
                                   2,
                                   (int64_t)1 << 31,
                                   (int64_t)1 << 32,
                                   (int64_t)1 << 40,
                                   (int64_t)1 << 62,
                                   -((int64_t)1 << 62),
                                   INT64_MAX / 2,
                                   INT64_MAX / 3,
                                   INT64_MAX / 4 + 1,
                                   INT64_MAX / 8,
                                   4096,
                                   -4096,
                                   65536};

/* A number: mostly small, sometimes any byte, a notable edge or any 64
 * bits. */
static int64_t num(reader *r) {
  uint8_t k = u8(r);
  if (k < 150) return (int64_t)(k % 9) - 2;
  if (k < 190) return (int64_t)(int8_t)u8(r);
  if (k < 230) return specials[u8(r) % (sizeof specials / sizeof specials[0])];
  return raw64(r);
}

/* A dim argument: mostly in or near range, sometimes far out. */
static int dimarg(reader *r) {
  static const int far[] = {INT32_MIN, INT32_MAX, -9, 9, 99, -99, 8, -8};
  uint8_t k = u8(r);
  if (k < 220) return (int)(k % 11) - 5;
  return far[k % 8];
}

/* An ndim argument: mostly 0..4, sometimes out of range. */
static int ndimarg(reader *r) {
  uint8_t k = u8(r);
  if (k < 200) return k % 5;
  if (k < 240) return k % (MAXD + 2);
  return k & 1 ? -1 : 99;
}

static void shapearg(reader *r, int n, int64_t *a) {
  int d;
  for (d = 0; d < MAXD; d++) a[d] = d < n ? num(r) : 0;
}

/* ------------------------------------------------------------------ checks */

static volatile unsigned char sink;

static int known(ipcref_result rc) {
  return rc == IPCREF_OK || rc == IPCREF_EINVAL || rc == IPCREF_ERANGE ||
         rc == IPCREF_ENOMEM || rc == IPCREF_EBUSY || rc == IPCREF_ENEEDCOPY;
}

/* True when the index is the last one; else steps it in C order. */
static int step_index(const ipcref_view *v, int64_t *idx) {
  int d;
  for (d = v->ndim - 1; d >= 0; d--) {
    if (++idx[d] < v->shape[d]) return 0;
    idx[d] = 0;
  }
  return 1;
}

/* Every element the library hands out for `v` lies inside its buffer; ptr
 * and the iterator agree. When `must` is set, `v` came out of a successful
 * call and has to be valid; contiguous() must then copy it faithfully. */
static void check_view(const ipcref_view *v, int must) {
  ipcref_view_iter it, ic;
  ipcref_view c;
  int64_t n, idx[MAXD], k, es;
  const char *data, *p, *q;
  size_t size;
  ipcref_result rc;
  if (ipcref_view_iter_init(v, &it) != IPCREF_OK) {
    if (must) fail("a successful call made an invalid view");
    return;
  }
  es = (int64_t)ipcref_dtype_size(v->dtype);
  if (es == 0) fail("valid view with an invalid dtype");
  if (v->ndim < 0 || v->ndim > MAXD) fail("valid view with a bad ndim");
  data = (const char *)ipcref_buf_data(v->buf);
  size = ipcref_buf_size(v->buf);
  n = ipcref_view_numel(v);
  if (n < 0) fail("negative numel");
  if (n > MAXN) return;
  memset(idx, 0, sizeof idx);
  for (k = 0; k < n; k++) {
    p = (const char *)ipcref_view_ptr(v, idx);
    q = (const char *)ipcref_view_iter_next(&it);
    if (!p || p != q) fail("ptr and the iterator disagree");
    if (p < data || p + es > data + size) fail("element outside its buffer");
    sink ^= (unsigned char)p[0];
    sink ^= (unsigned char)p[es - 1];
    step_index(v, idx);
  }
  if (ipcref_view_iter_next(&it) != NULL) fail("iterator runs past numel");
  if (n > 0) {
    void *m = ipcref_view_data_mut(v);
    memset(idx, 0, sizeof idx);
    if (m && m != ipcref_view_ptr(v, idx)) fail("data_mut is not element 0");
  }
  /* contiguous(): same values in C order. */
  if (n * es > ALLOC) return;
  memset(&c, 0, sizeof c);
  rc = ipcref_view_contiguous(v, &c);
  if (rc == IPCREF_ENOMEM) return;
  if (rc != IPCREF_OK) fail("contiguous failed on a valid view");
  if (!ipcref_view_is_contiguous(&c) || ipcref_view_numel(&c) != n ||
      c.dtype != v->dtype)
    fail("contiguous result is not contiguous");
  if (ipcref_view_iter_init(v, &it) != IPCREF_OK ||
      ipcref_view_iter_init(&c, &ic) != IPCREF_OK)
    fail("iter_init failed on a valid view");
  for (k = 0; k < n; k++) {
    p = (const char *)ipcref_view_iter_next(&it);
    q = (const char *)ipcref_view_iter_next(&ic);
    if (!p || !q || memcmp(p, q, (size_t)es) != 0)
      fail("contiguous changed a value");
  }
  ipcref_view_release(&c);
}

/* Estimated bytes a copying call on v could allocate (0 when invalid). */
static int64_t copy_bytes(const ipcref_view *v) {
  ipcref_view_iter it;
  int64_t n, es;
  int before = heard; /* a probe of the fuzzer's own: its refusal uncounted */
  if (ipcref_view_iter_init(v, &it) != IPCREF_OK) {
    heard = before;
    return 0;
  }
  n = ipcref_view_numel(v);
  es = (int64_t)ipcref_dtype_size(v->dtype);
  return n > INT64_MAX / 16 ? INT64_MAX : n * es;
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* copy(dst, src) with the values checked when dst's elements are distinct
 * (else the order of the writes decides, which is not specified). */
static void do_copy(ipcref_view *dst, ipcref_view *src) {
  static uintptr_t addr[MAXN];
  static unsigned char want[MAXN * 16];
  ipcref_view e, bd = *dst, bs = *src;
  ipcref_view_iter it;
  int64_t n = ipcref_view_numel(dst), k, es = 0, distinct = 0;
  size_t cnt = ipcref_buf_strong_count(dst->buf);
  ipcref_result rc;
  const char *p;
  memset(&e, 0, sizeof e);
  if (n < 0) fail("negative numel");
  if (ipcref_view_iter_init(dst, &it) == IPCREF_OK) {
    es = (int64_t)ipcref_dtype_size(dst->dtype);
    if (copy_bytes(dst) > ALLOC) return; /* an overlapping copy allocates */
    if (n <= MAXN && src->dtype == dst->dtype &&
        ipcref_view_expand(src, dst->ndim, dst->shape, &e) == IPCREF_OK) {
      distinct = 1;
      for (k = 0; k < n; k++) addr[k] = (uintptr_t)ipcref_view_iter_next(&it);
      qsort(addr, (size_t)n, sizeof addr[0], cmp_ptr);
      for (k = 1; k < n; k++)
        if (addr[k] == addr[k - 1]) distinct = 0;
      if (ipcref_view_iter_init(&e, &it) != IPCREF_OK)
        fail("iter_init failed on an expanded view");
      for (k = 0; k < n; k++) {
        p = (const char *)ipcref_view_iter_next(&it);
        if (!p) fail("iterator ended early");
        memcpy(want + k * es, p, (size_t)es);
      }
      ipcref_view_release(&e);
    }
  }
  hear_anew();
  rc = ipcref_view_copy(dst, src);
  told(rc);
  if (!known(rc)) fail("unknown result code");
  if (memcmp(&bd, dst, sizeof bd) != 0 || memcmp(&bs, src, sizeof bs) != 0)
    fail("copy changed a view struct");
  if (ipcref_buf_strong_count(dst->buf) != cnt) fail("copy changed a count");
  if (rc != IPCREF_OK || !distinct) return;
  if (ipcref_view_iter_init(dst, &it) != IPCREF_OK) fail("dst went invalid");
  for (k = 0; k < n; k++) {
    p = (const char *)ipcref_view_iter_next(&it);
    if (!p || memcmp(p, want + k * es, (size_t)es) != 0)
      fail("copy wrote a wrong value");
  }
}

/* ------------------------------------------------------------------ calls */

enum {
  F_SLICE,
  F_SELECT,
  F_NARROW,
  F_PERMUTE,
  F_TRANSPOSE,
  F_RESHAPE,
  F_RESHAPE_COPY,
  F_FLATTEN,
  F_EXPAND,
  F_SQUEEZE,
  F_UNSQUEEZE,
  F_FLIP,
  F_AS_STRIDED,
  F_CLONE,
  F_CONTIGUOUS,
  F_VIEW_OF,
  F_NEW,
  F_COUNT /* the ones above make a view into `out` */
};

/* One call that makes a view: f on `in` into `out`. */
static ipcref_result call(int f, reader *r, const ipcref_view *in,
                          ipcref_view *out) {
  int64_t a[MAXD], b[MAXD];
  int perm[MAXD], nd, d, x, y;
  switch (f) {
  case F_SLICE: {
    int64_t start, stop;
    x = dimarg(r);
    start = num(r);
    stop = num(r);
    a[0] = num(r);
    tr("slice(%d, %lld, %lld, %lld)\n", x, (long long)start, (long long)stop,
       (long long)a[0]);
    return ipcref_view_slice(in, x, start, stop, a[0], out);
  }
  case F_SELECT:
    x = dimarg(r);
    a[0] = num(r);
    tr("select(%d, %lld)\n", x, (long long)a[0]);
    return ipcref_view_select(in, x, a[0], out);
  case F_NARROW: {
    int64_t start;
    x = dimarg(r);
    start = num(r);
    a[0] = num(r);
    tr("narrow(%d, %lld, %lld)\n", x, (long long)start, (long long)a[0]);
    return ipcref_view_narrow(in, x, start, a[0], out);
  }
  case F_PERMUTE:
    for (d = 0; d < MAXD; d++) perm[d] = dimarg(r);
    if (u8(r) & 1) { /* mostly a real permutation */
      for (d = 0; d < MAXD; d++) perm[d] = d;
      for (d = 1; d < MAXD; d++) {
        int j = u8(r) % (d + 1), t = perm[d];
        perm[d] = perm[j];
        perm[j] = t;
      }
    }
    tr("permute(%d,%d,%d,%d,%d,%d,%d,%d)\n", perm[0], perm[1], perm[2], perm[3],
       perm[4], perm[5], perm[6], perm[7]);
    return ipcref_view_permute(in, perm, out);
  case F_TRANSPOSE:
    x = dimarg(r);
    y = dimarg(r);
    tr("transpose(%d, %d)\n", x, y);
    return ipcref_view_transpose(in, x, y, out);
  case F_RESHAPE:
  case F_RESHAPE_COPY:
    nd = ndimarg(r);
    shapearg(r, nd, a);
    tr("%s(%d: %lld,%lld,%lld,%lld,...)\n",
       f == F_RESHAPE ? "reshape" : "reshape_copy", nd, (long long)a[0],
       (long long)a[1], (long long)a[2], (long long)a[3]);
    if (f == F_RESHAPE_COPY && copy_bytes(in) > ALLOC) return skipped();
    return f == F_RESHAPE ? ipcref_view_reshape(in, nd, a, out)
                          : ipcref_view_reshape_copy(in, nd, a, out);
  case F_FLATTEN:
    x = dimarg(r);
    y = dimarg(r);
    tr("flatten(%d, %d)\n", x, y);
    return ipcref_view_flatten(in, x, y, out);
  case F_EXPAND:
    nd = ndimarg(r);
    shapearg(r, nd, a);
    tr("expand(%d: %lld,%lld,%lld,%lld,...)\n", nd, (long long)a[0],
       (long long)a[1], (long long)a[2], (long long)a[3]);
    return ipcref_view_expand(in, nd, a, out);
  case F_SQUEEZE:
    x = u8(r) < 64 ? IPCREF_DIM_ALL : dimarg(r);
    tr("squeeze(%d)\n", x);
    return ipcref_view_squeeze(in, x, out);
  case F_UNSQUEEZE:
    x = dimarg(r);
    tr("unsqueeze(%d)\n", x);
    return ipcref_view_unsqueeze(in, x, out);
  case F_FLIP:
    x = dimarg(r);
    tr("flip(%d)\n", x);
    return ipcref_view_flip(in, x, out);
  case F_AS_STRIDED: {
    int64_t off;
    nd = ndimarg(r);
    shapearg(r, nd, a);
    shapearg(r, nd, b);
    off = num(r);
    if (u8(r) & 1) /* a multiple of the element size, wrapping */
      off = (int64_t)((uint64_t)off * ipcref_dtype_size(in->dtype));
    tr("as_strided(%d: ", nd);
    for (d = 0; d < nd && d < MAXD; d++)
      tr("%lld:%lld,", (long long)a[d], (long long)b[d]);
    tr(" @%lld)\n", (long long)off);
    return ipcref_view_as_strided(in, nd, a, b, off, out);
  }
  case F_CLONE: tr("clone\n"); return ipcref_view_clone(in, out);
  case F_CONTIGUOUS:
    tr("contiguous\n");
    if (copy_bytes(in) > ALLOC) return skipped();
    return ipcref_view_contiguous(in, out);
  case F_NEW: {
    ipcref_dtype dt = (ipcref_dtype)((int)(u8(r) % 17) - 1);
    int64_t total = (int64_t)ipcref_dtype_size(dt);
    nd = ndimarg(r);
    shapearg(r, nd, a);
    /* Allocate only small buffers; shapes that are invalid or overflow are
     * passed on as they are (they must fail before allocating). */
    for (d = 0; d < nd && d < MAXD; d++) {
      if (a[d] < 0) break;
      if (a[d] == 0) {
        total = 0;
        break;
      }
      if (total > ALLOC / a[d] + 1)
        total = ALLOC + 1;
      else
        total *= a[d];
    }
    tr("new(%d, %d: %lld,%lld,%lld,%lld,...)\n", (int)dt, nd, (long long)a[0],
       (long long)a[1], (long long)a[2], (long long)a[3]);
    if (nd >= 0 && nd <= MAXD && d == nd && total > ALLOC) return skipped();
    return ipcref_view_new(dt, nd, a, out);
  }
  default: { /* F_VIEW_OF: a fresh view of the input's buffer */
    ipcref_dtype dt = (ipcref_dtype)((int)(u8(r) % 17) - 1);
    nd = ndimarg(r);
    shapearg(r, nd, a);
    tr("view_of(%d, %d: %lld,%lld,%lld,%lld,...)\n", (int)dt, nd,
       (long long)a[0], (long long)a[1], (long long)a[2], (long long)a[3]);
    return ipcref_view_of(in->buf, dt, nd, a, out);
  }
  }
}

/* A copy of the view struct (no reference of its own) with damaged
 * fields; the library must refuse it or keep to its buffer. */
static void tampered(reader *r, const ipcref_view *v) {
  ipcref_view t = *v, out, before;
  const char *p0;
  int64_t idx[MAXD];
  int k, nmut = 1 + u8(r) % 3;
  ipcref_result rc;
  for (k = 0; k < nmut; k++) {
    switch (u8(r) % 7) {
    case 0: t.byte_offset = num(r); break;
    case 1: t.ndim = ndimarg(r); break;
    case 2: t.shape[u8(r) % MAXD] = num(r); break;
    case 3: t.strides[u8(r) % MAXD] = num(r); break;
    case 4: t.dtype = (ipcref_dtype)((int)(u8(r) % 17) - 1); break;
    case 5: t.buf = NULL; break;
    default: /* nudged, wrapping */
      t.byte_offset =
          (int64_t)((uint64_t)t.byte_offset + (uint64_t)(num(r) & 0xff));
      break;
    }
  }
  before = t;
  memset(&out, 0, sizeof out);
  memset(idx, 0, sizeof idx);
  check_view(&t, 0);
  p0 = (const char *)ipcref_view_ptr(&t, idx);
  if (p0) {
    ipcref_view_iter it;
    const char *d0 = (const char *)ipcref_buf_data(t.buf);
    if (ipcref_view_iter_init(&t, &it) != IPCREF_OK)
      fail("ptr accepts a view that iter_init refuses");
    if (p0 < d0 || p0 >= d0 + ipcref_buf_size(t.buf))
      fail("element outside its buffer");
  }
  tr("tampered:\n");
  trv("t", &t);
  hear_anew();
  rc = call(u8(r) % F_COUNT, r, &t, &out);
  tr("  -> %d\n", (int)rc);
  told(rc);
  if (!known(rc)) fail("unknown result code");
  if (memcmp(&t, &before, sizeof t) != 0) fail("a call changed its input");
  if (rc == IPCREF_OK) {
    check_view(&out, 1);
    ipcref_view_release(&out);
  } else {
    ipcref_view zero;
    memset(&zero, 0, sizeof zero);
    if (memcmp(&out, &zero, sizeof out) != 0) fail("out changed on error");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r;
  ipcref_view pool[NV];
  int64_t shape[MAXD], n, k;
  int ndim, d, ops;
  ipcref_dtype dt;
  unsigned char *p;
  r.p = data;
  r.n = size;
  memset(pool, 0, sizeof pool);
  ipcref_set_error_hook(&hook);

  /* The base: a small C-contiguous view of any dtype, filled from the
   * input. */
  dt = (ipcref_dtype)(u8(&r) % IPCREF_DTYPE_COUNT);
  ndim = u8(&r) % 5;
  for (d = 0; d < ndim; d++) shape[d] = u8(&r) % 7;
  if (ipcref_view_new(dt, ndim, shape, &pool[0]) != IPCREF_OK)
    fail("view_new failed on a small shape");
  n = ipcref_view_numel(&pool[0]);
  p = (unsigned char *)ipcref_view_data_mut(&pool[0]);
  if (n > 0 && !p) fail("a fresh view is not writable");
  for (k = 0; k < n * (int64_t)ipcref_dtype_size(dt); k++)
    p[k] = (unsigned char)(k * 37 + 11);
  tr("base:\n");
  trv("[0]", &pool[0]);
  check_view(&pool[0], 1);

  for (ops = 0; ops < MAXOPS && r.n > 0; ops++) {
    uint8_t f = u8(&r) % (F_COUNT + 5);
    int i = u8(&r) % NV, j = u8(&r) % NV;
    ipcref_view *in = &pool[i], *out = &pool[j], bin, bout;
    size_t cnt;
    ipcref_result rc;
    if ((f == F_NEW || f == F_VIEW_OF) && j == i) {
      /* These have no input view to hand a reference to: not in place. */
      ipcref_view tmp;
      memset(&tmp, 0, sizeof tmp);
      tr("[%d] ", i);
      hear_anew();
      rc = call(f, &r, in, &tmp);
      tr("  -> %d\n", (int)rc);
      told(rc);
      if (!known(rc)) fail("unknown result code");
      if (rc == IPCREF_OK) {
        check_view(&tmp, 1);
        ipcref_view_release(in);
        *in = tmp;
      }
      continue;
    }
    if (f < F_COUNT) {
      /* `out` is overwritten as if uninitialized: release it first,
       * unless it is the input itself. */
      if (j != i) ipcref_view_release(out);
      bin = *in;
      bout = *out;
      cnt = ipcref_buf_strong_count(in->buf);
      tr("[%d] -> [%d] ", i, j);
      trv("in", in);
      hear_anew();
      rc = call(f, &r, in, out);
      tr("  -> %d\n", (int)rc);
      told(rc);
      if (rc == IPCREF_OK) trv("out", out);
      if (!known(rc)) fail("unknown result code");
      if (rc != IPCREF_OK) {
        if (memcmp(in, &bin, sizeof bin) != 0 ||
            memcmp(out, &bout, sizeof bout) != 0)
          fail("a failing call changed its views");
        if (ipcref_buf_strong_count(in->buf) != cnt)
          fail("a failing call changed a count");
      } else {
        if (j != i && memcmp(in, &bin, sizeof bin) != 0)
          fail("a call changed its input");
        check_view(out, 1);
      }
      continue;
    }
    switch (f - F_COUNT) {
    case 0:
      tr("copy [%d] <- [%d]\n", j, i);
      do_copy(out, in);
      break;
    case 1: {
      ipcref_view b = *in;
      if (copy_bytes(in) > ALLOC) break;
      tr("make_mut [%d]\n", i);
      hear_anew();
      rc = ipcref_view_make_mut(in);
      told(rc);
      if (!known(rc)) fail("unknown result code");
      if (rc != IPCREF_OK && memcmp(&b, in, sizeof b) != 0)
        fail("a failing make_mut changed its view");
      if (rc == IPCREF_OK) {
        check_view(in, 1);
        if (ipcref_view_numel(in) > 0 && !ipcref_view_data_mut(in))
          fail("make_mut left the view read-only");
      }
      break;
    }
    case 2:
      tr("set_shared_mut [%d]\n", i);
      ipcref_buf_set_shared_mut(in->buf, u8(&r) & 1);
      break;
    case 3: tampered(&r, in); break;
    default:
      tr("release [%d]\n", i);
      ipcref_view_release(in);
      break;
    }
  }
  for (d = 0; d < NV; d++) ipcref_view_release(&pool[d]);
  return 0;
}
