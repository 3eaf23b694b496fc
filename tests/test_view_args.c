/* The view layer given wrong arguments: NULL pointers, dims out of range,
 * bad dtypes, ndim out of range, negative and overflowing shapes, views
 * whose fields were tampered with, hostile as_strided, non-writable
 * destinations. Every failing call must return the documented code and
 * change nothing: `out` keeps its bytes, the input view its bytes, the
 * buffer its strong count, and no allocation is left behind. Where the
 * documentation leaves the choice between two codes open, both are
 * accepted (marked "either"). */
#define _GNU_SOURCE /* the sharing layer needs GNU declarations */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"

#include "counting_alloc.h"
#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"

#define MAXD IPCREF_MAX_DIMS

/* A view struct full of garbage, as an uninitialized `out`. */
static ipcref_view garbage(void) {
  ipcref_view g;
  memset(&g, 0xA5, sizeof g);
  return g;
}

/* `call` must return `code` (or `code2`) and change nothing: *outp and *vp
 * keep their bytes, vp's buffer its count, and no allocation stays. */
#define FAILS2(code, code2, call, outp, vp)                                    \
  do {                                                                         \
    ipcref_view f_out_, f_in_;                                                 \
    size_t f_cnt_ = ipcref_buf_strong_count((vp)->buf);                        \
    long f_live_ = live_allocs;                                                \
    ipcref_result f_rc_;                                                       \
    memcpy(&f_out_, (outp), sizeof f_out_);                                    \
    memcpy(&f_in_, (vp), sizeof f_in_);                                        \
    f_rc_ = (call);                                                            \
    if (f_rc_ != (code) && f_rc_ != (code2)) CHECK_EQ(f_rc_, (code));          \
    CHECK(memcmp(&f_out_, (outp), sizeof f_out_) == 0);                        \
    CHECK(memcmp(&f_in_, (vp), sizeof f_in_) == 0);                            \
    CHECK_EQ(ipcref_buf_strong_count((vp)->buf), f_cnt_);                      \
    CHECK_EQ(live_allocs, f_live_);                                            \
    if (f_rc_ == IPCREF_OK && (void *)(outp) != (void *)(vp)) {                \
      /* It should have failed: drop what it made, so later tests still        \
       * count their own allocations. */                                       \
      ipcref_view_release(outp);                                               \
      memcpy((outp), &f_out_, sizeof f_out_);                                  \
    }                                                                          \
  } while (0)
#define FAILS(code, call, outp, vp) FAILS2(code, code, call, outp, vp)

/* A failing call with no `out` to look at. */
#define FAILS_V(code, call, vp)                                                \
  do {                                                                         \
    ipcref_view f_in_;                                                         \
    size_t f_cnt_ = ipcref_buf_strong_count((vp)->buf);                        \
    long f_live_ = live_allocs;                                                \
    memcpy(&f_in_, (vp), sizeof f_in_);                                        \
    CHECK_EQ((call), (code));                                                  \
    CHECK(memcmp(&f_in_, (vp), sizeof f_in_) == 0);                            \
    CHECK_EQ(ipcref_buf_strong_count((vp)->buf), f_cnt_);                      \
    CHECK_EQ(live_allocs, f_live_);                                            \
  } while (0)

/* A C-contiguous f32 view holding 0, 1, 2, ... */
static ipcref_view iota(int ndim, const int64_t *shape) {
  ipcref_view v;
  float *p;
  int64_t n = 1, k;
  int d;
  memset(&v, 0, sizeof v);
  for (d = 0; d < ndim; d++) n *= shape[d];
  CHECK_EQ(ipcref_view_new(IPCREF_F32, ndim, shape, &v), IPCREF_OK);
  p = (float *)ipcref_view_data_mut(&v);
  CHECK(p != NULL || n == 0);
  for (k = 0; k < n; k++) p[k] = (float)k;
  return v;
}

static float at(const ipcref_view *v, int64_t i0, int64_t i1) {
  int64_t idx[2] = {i0, i1};
  const float *p = (const float *)ipcref_view_ptr(v, idx);
  return p ? *p : -1.0f;
}

/* ------------------------------------------------------------------ dtypes */

static void test_dtypes(void) {
  static const size_t sizes[IPCREF_DTYPE_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4,
                                                   8, 2, 2, 4, 8, 8, 16};
  ipcref_dtype bad[3];
  int i, j;
  bad[0] = (ipcref_dtype)-1;
  bad[1] = IPCREF_DTYPE_COUNT;
  bad[2] = (ipcref_dtype)1000;
  for (i = 0; i < IPCREF_DTYPE_COUNT; i++) {
    const char *name = ipcref_dtype_name((ipcref_dtype)i);
    CHECK_EQ(ipcref_dtype_size((ipcref_dtype)i), sizes[i]);
    CHECK(name != NULL && strcmp(name, "invalid") != 0);
    for (j = 0; j < i; j++)
      CHECK(strcmp(name, ipcref_dtype_name((ipcref_dtype)j)) != 0);
  }
  CHECK(strcmp(ipcref_dtype_name(IPCREF_F32), "f32") == 0);
  CHECK(strcmp(ipcref_dtype_name(IPCREF_C128), "c128") == 0);
  for (i = 0; i < 3; i++) {
    CHECK_EQ(ipcref_dtype_size(bad[i]), 0);
    CHECK(strcmp(ipcref_dtype_name(bad[i]), "invalid") == 0);
  }
}

/* ------------------------------------------------------------------ new, of */

static void test_new_bad(void) {
  ipcref_view out = garbage(), none;
  int64_t one[1] = {4}, neg[2] = {2, -3}, negmin[1] = {INT64_MIN};
  int64_t ovf1[2] = {INT64_MAX, 2},
          ovf2[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  int64_t ovfb[1] = {(int64_t)1 << 62}, ovfc[1] = {(int64_t)1 << 60};
  int64_t big[1] = {INT64_MAX}, zbig[3] = {0, INT64_MAX, 2};
  int64_t shape9[MAXD + 1];
  ipcref_dtype bad[3];
  int i;
  bad[0] = (ipcref_dtype)-1;
  bad[1] = IPCREF_DTYPE_COUNT;
  bad[2] = (ipcref_dtype)1000;
  memset(&none, 0, sizeof none);
  for (i = 0; i <= MAXD; i++) shape9[i] = 1;

  CHECK_EQ(ipcref_view_new(IPCREF_F32, 1, one, NULL), IPCREF_EINVAL);
  FAILS(IPCREF_EINVAL, ipcref_view_new(IPCREF_F32, 1, NULL, &out), &out, &none);
  for (i = 0; i < 3; i++)
    FAILS(IPCREF_EINVAL, ipcref_view_new(bad[i], 1, one, &out), &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_F32, MAXD + 1, shape9, &out),
        &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_F32, 99, shape9, &out), &out,
        &none);
  /* either: a negative ndim is out of range, or simply invalid */
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL,
         ipcref_view_new(IPCREF_F32, -1, one, &out), &out, &none);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL,
         ipcref_view_new(IPCREF_F32, INT_MIN, one, &out), &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_F32, 2, neg, &out), &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_F32, 1, negmin, &out), &out,
        &none);
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_U8, 2, ovf1, &out), &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_U8, 2, ovf2, &out), &out, &none);
  /* 2^62 f64 elements: the count fits, the bytes do not. */
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_F64, 1, ovfb, &out), &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_C128, 1, ovfc, &out), &out,
        &none);
  /* INT64_MAX bytes: more than any allocation may hold. */
  FAILS(IPCREF_ERANGE, ipcref_view_new(IPCREF_U8, 1, big, &out), &out, &none);
  /* Out of memory. */
  fail_next_alloc = 1;
  FAILS(IPCREF_ENOMEM, ipcref_view_new(IPCREF_F32, 1, one, &out), &out, &none);
  fail_next_alloc = 0;

  /* A zero dim makes the count 0 whatever the others are: either allowed
   * (an empty view) or refused, but never an overflow in the strides. */
  {
    ipcref_view z = garbage();
    ipcref_result rc = ipcref_view_new(IPCREF_F32, 3, zbig, &z);
    CHECK(rc == IPCREF_OK || rc == IPCREF_ERANGE);
    if (rc == IPCREF_OK) {
      int64_t idx[3] = {0, 0, 0};
      CHECK_EQ(ipcref_view_numel(&z), 0);
      CHECK(ipcref_view_ptr(&z, idx) == NULL);
      CHECK_EQ(ipcref_view_is_contiguous(&z), 1);
      ipcref_view_release(&z);
    }
  }
  /* ndim 0 is a scalar: one element. */
  {
    ipcref_view s = garbage();
    int64_t idx[1] = {0};
    CHECK_EQ(ipcref_view_new(IPCREF_F64, 0, one, &s), IPCREF_OK);
    CHECK_EQ(ipcref_view_numel(&s), 1);
    CHECK(ipcref_view_ptr(&s, idx) == ipcref_buf_data(s.buf));
    CHECK_EQ(ipcref_view_is_contiguous(&s), 1);
    ipcref_view_release(&s);
  }
  CHECK_EQ(live_allocs, 0);
}

static void test_of_bad(void) {
  ipcref_view out = garbage(), v, none;
  ipcref_buf *b = NULL, *b0 = NULL;
  int64_t fit[2] = {3, 4}, over[2] = {3, 5}, huge[1] = {(int64_t)1 << 60};
  int64_t ovf[2] = {INT64_MAX, 2}, neg[1] = {-1}, shape9[MAXD + 1];
  int i;
  memset(&none, 0, sizeof none);
  for (i = 0; i <= MAXD; i++) shape9[i] = 1;
  CHECK_EQ(ipcref_buf_new(48, &b), IPCREF_OK);
  CHECK_EQ(ipcref_buf_new(0, &b0), IPCREF_OK);

  FAILS(IPCREF_EINVAL, ipcref_view_of(NULL, IPCREF_F32, 2, fit, &out), &out,
        &none);
  CHECK_EQ(ipcref_view_of(b, IPCREF_F32, 2, fit, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_strong_count(b), 1);
  FAILS(IPCREF_EINVAL, ipcref_view_of(b, IPCREF_F32, 2, NULL, &out), &out,
        &none);
  FAILS(IPCREF_EINVAL,
        ipcref_view_of(b, (ipcref_dtype)IPCREF_DTYPE_COUNT, 2, fit, &out), &out,
        &none);
  FAILS(IPCREF_EINVAL, ipcref_view_of(b, (ipcref_dtype)-1, 2, fit, &out), &out,
        &none);
  FAILS(IPCREF_ERANGE, ipcref_view_of(b, IPCREF_F32, 2, over, &out), &out,
        &none);
  FAILS(IPCREF_ERANGE, ipcref_view_of(b, IPCREF_F64, 2, fit, &out), &out,
        &none);
  FAILS(IPCREF_ERANGE, ipcref_view_of(b, IPCREF_U8, 1, huge, &out), &out,
        &none);
  FAILS(IPCREF_ERANGE, ipcref_view_of(b, IPCREF_U8, 2, ovf, &out), &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_of(b, IPCREF_U8, 1, neg, &out), &out, &none);
  FAILS(IPCREF_ERANGE, ipcref_view_of(b, IPCREF_U8, MAXD + 1, shape9, &out),
        &out, &none);
  /* A scalar needs one element. */
  FAILS(IPCREF_ERANGE, ipcref_view_of(b0, IPCREF_U8, 0, fit, &out), &out,
        &none);
  CHECK_EQ(ipcref_buf_strong_count(b), 1);
  CHECK_EQ(ipcref_buf_strong_count(b0), 1);

  /* Fits exactly: retains b. */
  v = garbage();
  CHECK_EQ(ipcref_view_of(b, IPCREF_F32, 2, fit, &v), IPCREF_OK);
  CHECK(v.buf == b);
  CHECK_EQ(v.byte_offset, 0);
  CHECK_EQ(ipcref_buf_strong_count(b), 2);
  CHECK_EQ(ipcref_view_numel(&v), 12);
  ipcref_view_release(&v);
  CHECK_EQ(ipcref_buf_strong_count(b), 1);
  /* An empty view of an empty buffer. */
  neg[0] = 0;
  v = garbage();
  CHECK_EQ(ipcref_view_of(b0, IPCREF_C128, 1, neg, &v), IPCREF_OK);
  CHECK_EQ(ipcref_view_numel(&v), 0);
  ipcref_view_release(&v);
  ipcref_buf_release(b);
  ipcref_buf_release(b0);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ NULLs */

static void test_nulls(void) {
  int64_t shape[2] = {2, 3}, idx[2] = {0, 0}, strides[2] = {3, 1};
  int perm[2] = {1, 0};
  ipcref_view v = iota(2, shape), out = garbage(), none;
  ipcref_view_iter it;
  size_t cnt = ipcref_buf_strong_count(v.buf);
  memset(&none, 0, sizeof none);

  /* NULL input view. */
  FAILS(IPCREF_EINVAL, ipcref_view_clone(NULL, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_slice(NULL, 0, 0, 1, 1, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_select(NULL, 0, 0, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_narrow(NULL, 0, 0, 1, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_permute(NULL, perm, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_transpose(NULL, 0, 1, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_reshape(NULL, 2, shape, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_reshape_copy(NULL, 2, shape, &out), &out,
        &none);
  FAILS(IPCREF_EINVAL, ipcref_view_flatten(NULL, 0, -1, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_expand(NULL, 2, shape, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_squeeze(NULL, IPCREF_DIM_ALL, &out), &out,
        &none);
  FAILS(IPCREF_EINVAL, ipcref_view_unsqueeze(NULL, 0, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_flip(NULL, 0, &out), &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_as_strided(NULL, 2, shape, strides, 0, &out),
        &out, &none);
  FAILS(IPCREF_EINVAL, ipcref_view_contiguous(NULL, &out), &out, &none);
  CHECK_EQ(ipcref_view_copy(NULL, &v), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_copy(&v, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_copy(NULL, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_make_mut(NULL), IPCREF_EINVAL);
  CHECK(ipcref_view_data_mut(NULL) == NULL);
  CHECK(ipcref_view_data(NULL) == NULL);
  CHECK(ipcref_view_ptr(NULL, idx) == NULL);
  CHECK_EQ(ipcref_view_numel(NULL), 0);
  CHECK_EQ(ipcref_view_is_contiguous(NULL), 0);
  CHECK_EQ(ipcref_view_iter_init(NULL, &it), IPCREF_EINVAL);
  CHECK(ipcref_view_iter_next(NULL) == NULL);
  ipcref_view_release(NULL);
  ipcref_buf_set_shared_mut(NULL, 1);
  ipcref_buf_set_shared_mut(NULL, 0);

  /* NULL out. */
  FAILS_V(IPCREF_EINVAL, ipcref_view_clone(&v, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_slice(&v, 0, 0, 1, 1, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_select(&v, 0, 0, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_narrow(&v, 0, 0, 1, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_permute(&v, perm, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_transpose(&v, 0, 1, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_reshape(&v, 2, shape, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_reshape_copy(&v, 2, shape, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_flatten(&v, 0, -1, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_expand(&v, 2, shape, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_squeeze(&v, IPCREF_DIM_ALL, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_unsqueeze(&v, 0, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_flip(&v, 0, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_as_strided(&v, 2, shape, strides, 0, NULL),
          &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_contiguous(&v, NULL), &v);
  FAILS_V(IPCREF_EINVAL, ipcref_view_iter_init(&v, NULL), &v);

  /* NULL arrays. */
  FAILS(IPCREF_EINVAL, ipcref_view_permute(&v, NULL, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_reshape(&v, 2, NULL, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_reshape_copy(&v, 2, NULL, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_expand(&v, 2, NULL, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_as_strided(&v, 2, NULL, strides, 0, &out),
        &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_as_strided(&v, 2, shape, NULL, 0, &out),
        &out, &v);
  CHECK(ipcref_view_ptr(&v, NULL) == NULL);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), cnt);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ dims */

/* Two views are the same view: buffer, offset, dtype, shape, strides. */
static int same_view(const ipcref_view *a, const ipcref_view *b) {
  int d;
  if (a->buf != b->buf || a->byte_offset != b->byte_offset ||
      a->dtype != b->dtype || a->ndim != b->ndim)
    return 0;
  for (d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d] ||
        (a->shape[d] != 1 && a->strides[d] != b->strides[d]))
      return 0;
  return 1;
}

static void test_dims(void) {
  int64_t shape[3] = {2, 3, 4}, sq[3] = {2, 1, 4};
  ipcref_view v = iota(3, shape), s = iota(3, sq), out = garbage();
  ipcref_view a, b;
  int bad[6] = {3, -4, 99, -99, INT_MAX, INT_MIN};
  int i, d;

  /* Every negative dim in range wraps to the same result as its positive
   * form; every one out of range is EINVAL. */
  for (d = 0; d < 3; d++) {
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    CHECK_EQ(ipcref_view_slice(&v, d, 1, IPCREF_SLICE_MAX, 1, &a), IPCREF_OK);
    CHECK_EQ(ipcref_view_slice(&v, d - 3, 1, IPCREF_SLICE_MAX, 1, &b),
             IPCREF_OK);
    CHECK(same_view(&a, &b));
    CHECK_EQ(a.shape[d], shape[d] - 1);
    ipcref_view_release(&a);
    ipcref_view_release(&b);
    CHECK_EQ(ipcref_view_select(&v, d, 1, &a), IPCREF_OK);
    CHECK_EQ(ipcref_view_select(&v, d - 3, 1, &b), IPCREF_OK);
    CHECK(same_view(&a, &b));
    CHECK_EQ(a.ndim, 2);
    ipcref_view_release(&a);
    ipcref_view_release(&b);
    CHECK_EQ(ipcref_view_narrow(&v, d, 1, 1, &a), IPCREF_OK);
    CHECK_EQ(ipcref_view_narrow(&v, d - 3, 1, 1, &b), IPCREF_OK);
    CHECK(same_view(&a, &b));
    ipcref_view_release(&a);
    ipcref_view_release(&b);
    CHECK_EQ(ipcref_view_flip(&v, d, &a), IPCREF_OK);
    CHECK_EQ(ipcref_view_flip(&v, d - 3, &b), IPCREF_OK);
    CHECK(same_view(&a, &b));
    CHECK_EQ(a.strides[d], -v.strides[d]);
    ipcref_view_release(&a);
    ipcref_view_release(&b);
    CHECK_EQ(ipcref_view_transpose(&v, d, 0, &a), IPCREF_OK);
    CHECK_EQ(ipcref_view_transpose(&v, d - 3, -3, &b), IPCREF_OK);
    CHECK(same_view(&a, &b));
    ipcref_view_release(&a);
    ipcref_view_release(&b);
    CHECK_EQ(ipcref_view_flatten(&v, d, 2, &a), IPCREF_OK);
    CHECK_EQ(ipcref_view_flatten(&v, d - 3, -1, &b), IPCREF_OK);
    CHECK(same_view(&a, &b));
    CHECK_EQ(a.ndim, d + 1);
    ipcref_view_release(&a);
    ipcref_view_release(&b);
  }
  /* unsqueeze: 0..ndim, negative counts from the end of the result. */
  for (d = 0; d <= 3; d++) {
    CHECK_EQ(ipcref_view_unsqueeze(&v, d, &a), IPCREF_OK);
    CHECK_EQ(ipcref_view_unsqueeze(&v, d - 4, &b), IPCREF_OK);
    CHECK(same_view(&a, &b));
    CHECK_EQ(a.ndim, 4);
    CHECK_EQ(a.shape[d], 1);
    ipcref_view_release(&a);
    ipcref_view_release(&b);
  }
  /* squeeze of the size-1 dim, both ways. */
  CHECK_EQ(ipcref_view_squeeze(&s, 1, &a), IPCREF_OK);
  CHECK_EQ(ipcref_view_squeeze(&s, -2, &b), IPCREF_OK);
  CHECK(same_view(&a, &b));
  CHECK_EQ(a.ndim, 2);
  ipcref_view_release(&a);
  ipcref_view_release(&b);

  for (i = 0; i < 6; i++) {
    int x = bad[i];
    FAILS(IPCREF_EINVAL, ipcref_view_slice(&v, x, 0, 1, 1, &out), &out, &v);
    FAILS(IPCREF_EINVAL, ipcref_view_select(&v, x, 0, &out), &out, &v);
    FAILS(IPCREF_EINVAL, ipcref_view_narrow(&v, x, 0, 1, &out), &out, &v);
    FAILS(IPCREF_EINVAL, ipcref_view_flip(&v, x, &out), &out, &v);
    FAILS(IPCREF_EINVAL, ipcref_view_transpose(&v, x, 0, &out), &out, &v);
    FAILS(IPCREF_EINVAL, ipcref_view_transpose(&v, 0, x, &out), &out, &v);
    FAILS(IPCREF_EINVAL, ipcref_view_flatten(&v, x, -1, &out), &out, &v);
    FAILS(IPCREF_EINVAL, ipcref_view_flatten(&v, 0, x, &out), &out, &v);
    if (x != IPCREF_DIM_ALL)
      FAILS(IPCREF_EINVAL, ipcref_view_squeeze(&s, x, &out), &out, &s);
    /* in place too */
    FAILS(IPCREF_EINVAL, ipcref_view_flip(&v, x, &v), &v, &v);
  }
  /* unsqueeze: valid range is -(ndim+1)..ndim. */
  FAILS(IPCREF_EINVAL, ipcref_view_unsqueeze(&v, 4, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_unsqueeze(&v, -5, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_unsqueeze(&v, INT_MAX, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_unsqueeze(&v, IPCREF_DIM_ALL, &out), &out,
        &v);
  /* flatten: start after end. */
  FAILS(IPCREF_EINVAL, ipcref_view_flatten(&v, 2, 1, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_flatten(&v, -1, 0, &out), &out, &v);
  /* squeeze of a dim whose size is not 1. */
  FAILS(IPCREF_EINVAL, ipcref_view_squeeze(&s, 0, &out), &out, &s);
  FAILS(IPCREF_EINVAL, ipcref_view_squeeze(&s, -1, &out), &out, &s);
  FAILS(IPCREF_EINVAL, ipcref_view_squeeze(&s, 2, &s), &s, &s);
  /* squeeze with nothing to squeeze: a no-op view. */
  CHECK_EQ(ipcref_view_squeeze(&v, IPCREF_DIM_ALL, &a), IPCREF_OK);
  CHECK(same_view(&a, &v));
  ipcref_view_release(&a);
  /* step 0 */
  FAILS(IPCREF_EINVAL, ipcref_view_slice(&v, 0, 0, 2, 0, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_slice(&v, 0, 0, 2, 0, &v), &v, &v);

  /* A 0-d view has no dim to name. */
  {
    ipcref_view z = iota(0, shape);
    FAILS(IPCREF_EINVAL, ipcref_view_slice(&z, 0, 0, 1, 1, &out), &out, &z);
    FAILS(IPCREF_EINVAL, ipcref_view_select(&z, 0, 0, &out), &out, &z);
    FAILS(IPCREF_EINVAL, ipcref_view_select(&z, -1, 0, &out), &out, &z);
    FAILS(IPCREF_EINVAL, ipcref_view_flip(&z, 0, &out), &out, &z);
    FAILS(IPCREF_EINVAL, ipcref_view_unsqueeze(&z, 2, &out), &out, &z);
    /* flatten(v, 0, -1) of a 0-d view: 1-d with one element */
    CHECK_EQ(ipcref_view_flatten(&z, 0, -1, &a), IPCREF_OK);
    CHECK_EQ(a.ndim, 1);
    CHECK_EQ(a.shape[0], 1);
    ipcref_view_release(&a);
    CHECK_EQ(ipcref_view_unsqueeze(&z, -1, &a), IPCREF_OK);
    CHECK_EQ(a.ndim, 1);
    ipcref_view_release(&a);
    ipcref_view_release(&z);
  }
  ipcref_view_release(&v);
  ipcref_view_release(&s);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ indexes */

static void test_index_ranges(void) {
  int64_t shape[2] = {2, 3}, idx[2];
  ipcref_view v = iota(2, shape), out = garbage(), a;
  int64_t badsel[6] = {3, -4, INT64_MAX, INT64_MIN, INT64_MIN + 1, 1000};
  int i;
  for (i = 0; i < 6; i++) {
    FAILS(IPCREF_ERANGE, ipcref_view_select(&v, 1, badsel[i], &out), &out, &v);
    FAILS(IPCREF_ERANGE, ipcref_view_select(&v, 1, badsel[i], &v), &v, &v);
  }
  CHECK_EQ(ipcref_view_select(&v, 1, -3, &a), IPCREF_OK);
  idx[0] = 1;
  CHECK(*(float *)ipcref_view_ptr(&a, idx) == 3.0f);
  ipcref_view_release(&a);

  /* narrow: 0 <= start (after wrapping) and start + length <= size */
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, 4, 0, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, 2, 2, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, -4, 1, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, 0, -1, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, 0, 4, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, INT64_MAX, INT64_MAX, &out),
        &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, 1, INT64_MAX, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, INT64_MIN, 1, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, -1, INT64_MIN, &out), &out,
        &v);
  FAILS(IPCREF_ERANGE, ipcref_view_narrow(&v, 1, 3, 1, &v), &v, &v);
  CHECK_EQ(ipcref_view_narrow(&v, 1, 3, 0, &a), IPCREF_OK); /* empty, end */
  CHECK_EQ(ipcref_view_numel(&a), 0);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_narrow(&v, 1, -2, 2, &a), IPCREF_OK);
  CHECK(at(&a, 1, 0) == 4.0f && at(&a, 1, 1) == 5.0f);
  ipcref_view_release(&a);

  /* slice: hostile bounds and steps are clamped, never overflow. */
  CHECK_EQ(ipcref_view_slice(&v, 1, IPCREF_SLICE_MIN, IPCREF_SLICE_MAX, 1, &a),
           IPCREF_OK);
  CHECK(same_view(&a, &v));
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_slice(&v, 1, IPCREF_SLICE_MAX, IPCREF_SLICE_MIN, -1, &a),
           IPCREF_OK);
  CHECK_EQ(a.shape[1], 3);
  CHECK(at(&a, 0, 0) == 2.0f && at(&a, 1, 2) == 3.0f);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_slice(&v, 1, 0, IPCREF_SLICE_MAX, INT64_MAX, &a),
           IPCREF_OK);
  CHECK_EQ(a.shape[1], 1);
  CHECK(at(&a, 1, 0) == 3.0f);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_slice(&v, 1, IPCREF_SLICE_MAX, IPCREF_SLICE_MIN,
                             INT64_MIN, &a),
           IPCREF_OK);
  CHECK_EQ(a.shape[1], 1);
  CHECK(at(&a, 1, 0) == 5.0f);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_slice(&v, 1, INT64_MIN, INT64_MIN, -1, &a), IPCREF_OK);
  CHECK_EQ(a.shape[1], 0);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_slice(&v, 1, 10, -10, 1, &a), IPCREF_OK);
  CHECK_EQ(a.shape[1], 0);
  ipcref_view_release(&a);

  /* ptr: each index 0 <= i < shape. */
  idx[0] = 0, idx[1] = 3;
  CHECK(ipcref_view_ptr(&v, idx) == NULL);
  idx[0] = 2, idx[1] = 0;
  CHECK(ipcref_view_ptr(&v, idx) == NULL);
  idx[0] = -1, idx[1] = 0;
  CHECK(ipcref_view_ptr(&v, idx) == NULL);
  idx[0] = 0, idx[1] = INT64_MIN;
  CHECK(ipcref_view_ptr(&v, idx) == NULL);
  idx[0] = INT64_MAX, idx[1] = INT64_MAX;
  CHECK(ipcref_view_ptr(&v, idx) == NULL);
  idx[0] = 1, idx[1] = 2;
  CHECK(ipcref_view_ptr(&v, idx) == (char *)ipcref_buf_data(v.buf) + 20);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ permute */

static void test_permute_bad(void) {
  int64_t shape[3] = {2, 3, 4};
  ipcref_view v = iota(3, shape), out = garbage(), a, b;
  int dup[3] = {0, 0, 1}, oor[3] = {0, 1, 3}, oorn[3] = {0, 1, -4};
  int dupn[3] = {2, -1, 0}, huge[3] = {0, 1, INT_MIN}, ok[3] = {2, 0, 1};
  int okn[3] = {-1, -3, -2};
  FAILS(IPCREF_EINVAL, ipcref_view_permute(&v, dup, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_permute(&v, oor, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_permute(&v, oorn, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_permute(&v, dupn, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_permute(&v, huge, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_permute(&v, dup, &v), &v, &v);
  CHECK_EQ(ipcref_view_permute(&v, ok, &a), IPCREF_OK);
  CHECK_EQ(ipcref_view_permute(&v, okn, &b), IPCREF_OK);
  CHECK(same_view(&a, &b));
  CHECK_EQ(a.shape[0], 4);
  CHECK_EQ(a.shape[1], 2);
  CHECK_EQ(a.shape[2], 3);
  ipcref_view_release(&a);
  ipcref_view_release(&b);
  ipcref_view_release(&v);
}

/* ------------------------------------------------------------------ reshape */

static void test_reshape_bad(void) {
  int64_t shape[2] = {4, 6}, s23[2] = {2, 3}, s5[1] = {5}, two[2] = {-1, -1};
  int64_t neg2[2] = {-2, -12}, inf[2] = {5, -1}, ovf[2] = {INT64_MAX, 2};
  int64_t ovf2[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 0}, ok[3] = {2, -1, 3};
  int64_t shape9[MAXD + 1], flat[1] = {24};
  ipcref_view v = iota(2, shape), out = garbage(), t, a;
  int i;
  for (i = 0; i <= MAXD; i++) shape9[i] = 1;
  shape9[0] = 24;
  /* The element count differs: the doc allows either code. */
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, 2, s23, &out),
         &out, &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, 1, s5, &out),
         &out, &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, 2, inf, &out),
         &out, &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, 0, s5, &out),
         &out, &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL,
         ipcref_view_reshape_copy(&v, 2, s23, &out), &out, &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, 2, ovf, &out),
         &out, &v);
  /* {2^40, 2^40, 0} has 0 elements, not 24 (and no overflow on the way). */
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, 3, ovf2, &out),
         &out, &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, 2, s23, &v), &v,
         &v);
  /* Two -1s. */
  FAILS(IPCREF_EINVAL, ipcref_view_reshape(&v, 2, two, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_reshape_copy(&v, 2, two, &out), &out, &v);
  /* A negative size other than -1. */
  FAILS(IPCREF_ERANGE, ipcref_view_reshape(&v, 2, neg2, &out), &out, &v);
  /* Too many dims. */
  FAILS(IPCREF_ERANGE, ipcref_view_reshape(&v, MAXD + 1, shape9, &out), &out,
        &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_reshape(&v, -1, flat, &out),
         &out, &v);
  /* A -1 that is inferred. */
  CHECK_EQ(ipcref_view_reshape(&v, 3, ok, &a), IPCREF_OK);
  CHECK_EQ(a.shape[1], 4);
  CHECK(a.buf == v.buf);
  ipcref_view_release(&a);

  /* Not possible without a copy: ENEEDCOPY, and reshape_copy copies. */
  memset(&t, 0, sizeof t);
  CHECK_EQ(ipcref_view_transpose(&v, 0, 1, &t), IPCREF_OK);
  FAILS(IPCREF_ENEEDCOPY, ipcref_view_reshape(&t, 1, flat, &out), &out, &t);
  FAILS(IPCREF_ENEEDCOPY, ipcref_view_reshape(&t, 1, flat, &t), &t, &t);
  FAILS(IPCREF_ENEEDCOPY, ipcref_view_flatten(&t, 0, -1, &out), &out, &t);
  CHECK_EQ(ipcref_view_reshape_copy(&t, 1, flat, &a), IPCREF_OK);
  CHECK(a.buf != v.buf);
  CHECK_EQ(ipcref_view_is_contiguous(&a), 1);
  CHECK(at(&a, 0, 0) == 0.0f); /* 1-d: idx[1] ignored */
  {
    int64_t k;
    for (k = 0; k < 24; k++) {
      int64_t idx[1];
      idx[0] = k;
      /* t[i][j] = v[j][i] = j * 6 + i, C order over t's (6, 4) */
      CHECK(*(float *)ipcref_view_ptr(&a, idx) == (float)((k % 4) * 6 + k / 4));
    }
  }
  ipcref_view_release(&a);
  /* reshape_copy when out of memory: nothing changes. */
  fail_next_alloc = 1;
  FAILS(IPCREF_ENOMEM, ipcref_view_reshape_copy(&t, 1, flat, &out), &out, &t);
  fail_next_alloc = 1;
  FAILS(IPCREF_ENOMEM, ipcref_view_reshape_copy(&t, 1, flat, &t), &t, &t);
  fail_next_alloc = 1;
  FAILS(IPCREF_ENOMEM, ipcref_view_contiguous(&t, &out), &out, &t);
  fail_next_alloc = 0;
  ipcref_view_release(&t);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ expand */

static void test_expand_bad(void) {
  int64_t shape[2] = {1, 3}, bad1[2] = {2, 4}, ok[3] = {5, 4, 3};
  int64_t newneg[3] = {-1, 1, 3}, neg2[2] = {-2, 3}, less[1] = {3};
  int64_t ovf[3] = {INT64_MAX, 2, 3},
          ovf2[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 3};
  int64_t shape9[MAXD + 1], one[1] = {1}, big[1] = {INT64_MAX};
  int64_t bigf[1] = {INT64_MAX / 2};
  ipcref_view v = iota(2, shape), out = garbage(), a, u;
  int i;
  for (i = 0; i <= MAXD; i++) shape9[i] = 1;
  shape9[MAXD] = 3;
  FAILS(IPCREF_EINVAL, ipcref_view_expand(&v, 2, bad1, &out), &out, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_expand(&v, 2, bad1, &v), &v, &v);
  FAILS(IPCREF_EINVAL, ipcref_view_expand(&v, 1, less, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_expand(&v, MAXD + 1, shape9, &out), &out,
        &v);
  /* either: -1 for a new dim has no size to keep */
  FAILS2(IPCREF_EINVAL, IPCREF_ERANGE, ipcref_view_expand(&v, 3, newneg, &out),
         &out, &v);
  /* either: -2 is a negative size, or not an expansion */
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL, ipcref_view_expand(&v, 2, neg2, &out),
         &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_expand(&v, 3, ovf, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_expand(&v, 3, ovf2, &out), &out, &v);
  CHECK_EQ(ipcref_view_expand(&v, 3, ok, &a), IPCREF_OK);
  CHECK_EQ(a.strides[0], 0);
  CHECK_EQ(a.strides[1], 0);
  CHECK_EQ(ipcref_view_numel(&a), 60);
  CHECK_EQ(ipcref_view_is_contiguous(&a), 0);
  /* A broadcast destination cannot be written. */
  ipcref_buf_set_shared_mut(v.buf, 1);
  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&a, &v), &a);
  ipcref_buf_set_shared_mut(v.buf, 0);
  ipcref_view_release(&a);

  /* One u8 broadcast to INT64_MAX elements: the count and the bytes fit,
   * so it is a view; materializing it cannot be done. */
  memset(&u, 0, sizeof u);
  CHECK_EQ(ipcref_view_new(IPCREF_U8, 1, one, &u), IPCREF_OK);
  CHECK_EQ(ipcref_view_expand(&u, 1, big, &a), IPCREF_OK);
  CHECK_EQ(ipcref_view_numel(&a), INT64_MAX);
  {
    int64_t idx[1] = {INT64_MAX - 1};
    CHECK(ipcref_view_ptr(&a, idx) == ipcref_buf_data(u.buf));
    idx[0] = INT64_MAX;
    CHECK(ipcref_view_ptr(&a, idx) == NULL);
  }
  FAILS2(IPCREF_ERANGE, IPCREF_ENOMEM, ipcref_view_contiguous(&a, &out), &out,
         &a);
  ipcref_view_release(&a);
  ipcref_view_release(&u);
  /* As f32 the same count is more bytes than int64 holds. */
  memset(&u, 0, sizeof u);
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 1, one, &u), IPCREF_OK);
  FAILS(IPCREF_ERANGE, ipcref_view_expand(&u, 1, bigf, &out), &out, &u);
  ipcref_view_release(&u);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ unsqueeze
 * at the limit */

static void test_max_dims(void) {
  int64_t shape[MAXD];
  ipcref_view v, out = garbage(), a;
  int i;
  for (i = 0; i < MAXD; i++) shape[i] = 1;
  v = iota(MAXD, shape);
  FAILS(IPCREF_ERANGE, ipcref_view_unsqueeze(&v, 0, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_unsqueeze(&v, -1, &out), &out, &v);
  FAILS(IPCREF_ERANGE, ipcref_view_unsqueeze(&v, 0, &v), &v, &v);
  CHECK_EQ(ipcref_view_squeeze(&v, 3, &a), IPCREF_OK);
  CHECK_EQ(a.ndim, MAXD - 1);
  CHECK_EQ(ipcref_view_unsqueeze(&a, -1, &a), IPCREF_OK);
  CHECK_EQ(a.ndim, MAXD);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_squeeze(&v, IPCREF_DIM_ALL, &a), IPCREF_OK);
  CHECK_EQ(a.ndim, 0);
  CHECK_EQ(ipcref_view_numel(&a), 1);
  ipcref_view_release(&a);
  ipcref_view_release(&v);
}

/* ------------------------------------------------------------------ as_strided
 */

static void test_as_strided_bad(void) {
  int64_t n10[1] = {10}, s1[1] = {1}, sh[2], st[2];
  ipcref_view v = iota(1, n10), out = garbage(), a;
  int64_t shape9[MAXD + 1], strides9[MAXD + 1];
  int i;
  for (i = 0; i <= MAXD; i++) shape9[i] = 1, strides9[i] = 0;

  /* Past the end. */
  sh[0] = 11;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, s1, 0, &out), &out,
        &v);
  sh[0] = 2, st[0] = 9;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, st, 4, &out), &out,
        &v);
  sh[0] = 1;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, s1, 40, &out), &out,
        &v);
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 0, sh, s1, 40, &out), &out,
        &v);
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, s1, 40, &v), &v, &v);
  /* Before the start. */
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, s1, -4, &out), &out,
        &v);
  sh[0] = 2, st[0] = -1;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, st, 0, &out), &out,
        &v);
  sh[0] = 2, sh[1] = 2, st[0] = 1, st[1] = -3;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 2, sh, st, 8, &out), &out,
        &v);
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, s1, INT64_MIN, &out),
        &out, &v);
  FAILS(IPCREF_ERANGE,
        ipcref_view_as_strided(&v, 1, sh, s1, INT64_MAX - 3, &out), &out, &v);
  /* Misaligned (not a multiple of 4). */
  sh[0] = 1;
  FAILS(IPCREF_EINVAL, ipcref_view_as_strided(&v, 1, sh, s1, 2, &out), &out,
        &v);
  FAILS(IPCREF_EINVAL, ipcref_view_as_strided(&v, 1, sh, s1, 1, &out), &out,
        &v);
  /* Huge strides whose products or sums overflow. */
  sh[0] = 2, st[0] = INT64_MAX;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, st, 0, &out), &out,
        &v);
  st[0] = INT64_MIN;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, st, 36, &out), &out,
        &v);
  sh[0] = 3, st[0] = INT64_MAX / 2 + 1;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, st, 0, &out), &out,
        &v);
  sh[0] = 2, sh[1] = 2, st[0] = INT64_MAX / 4 + 1, st[1] = INT64_MAX / 4 + 1;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 2, sh, st, 0, &out), &out,
        &v);
  /* Strides that cancel in the sum still reach far outside. */
  st[0] = INT64_MAX / 8, st[1] = -(INT64_MAX / 8);
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 2, sh, st, 0, &out), &out,
        &v);
  /* Byte offsets of elements overflow (stride * 4). */
  sh[0] = 2, st[0] = INT64_MAX / 3;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, st, 0, &out), &out,
        &v);
  /* Shapes. */
  sh[0] = -1, st[0] = 1;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 1, sh, st, 0, &out), &out,
        &v);
  sh[0] = INT64_MAX, sh[1] = 2, st[0] = 0, st[1] = 0;
  FAILS(IPCREF_ERANGE, ipcref_view_as_strided(&v, 2, sh, st, 0, &out), &out,
        &v);
  FAILS(IPCREF_ERANGE,
        ipcref_view_as_strided(&v, MAXD + 1, shape9, strides9, 0, &out), &out,
        &v);
  FAILS2(IPCREF_ERANGE, IPCREF_EINVAL,
         ipcref_view_as_strided(&v, -1, shape9, strides9, 0, &out), &out, &v);

  /* Within bounds, the edges are fine. */
  sh[0] = 10;
  CHECK_EQ(ipcref_view_as_strided(&v, 1, sh, s1, 0, &a), IPCREF_OK);
  ipcref_view_release(&a);
  sh[0] = 2, st[0] = -1;
  CHECK_EQ(ipcref_view_as_strided(&v, 1, sh, st, 4, &a), IPCREF_OK);
  CHECK(at(&a, 1, 0) == 0.0f);
  ipcref_view_release(&a);
  sh[0] = 1;
  CHECK_EQ(ipcref_view_as_strided(&v, 0, sh, st, 36, &a), IPCREF_OK);
  CHECK(*(float *)ipcref_view_ptr(&a, sh) == 9.0f);
  ipcref_view_release(&a);
  /* A stride on a dim of size 1 is never used: no element lies outside. */
  sh[0] = 1, st[0] = INT64_MAX;
  CHECK_EQ(ipcref_view_as_strided(&v, 1, sh, st, 36, &a), IPCREF_OK);
  CHECK(at(&a, 0, 0) == 9.0f);
  ipcref_view_release(&a);
  /* An element repeated (stride 0) and overlapping rows. */
  sh[0] = 1000, sh[1] = 3, st[0] = 0, st[1] = 1;
  CHECK_EQ(ipcref_view_as_strided(&v, 2, sh, st, 28, &a), IPCREF_OK);
  CHECK(at(&a, 999, 2) == 9.0f);
  ipcref_view_release(&a);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ copy */

static void test_copy_bad(void) {
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s13[2] = {1, 3}, s2[1] = {2};
  int64_t s3[1] = {3}, s123[3] = {1, 2, 3}, s4[1] = {4};
  ipcref_view dst = iota(2, s23), src32 = iota(2, s32), src13 = iota(2, s13);
  ipcref_view src2 = iota(1, s2), src3 = iota(1, s3), src123 = iota(3, s123);
  ipcref_view i32, keep, z;
  ipcref_weak *w;
  float before[6];
  memset(&i32, 0, sizeof i32);
  CHECK_EQ(ipcref_view_new(IPCREF_I32, 2, s23, &i32), IPCREF_OK);
  memset(ipcref_view_data_mut(&i32), 0, 24);
  memcpy(before, ipcref_buf_data(dst.buf), sizeof before);

  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&dst, &i32), &dst); /* dtype */
  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&dst, &src32), &dst);
  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&dst, &src2), &dst);
  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&dst, &src123), &dst);
  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&src2, &src3), &src2);
  CHECK(memcmp(before, ipcref_buf_data(dst.buf), sizeof before) == 0);

  /* Broadcasting from (1, 3) and (3,) is fine. */
  CHECK_EQ(ipcref_view_copy(&dst, &src13), IPCREF_OK);
  CHECK(at(&dst, 1, 2) == 2.0f && at(&dst, 0, 1) == 1.0f);
  CHECK_EQ(ipcref_view_copy(&dst, &src3), IPCREF_OK);
  CHECK(at(&dst, 1, 0) == 0.0f);
  /* A 0-d source fills everything. */
  memset(&z, 0, sizeof z);
  CHECK_EQ(ipcref_view_select(&src3, 0, 2, &z), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&dst, &z), IPCREF_OK);
  CHECK(at(&dst, 0, 0) == 2.0f && at(&dst, 1, 2) == 2.0f);
  ipcref_view_release(&z);

  /* Shared dst: EBUSY until the buffer is opened for shared writes. */
  memcpy(ipcref_view_data_mut(&dst), before, sizeof before);
  memset(&keep, 0, sizeof keep);
  CHECK_EQ(ipcref_view_clone(&dst, &keep), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&dst) == NULL);
  FAILS_V(IPCREF_EBUSY, ipcref_view_copy(&dst, &src13), &dst);
  FAILS_V(IPCREF_EBUSY, ipcref_view_copy(&keep, &src13), &keep);
  CHECK(memcmp(before, ipcref_buf_data(dst.buf), sizeof before) == 0);
  ipcref_buf_set_shared_mut(dst.buf, 1);
  CHECK(ipcref_view_data_mut(&dst) == ipcref_buf_data(dst.buf));
  CHECK(ipcref_view_data_mut(&keep) == ipcref_buf_data(dst.buf));
  CHECK_EQ(ipcref_view_copy(&dst, &src13), IPCREF_OK);
  CHECK(at(&keep, 1, 1) == 1.0f);
  ipcref_buf_set_shared_mut(dst.buf, 0);
  FAILS_V(IPCREF_EBUSY, ipcref_view_copy(&dst, &src3), &dst);
  ipcref_view_release(&keep);
  CHECK_EQ(ipcref_view_copy(&dst, &src3), IPCREF_OK); /* unique again */

  /* A weak reference makes the buffer not uniquely owned. */
  w = ipcref_buf_downgrade(dst.buf);
  FAILS_V(IPCREF_EBUSY, ipcref_view_copy(&dst, &src13), &dst);
  CHECK(ipcref_view_data_mut(&dst) == NULL);
  ipcref_weak_release(w);
  CHECK(ipcref_view_data_mut(&dst) != NULL);

  /* Empty views copy nothing but still check shapes. */
  {
    ipcref_view e1 = garbage(), e2 = garbage();
    int64_t s0[2] = {0, 3};
    CHECK_EQ(ipcref_view_new(IPCREF_F32, 2, s0, &e1), IPCREF_OK);
    CHECK_EQ(ipcref_view_new(IPCREF_F32, 1, s4, &e2), IPCREF_OK);
    CHECK_EQ(ipcref_view_copy(&e1, &src3), IPCREF_OK);
    FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&e1, &e2), &e1);
    ipcref_view_release(&e1);
    ipcref_view_release(&e2);
  }
  ipcref_view_release(&dst);
  ipcref_view_release(&src32);
  ipcref_view_release(&src13);
  ipcref_view_release(&src2);
  ipcref_view_release(&src3);
  ipcref_view_release(&src123);
  ipcref_view_release(&i32);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ writing */

static void test_data_mut_make_mut(void) {
  int64_t shape[2] = {3, 4};
  ipcref_view v = iota(2, shape), c, t, before;
  ipcref_buf *old;
  long allocs;
  float *p;

  /* Unique: writable; make_mut does nothing and allocates nothing. */
  CHECK(ipcref_view_data_mut(&v) == ipcref_buf_data(v.buf));
  before = v;
  allocs = total_allocs;
  CHECK_EQ(ipcref_view_make_mut(&v), IPCREF_OK);
  CHECK(memcmp(&before, &v, sizeof v) == 0);
  CHECK_EQ(total_allocs, allocs);

  /* data_mut returns element (0,...,0), not the buffer start. */
  memset(&c, 0, sizeof c);
  CHECK_EQ(ipcref_view_slice(&v, 0, 1, IPCREF_SLICE_MAX, 1, &v), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&v) == (char *)ipcref_buf_data(v.buf) + 16);

  /* Shared: not writable; make_mut copies the viewed elements. The data
   * stays readable (ipcref_view_data: element (0,...,0)). */
  CHECK_EQ(ipcref_view_transpose(&v, 0, 1, &t), IPCREF_OK); /* (4, 2) */
  CHECK(ipcref_view_data_mut(&v) == NULL);
  CHECK(ipcref_view_data_mut(&t) == NULL);
  CHECK(ipcref_view_data(&v) == (char *)ipcref_buf_data(v.buf) + 16);
  CHECK(ipcref_view_data(&t) == ipcref_view_data(&v));
  old = t.buf;
  CHECK_EQ(ipcref_view_make_mut(&t), IPCREF_OK);
  CHECK(t.buf != old);
  CHECK_EQ(ipcref_buf_strong_count(old), 1);
  CHECK_EQ(ipcref_buf_strong_count(t.buf), 1);
  CHECK_EQ(t.ndim, 2);
  CHECK_EQ(t.shape[0], 4);
  CHECK_EQ(t.shape[1], 2);
  CHECK_EQ(ipcref_view_is_contiguous(&t), 1);
  CHECK(at(&t, 0, 0) == 4.0f && at(&t, 3, 1) == 11.0f && at(&t, 2, 1) == 10.0f);
  p = (float *)ipcref_view_data_mut(&t);
  CHECK(p != NULL);
  if (p) *p = -5.0f; /* independent of the original */
  CHECK(at(&v, 0, 0) == 4.0f);
  CHECK(at(&t, 0, 0) == -5.0f);
  CHECK(ipcref_view_data_mut(&v) != NULL); /* v is unique again */

  /* make_mut out of memory: v unchanged. */
  CHECK_EQ(ipcref_view_clone(&t, &c), IPCREF_OK);
  before = c;
  fail_next_alloc = 1;
  CHECK_EQ(ipcref_view_make_mut(&c), IPCREF_ENOMEM);
  fail_next_alloc = 0;
  CHECK(memcmp(&before, &c, sizeof c) == 0);
  CHECK_EQ(ipcref_buf_strong_count(t.buf), 2);

  /* Opened for shared writes: writable, make_mut does nothing. */
  ipcref_buf_set_shared_mut(t.buf, 1);
  CHECK(ipcref_view_data_mut(&c) != NULL);
  allocs = total_allocs;
  CHECK_EQ(ipcref_view_make_mut(&c), IPCREF_OK);
  CHECK(memcmp(&before, &c, sizeof c) == 0);
  CHECK_EQ(total_allocs, allocs);
  ipcref_buf_set_shared_mut(t.buf, 0);
  CHECK(ipcref_view_data_mut(&c) == NULL);
  ipcref_view_release(&c);

  /* contiguous() of a non-contiguous view is an independent copy. */
  CHECK_EQ(ipcref_view_transpose(&v, 0, 1, &c), IPCREF_OK);
  CHECK_EQ(ipcref_view_contiguous(&c, &c), IPCREF_OK);
  CHECK(c.buf != v.buf);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);
  p = (float *)ipcref_view_data_mut(&c);
  CHECK(p != NULL);
  if (p) p[0] = 99.0f;
  CHECK(at(&v, 0, 0) == 4.0f);
  ipcref_view_release(&c);
  /* contiguous() of a contiguous view shares the storage. */
  CHECK_EQ(ipcref_view_contiguous(&v, &c), IPCREF_OK);
  CHECK(c.buf == v.buf);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 2);
  ipcref_view_release(&c);

  ipcref_view_release(&t);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ tampered
 * views */

/* Every operation on `t`, an invalid view, fails with EINVAL and changes
 * nothing; the queries say NULL / 0. `good` is a valid view to pair with. */
static void all_ops_refuse(ipcref_view *t, const ipcref_view *good) {
  ipcref_view out = garbage(), g = *good;
  ipcref_view_iter it;
  int64_t idx[MAXD], shape[2] = {2, 6}, strides[2] = {6, 1}, e[3] = {2, 3, 4};
  int perm[MAXD] = {1, 0, 2, 3, 4, 5, 6, 7};
  memset(idx, 0, sizeof idx);
  FAILS(IPCREF_EINVAL, ipcref_view_clone(t, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_slice(t, 0, 0, 1, 1, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_select(t, 0, 0, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_narrow(t, 0, 0, 1, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_permute(t, perm, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_transpose(t, 0, 1, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_reshape(t, 2, shape, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_reshape_copy(t, 2, shape, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_flatten(t, 0, -1, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_expand(t, 3, e, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_squeeze(t, IPCREF_DIM_ALL, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_unsqueeze(t, 0, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_flip(t, 0, &out), &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_as_strided(t, 2, shape, strides, 0, &out),
        &out, t);
  FAILS(IPCREF_EINVAL, ipcref_view_contiguous(t, &out), &out, t);
  /* in place */
  FAILS(IPCREF_EINVAL, ipcref_view_slice(t, 0, 0, 1, 1, t), t, t);
  FAILS(IPCREF_EINVAL, ipcref_view_clone(t, t), t, t);
  FAILS(IPCREF_EINVAL, ipcref_view_contiguous(t, t), t, t);
  FAILS(IPCREF_EINVAL, ipcref_view_flatten(t, 0, -1, t), t, t);
  FAILS(IPCREF_EINVAL, ipcref_view_as_strided(t, 2, shape, strides, 0, t), t,
        t);
  FAILS_V(IPCREF_EINVAL, ipcref_view_make_mut(t), t);
  FAILS_V(IPCREF_EINVAL, ipcref_view_iter_init(t, &it), t);
  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(t, &g), t);
  FAILS_V(IPCREF_EINVAL, ipcref_view_copy(&g, t), &g);
  CHECK(ipcref_view_ptr(t, idx) == NULL);
  CHECK(ipcref_view_data_mut(t) == NULL);
  CHECK(ipcref_view_data(t) == NULL);
  CHECK_EQ(ipcref_view_numel(t), 0);
  CHECK_EQ(ipcref_view_is_contiguous(t), 0);
}

static void test_tampered(void) {
  int64_t shape[2] = {3, 4};
  ipcref_view v = iota(2, shape), good = iota(2, shape), t;
  float data_before[12];
  size_t cnt;
  int k, fails;
  /* Let the good view's buffer be writable whatever its count. */
  ipcref_buf_set_shared_mut(good.buf, 1);
  memcpy(data_before, ipcref_buf_data(v.buf), sizeof data_before);
  cnt = ipcref_buf_strong_count(v.buf);
  for (k = 0; k < 22; k++) {
    t = v; /* a copy of the struct: no reference of its own */
    switch (k) {
    case 0: t.shape[0] = 4; break; /* bigger than the buffer */
    case 1: t.byte_offset = -4; break;
    case 2: t.byte_offset = 48; break; /* past the end */
    case 3: t.byte_offset = 4; break;  /* the last element falls off */
    case 4: t.byte_offset = INT64_MAX - 3; break;
    case 5: t.byte_offset = INT64_MIN; break;
    case 6: t.ndim = 99; break;
    case 7: t.ndim = -1; break;
    case 8: t.ndim = MAXD + 1; break;
    case 9: t.buf = NULL; break;
    case 10: t.dtype = (ipcref_dtype)1000; break;
    case 11: t.dtype = (ipcref_dtype)-1; break;
    case 12: t.dtype = IPCREF_DTYPE_COUNT; break;
    case 13: t.dtype = IPCREF_F64; break; /* twice the bytes */
    case 14: t.shape[1] = -1; break;
    case 15: t.strides[0] = INT64_MAX; break;
    case 16: t.strides[1] = -1; break; /* reaches before the start */
    case 17:
      t.shape[0] = INT64_MAX; /* count overflows although all alias */
      t.strides[0] = 0;
      t.strides[1] = 0;
      break;
    case 18: t.strides[0] = INT64_MAX / 4 + 1; break; /* bytes overflow */
    case 19: t.shape[1] = INT64_MIN; break;
    case 20: t.strides[0] = INT64_MIN; break;
    default:
      t.ndim = 1; /* 12 elements of stride 2 */
      t.shape[0] = 12;
      t.strides[0] = 2;
      break;
    }
    fails = harness_failures_in_test;
    all_ops_refuse(&t, &good);
    CHECK_EQ(ipcref_buf_strong_count(v.buf), cnt);
    if (harness_failures_in_test != fails)
      printf("    (the failures above: tampered case %d)\n", k);
  }
  CHECK(memcmp(data_before, ipcref_buf_data(v.buf), sizeof data_before) == 0);

  /* A zeroed view is empty: every operation refuses it, release ignores it,
   * as many times as asked. */
  memset(&t, 0, sizeof t);
  all_ops_refuse(&t, &good);
  ipcref_view_release(&t);
  ipcref_view_release(&t);
  memset(&t, 0, sizeof t);
  {
    ipcref_view z;
    memset(&z, 0, sizeof z);
    CHECK(memcmp(&t, &z, sizeof t) == 0);
  }

  /* Double release: the second is a no-op, the count drops once. */
  CHECK_EQ(ipcref_view_clone(&v, &t), IPCREF_OK);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 2);
  ipcref_view_release(&t);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);
  CHECK(t.buf == NULL);
  ipcref_view_release(&t);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);

  /* clone in place: the reference moves, the count stays. */
  CHECK_EQ(ipcref_view_clone(&v, &v), IPCREF_OK);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);

  ipcref_view_release(&v);
  ipcref_view_release(&good);
  CHECK_EQ(live_allocs, 0);
}

/* ------------------------------------------------------------------ iterator
 */

static void test_iter_edges(void) {
  int64_t shape[2] = {0, 3}, one[1] = {1};
  ipcref_view e = iota(2, shape), s = iota(0, one);
  ipcref_view_iter it;
  CHECK_EQ(ipcref_view_iter_init(&e, &it), IPCREF_OK);
  CHECK(ipcref_view_iter_next(&it) == NULL);
  CHECK(ipcref_view_iter_next(&it) == NULL);
  CHECK_EQ(ipcref_view_iter_init(&s, &it), IPCREF_OK);
  CHECK(ipcref_view_iter_next(&it) == ipcref_buf_data(s.buf));
  CHECK(ipcref_view_iter_next(&it) == NULL);
  CHECK(ipcref_view_iter_next(&it) == NULL);
  CHECK_EQ(ipcref_view_is_contiguous(&e), 1);
  CHECK_EQ(ipcref_view_numel(&e), 0);
  ipcref_view_release(&e);
  ipcref_view_release(&s);
}

/* Strides whose shape * stride overflows int64 although the view is valid
 * ((shape-1) * stride is what it reaches): 2x2 u8 over 2^62 + 2 bytes of
 * device memory (addresses only, never dereferenced). The iterator visits
 * each element once, in C order, with no overflow on the way (UBSan
 * watches: a wrapping dim steps back by (shape-1) strides). */
static void test_iter_huge_strides(void) {
  ipcref_device dev = {IPCREF_DEVICE_CUDA, 0};
  int64_t big = (int64_t)1 << 62, one[1] = {1}, shape[2] = {2, 2};
  int64_t strides[2] = {1, big}, row[2] = {1, 1};
  uintptr_t base = 0x10000;
  ipcref_buf *b = NULL;
  ipcref_view first, v;
  ipcref_view_iter it;
  CHECK_EQ(ipcref_buf_wrap_device((void *)base, (size_t)big + 2, dev, NULL,
                                  NULL, &b),
           IPCREF_OK);
  if (!b) return;
  CHECK_EQ(ipcref_view_of(b, IPCREF_U8, 1, one, &first), IPCREF_OK);
  CHECK_EQ(ipcref_view_as_strided(&first, 2, shape, strides, 0, &v), IPCREF_OK);
  CHECK((uintptr_t)ipcref_view_ptr(&v, row) == base + 1 + (uintptr_t)big);
  CHECK_EQ(ipcref_view_iter_init(&v, &it), IPCREF_OK);
  CHECK((uintptr_t)ipcref_view_iter_next(&it) == base);
  CHECK((uintptr_t)ipcref_view_iter_next(&it) == base + (uintptr_t)big);
  CHECK((uintptr_t)ipcref_view_iter_next(&it) == base + 1);
  CHECK((uintptr_t)ipcref_view_iter_next(&it) == base + 1 + (uintptr_t)big);
  CHECK(ipcref_view_iter_next(&it) == NULL);
  ipcref_view_release(&v);
  ipcref_view_release(&first);
  ipcref_buf_release(b);
}

/* ------------------------------------------------------------------ empty
 * views */

/* A view with no elements: ops on it give empty views that are still
 * valid (whatever offset the elements would have had), and the strides of
 * an empty view, which may be huge, never enter any arithmetic that could
 * overflow (UBSan watches). */
static void expect_empty_ok(const ipcref_view *e) {
  ipcref_view a, b;
  ipcref_view_iter it;
  int64_t zero[1] = {0};
  int fails = harness_failures_in_test, d;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  CHECK_EQ(ipcref_view_numel(e), 0);
  CHECK_EQ(ipcref_view_is_contiguous(e), 1);
  CHECK_EQ(ipcref_view_iter_init(e, &it), IPCREF_OK);
  CHECK(ipcref_view_iter_next(&it) == NULL);
  CHECK_EQ(ipcref_view_clone(e, &a), IPCREF_OK);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_reshape(e, 1, zero, &a), IPCREF_OK);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_contiguous(e, &a), IPCREF_OK);
  CHECK_EQ(ipcref_view_numel(&a), 0);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_reshape_copy(e, 1, zero, &a), IPCREF_OK);
  ipcref_view_release(&a);
  CHECK_EQ(ipcref_view_new(e->dtype, e->ndim, e->shape, &b), IPCREF_OK);
  ipcref_buf_set_shared_mut(b.buf, 1);
  CHECK_EQ(ipcref_view_copy(&b, e), IPCREF_OK);
  ipcref_view_release(&b);
  if (harness_failures_in_test != fails) {
    printf(
        "    (the failures above: a view at byte %lld of %lld, shape/strides",
        (long long)e->byte_offset, (long long)ipcref_buf_size(e->buf));
    for (d = 0; d < e->ndim; d++)
      printf(" %lld/%lld", (long long)e->shape[d], (long long)e->strides[d]);
    printf(")\n");
  }
}

/* Every one-dim op on every dim of the empty view `e`: any result must be
 * a valid empty view. */
static void empty_ops(const ipcref_view *e) {
  ipcref_view a;
  int d;
  memset(&a, 0, sizeof a);
  expect_empty_ok(e);
  for (d = 0; d < e->ndim; d++) {
    int64_t len = e->shape[d];
    CHECK_EQ(ipcref_view_flip(e, d, &a), IPCREF_OK);
    expect_empty_ok(&a);
    ipcref_view_release(&a);
    CHECK_EQ(ipcref_view_slice(e, d, 1, IPCREF_SLICE_MAX, 1, &a), IPCREF_OK);
    expect_empty_ok(&a);
    ipcref_view_release(&a);
    CHECK_EQ(
        ipcref_view_slice(e, d, IPCREF_SLICE_MAX, IPCREF_SLICE_MIN, -2, &a),
        IPCREF_OK);
    expect_empty_ok(&a);
    ipcref_view_release(&a);
    CHECK_EQ(ipcref_view_unsqueeze(e, d, &a), IPCREF_OK);
    expect_empty_ok(&a);
    ipcref_view_release(&a);
    CHECK_EQ(ipcref_view_transpose(e, d, 0, &a), IPCREF_OK);
    expect_empty_ok(&a);
    ipcref_view_release(&a);
    if (len > 0) {
      CHECK_EQ(ipcref_view_select(e, d, len - 1, &a), IPCREF_OK);
      expect_empty_ok(&a);
      ipcref_view_release(&a);
      CHECK_EQ(ipcref_view_narrow(e, d, len - 1, 1, &a), IPCREF_OK);
      expect_empty_ok(&a);
      ipcref_view_release(&a);
    }
  }
}

static void test_empty_views(void) {
  int64_t s04[2] = {0, 4}, s40[3] = {4, 3, 0}, n4[1] = {4}, one[1] = {1};
  int64_t sh[2] = {0, 3}, st[2] = {1, INT64_MAX / 2};
  int64_t huge[2] = {0, INT64_MAX}, huge2[4] = {6, 6, 0, INT64_MAX};
  int64_t wide[4] = {0, (int64_t)1 << 31, (int64_t)1 << 31, (int64_t)1 << 31};
  ipcref_view v, e, out = garbage();
  ipcref_result rc;
  memset(&e, 0, sizeof e);

  /* Empty by a 0 dim, first or last. */
  v = iota(2, s04);
  empty_ops(&v);
  ipcref_view_release(&v);
  v = iota(3, s40);
  empty_ops(&v);
  ipcref_view_release(&v);

  /* Empty with a huge stride on a dim of size 3 (no element lies outside
   * the buffer, so as_strided may accept it). */
  v = iota(1, n4);
  rc = ipcref_view_as_strided(&v, 2, sh, st, 0, &e);
  CHECK(rc == IPCREF_OK || rc == IPCREF_ERANGE);
  if (rc == IPCREF_OK) {
    empty_ops(&e);
    ipcref_view_release(&e);
  }
  ipcref_view_release(&v);

  /* Empty with huge sizes: no bytes, so view_new may accept them; the
   * contiguous strides it makes must not overflow anything later. */
  rc = ipcref_view_new(IPCREF_F64, 2, huge, &e);
  CHECK(rc == IPCREF_OK || rc == IPCREF_ERANGE);
  if (rc == IPCREF_OK) {
    empty_ops(&e);
    ipcref_view_release(&e);
  }
  rc = ipcref_view_new(IPCREF_C128, 4, huge2, &e);
  CHECK(rc == IPCREF_OK || rc == IPCREF_ERANGE);
  if (rc == IPCREF_OK) {
    empty_ops(&e);
    ipcref_view_release(&e);
  }

  /* Flattening dims whose sizes multiply past int64 (the 0 is elsewhere):
   * the merged size cannot be represented. */
  v = iota(0, one);
  CHECK_EQ(ipcref_view_expand(&v, 4, wide, &e), IPCREF_OK);
  CHECK_EQ(ipcref_view_numel(&e), 0);
  FAILS(IPCREF_ERANGE, ipcref_view_flatten(&e, 1, 3, &out), &out, &e);
  FAILS(IPCREF_ERANGE, ipcref_view_flatten(&e, 1, -1, &e), &e, &e);
  CHECK_EQ(ipcref_view_flatten(&e, 0, 1, &out), IPCREF_OK);
  CHECK_EQ(ipcref_view_numel(&out), 0);
  ipcref_view_release(&out);
  ipcref_view_release(&e);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, 0);
}

static void test_no_leaks(void) {
  CHECK_EQ(live_allocs, 0);
}

int main(void) {
  RUN(test_dtypes);
  RUN(test_new_bad);
  RUN(test_of_bad);
  RUN(test_nulls);
  RUN(test_dims);
  RUN(test_index_ranges);
  RUN(test_permute_bad);
  RUN(test_reshape_bad);
  RUN(test_expand_bad);
  RUN(test_max_dims);
  RUN(test_as_strided_bad);
  RUN(test_copy_bad);
  RUN(test_data_mut_make_mut);
  RUN(test_tampered);
  RUN(test_iter_edges);
  RUN(test_iter_huge_strides);
  RUN(test_empty_views);
  RUN(test_no_leaks);
  return harness_finish();
}
