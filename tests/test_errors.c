/* Every IPCREF_EINVAL names its reason through the error hook.
 *
 * For each public function of the core (buffers, views, DLPack, the object
 * table, the device backends' own checks), each wrong argument is passed
 * once, and the test checks the code returned, that the hook heard exactly
 * one report with that code, that the message starts with the name of the
 * function called ("ipcref_view_slice: ") and that it names the check
 * (a distinguishing part of the reason). A valid call, and a refusal with
 * another code, tell the hook nothing. With IPCREF_CHECKED a view of a
 * released buffer is told once, as EDEAD, not a second time as EINVAL.
 *
 * The DLPack part runs where <dlpack/dlpack.h> is installed (its versioned
 * part with a DLPack 1.x header). */
#ifndef __cplusplus
#define _GNU_SOURCE /* the sharing layer needs GNU declarations */
#endif
#include <stdint.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#endif
#endif

#define IPCREF_IMPLEMENTATION
#define IPCREF_CUDA_IMPLEMENTATION
#define IPCREF_HIP_IMPLEMENTATION
#include "ipcref.h"
#include "ipcref_cuda.h"
#include "ipcref_hip.h"

#include "harness.h"

/* ------------------------------------------------------------ the hook */

static struct {
  int calls;
  ipcref_result code;
  char message[256];
} heard;

static void hook_fn(void *user, ipcref_result code, const char *message) {
  (void)user;
  heard.calls++;
  heard.code = code;
  snprintf(heard.message, sizeof heard.message, "%s", message);
}

static const ipcref_error_hook hook = {hook_fn, NULL};

static void hear_nothing_yet(void) {
  memset(&heard, 0, sizeof heard);
}

/* 1 when the hook heard one report, with `code`, from `fn` (the message
 * begins "fn: "), naming `what`; else 0, and the report is printed. */
static int heard_one(ipcref_result code, const char *fn, const char *what) {
  size_t n = strlen(fn);
  int ok = heard.calls == 1 && heard.code == code &&
           strncmp(heard.message, fn, n) == 0 &&
           strncmp(heard.message + n, ": ", 2) == 0 &&
           strstr(heard.message + n, what) != NULL;
  if (!ok)
    printf("    wanted %s: ...%s... (code %d); heard %d: \"%s\" (code %d)\n",
           fn, what, (int)code, heard.calls, heard.message, (int)heard.code);
  return ok;
}

/* `call` returns `code`, and the hook heard it once from `fn`, naming
 * `what`. */
#define TOLD(code, call, fn, what)                                             \
  do {                                                                         \
    hear_nothing_yet();                                                        \
    CHECK_EQ((call), (code));                                                  \
    CHECK(heard_one((code), (fn), (what)));                                    \
  } while (0)

#define REFUSED(call, fn, what) TOLD(IPCREF_EINVAL, call, fn, what)

/* `call` returns `code`, and the hook heard nothing. */
#define SILENT(code, call)                                                     \
  do {                                                                         \
    hear_nothing_yet();                                                        \
    CHECK_EQ((call), (code));                                                  \
    CHECK_EQ(heard.calls, 0);                                                  \
    if (heard.calls) printf("    heard: \"%s\"\n", heard.message);             \
  } while (0)

#define QUIET(call) SILENT(IPCREF_OK, call)

/* ------------------------------------------------------------ helpers */

/* A 2x3 f32 view (C-contiguous). */
static ipcref_view matrix(void) {
  ipcref_view v;
  int64_t shape[2] = {2, 3};
  memset(&v, 0, sizeof v);
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 2, shape, &v), IPCREF_OK);
  return v;
}

static void no_free(void *user, void *data) {
  (void)user;
  (void)data;
}

static void *plain_alloc(void *user, size_t n) {
  (void)user;
  return malloc(n);
}

static void plain_free(void *user, void *p, size_t n) {
  (void)user;
  (void)n;
  free(p);
}

/* ------------------------------------------------------------ buffers */

static void test_buf_new(void) {
  ipcref_buf *b = NULL;
  ipcref_allocator no_alloc = {NULL, plain_free, NULL};
  ipcref_allocator no_free_fn = {plain_alloc, NULL, NULL};
  ipcref_allocator good = {plain_alloc, plain_free, NULL};
  REFUSED(ipcref_buf_new(8, NULL), "ipcref_buf_new", "out is NULL");
  REFUSED(ipcref_buf_new_aligned(8, 0, &b), "ipcref_buf_new_aligned",
          "align is 0");
  REFUSED(ipcref_buf_new_aligned(8, 48, &b), "ipcref_buf_new_aligned",
          "align is not a power of two");
  REFUSED(ipcref_buf_new_aligned(8, 64, NULL), "ipcref_buf_new_aligned",
          "out is NULL");
  REFUSED(ipcref_buf_new_in(&no_alloc, 8, 64, &b), "ipcref_buf_new_in",
          "allocator->alloc is NULL");
  REFUSED(ipcref_buf_new_in(&no_free_fn, 8, 64, &b), "ipcref_buf_new_in",
          "allocator->free is NULL");
  REFUSED(ipcref_buf_new_in(&good, 8, 3, &b), "ipcref_buf_new_in",
          "align is not a power of two");
  REFUSED(ipcref_buf_new_in(NULL, 8, 64, NULL), "ipcref_buf_new_in",
          "out is NULL");
  CHECK(b == NULL);
  QUIET(ipcref_buf_new(8, &b));
  ipcref_buf_release(b);
  QUIET(ipcref_buf_new_aligned(8, 128, &b));
  ipcref_buf_release(b);
  QUIET(ipcref_buf_new_in(&good, 8, 16, &b));
  ipcref_buf_release(b);
  /* A refusal with another code tells nothing. */
  SILENT(IPCREF_ERANGE, ipcref_buf_new(SIZE_MAX, &b));
}

static void test_buf_wrap(void) {
  static char mem[16];
  ipcref_buf *b = NULL;
  ipcref_device gpu = {IPCREF_DEVICE_CUDA, 0}, bad_type = {0, 0},
                bad_id = {IPCREF_DEVICE_CUDA, -1};
  REFUSED(ipcref_buf_wrap(mem, 16, no_free, NULL, NULL), "ipcref_buf_wrap",
          "out is NULL");
  REFUSED(ipcref_buf_wrap(NULL, 16, no_free, NULL, &b), "ipcref_buf_wrap",
          "data is NULL with a non-zero size");
  REFUSED(ipcref_buf_wrap_device(mem, 16, bad_type, no_free, NULL, &b),
          "ipcref_buf_wrap_device", "device.type");
  REFUSED(ipcref_buf_wrap_device(mem, 16, bad_id, no_free, NULL, &b),
          "ipcref_buf_wrap_device", "device.id is negative");
  REFUSED(ipcref_buf_wrap_device(mem, 16, gpu, no_free, NULL, NULL),
          "ipcref_buf_wrap_device", "out is NULL");
  REFUSED(ipcref_buf_wrap_device(NULL, 16, gpu, no_free, NULL, &b),
          "ipcref_buf_wrap_device", "data is NULL");
  CHECK(b == NULL);
  QUIET(ipcref_buf_wrap(mem, 16, no_free, NULL, &b));
  ipcref_buf_release(b);
  QUIET(ipcref_buf_wrap_device(mem, 16, gpu, no_free, NULL, &b));
  ipcref_buf_release(b);
}

static void test_buf_make_mut(void) {
  ipcref_buf *b = NULL, *none = NULL;
  REFUSED(ipcref_buf_make_mut(NULL), "ipcref_buf_make_mut", "b is NULL");
  REFUSED(ipcref_buf_make_mut(&none), "ipcref_buf_make_mut", "*b is NULL");
  CHECK_EQ(ipcref_buf_new(8, &b), IPCREF_OK);
  QUIET(ipcref_buf_make_mut(&b));
  ipcref_buf_release(b);
}

/* ------------------------------------------------------------ views */

static void test_view_new_of(void) {
  ipcref_view v;
  ipcref_buf *b = NULL;
  int64_t shape[2] = {2, 3};
  memset(&v, 0, sizeof v);
  REFUSED(ipcref_view_new(IPCREF_F32, 2, shape, NULL), "ipcref_view_new",
          "out is NULL");
  REFUSED(ipcref_view_new((ipcref_dtype)IPCREF_DTYPE_COUNT, 2, shape, &v),
          "ipcref_view_new", "dt is not a valid dtype");
  REFUSED(ipcref_view_new((ipcref_dtype)-1, 2, shape, &v), "ipcref_view_new",
          "dt is not a valid dtype");
  REFUSED(ipcref_view_new(IPCREF_F32, 2, NULL, &v), "ipcref_view_new",
          "shape is NULL");
  SILENT(IPCREF_ERANGE,
         ipcref_view_new(IPCREF_F32, IPCREF_MAX_DIMS + 1, shape, &v));
  QUIET(ipcref_view_new(IPCREF_F32, 2, shape, &v));
  ipcref_view_release(&v);

  CHECK_EQ(ipcref_buf_new(64, &b), IPCREF_OK);
  REFUSED(ipcref_view_of(NULL, IPCREF_F32, 2, shape, &v), "ipcref_view_of",
          "b is NULL");
  REFUSED(ipcref_view_of(b, IPCREF_F32, 2, shape, NULL), "ipcref_view_of",
          "out is NULL");
  REFUSED(ipcref_view_of(b, (ipcref_dtype)99, 2, shape, &v), "ipcref_view_of",
          "dt is not a valid dtype");
  REFUSED(ipcref_view_of(b, IPCREF_F32, 1, NULL, &v), "ipcref_view_of",
          "shape is NULL");
  QUIET(ipcref_view_of(b, IPCREF_F32, 2, shape, &v));
  ipcref_view_release(&v);
  {
    /* Released, its header kept readable by a weak reference: refused in
     * every build, *out untouched, the count still 0. */
    ipcref_weak *w = ipcref_buf_downgrade(b);
    ipcref_view before;
    ipcref_buf_release(b);
    memset(&v, 0x5a, sizeof v);
    before = v;
    TOLD(IPCREF_EDEAD, ipcref_view_of(b, IPCREF_F32, 2, shape, &v),
         "ipcref_view_of", "already released");
    CHECK(memcmp(&v, &before, sizeof v) == 0);
    CHECK_EQ(ipcref_buf_strong_count(b), 0);
    ipcref_weak_release(w);
  }
}

/* A view whose fields were damaged: each reason, through clone. */
static void test_view_invalid(void) {
  ipcref_view v = matrix(), bad, out;
  const char *fn = "ipcref_view_clone";
  REFUSED(ipcref_view_clone(NULL, &out), fn, "v is NULL");
  REFUSED(ipcref_view_clone(&v, NULL), fn, "out is NULL");
  memset(&bad, 0, sizeof bad);
  REFUSED(ipcref_view_clone(&bad, &out), fn, "v has no buffer");
  bad = v;
  bad.dtype = (ipcref_dtype)IPCREF_DTYPE_COUNT;
  REFUSED(ipcref_view_clone(&bad, &out), fn, "v has an invalid dtype");
  bad = v;
  bad.ndim = IPCREF_MAX_DIMS + 1;
  REFUSED(ipcref_view_clone(&bad, &out), fn, "v has ndim out of range");
  bad = v;
  bad.ndim = -1;
  REFUSED(ipcref_view_clone(&bad, &out), fn, "v has ndim out of range");
  bad = v;
  bad.shape[1] = -3;
  REFUSED(ipcref_view_clone(&bad, &out), fn, "v has a negative size");
  bad = v;
  bad.shape[0] = INT64_MAX / 2;
  bad.shape[1] = 4;
  REFUSED(ipcref_view_clone(&bad, &out), fn, "overflows");
  bad = v;
  bad.byte_offset = 1 << 20;
  REFUSED(ipcref_view_clone(&bad, &out), fn, "v reaches outside its buffer");
  bad = v;
  bad.strides[0] = 1000;
  REFUSED(ipcref_view_clone(&bad, &out), fn, "v reaches outside its buffer");
  QUIET(ipcref_view_clone(&v, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&v);
}

/* Every operation that takes a view and an `out` checks both first. */
static void test_view_ops_nulls(void) {
  ipcref_view v = matrix(), out, none;
  int64_t shape[2] = {3, 2}, strides[2] = {2, 1};
  int perm[2] = {1, 0};
  ipcref_view_iter it;
  memset(&none, 0, sizeof none);
#define BOTH(fn, call_v, call_out)                                             \
  do {                                                                         \
    REFUSED(call_v, fn, "v is NULL");                                          \
    REFUSED(call_out, fn, "out is NULL");                                      \
  } while (0)
  BOTH("ipcref_view_slice", ipcref_view_slice(NULL, 0, 0, 1, 1, &out),
       ipcref_view_slice(&v, 0, 0, 1, 1, NULL));
  BOTH("ipcref_view_select", ipcref_view_select(NULL, 0, 0, &out),
       ipcref_view_select(&v, 0, 0, NULL));
  BOTH("ipcref_view_narrow", ipcref_view_narrow(NULL, 0, 0, 1, &out),
       ipcref_view_narrow(&v, 0, 0, 1, NULL));
  BOTH("ipcref_view_permute", ipcref_view_permute(NULL, perm, &out),
       ipcref_view_permute(&v, perm, NULL));
  BOTH("ipcref_view_transpose", ipcref_view_transpose(NULL, 0, 1, &out),
       ipcref_view_transpose(&v, 0, 1, NULL));
  BOTH("ipcref_view_reshape", ipcref_view_reshape(NULL, 2, shape, &out),
       ipcref_view_reshape(&v, 2, shape, NULL));
  BOTH("ipcref_view_reshape_copy",
       ipcref_view_reshape_copy(NULL, 2, shape, &out),
       ipcref_view_reshape_copy(&v, 2, shape, NULL));
  BOTH("ipcref_view_flatten", ipcref_view_flatten(NULL, 0, -1, &out),
       ipcref_view_flatten(&v, 0, -1, NULL));
  BOTH("ipcref_view_expand", ipcref_view_expand(NULL, 2, shape, &out),
       ipcref_view_expand(&v, 2, shape, NULL));
  BOTH("ipcref_view_squeeze", ipcref_view_squeeze(NULL, IPCREF_DIM_ALL, &out),
       ipcref_view_squeeze(&v, IPCREF_DIM_ALL, NULL));
  BOTH("ipcref_view_unsqueeze", ipcref_view_unsqueeze(NULL, 0, &out),
       ipcref_view_unsqueeze(&v, 0, NULL));
  BOTH("ipcref_view_flip", ipcref_view_flip(NULL, 0, &out),
       ipcref_view_flip(&v, 0, NULL));
  BOTH("ipcref_view_as_strided",
       ipcref_view_as_strided(NULL, 2, shape, strides, 0, &out),
       ipcref_view_as_strided(&v, 2, shape, strides, 0, NULL));
  BOTH("ipcref_view_contiguous", ipcref_view_contiguous(NULL, &out),
       ipcref_view_contiguous(&v, NULL));
#undef BOTH
  REFUSED(ipcref_view_slice(&none, 0, 0, 1, 1, &out), "ipcref_view_slice",
          "v has no buffer");
  REFUSED(ipcref_view_iter_init(&v, NULL), "ipcref_view_iter_init",
          "it is NULL");
  REFUSED(ipcref_view_iter_init(&none, &it), "ipcref_view_iter_init",
          "v has no buffer");
  QUIET(ipcref_view_iter_init(&v, &it));
  REFUSED(ipcref_view_make_mut(NULL), "ipcref_view_make_mut", "v is NULL");
  REFUSED(ipcref_view_make_mut(&none), "ipcref_view_make_mut",
          "v has no buffer");
  QUIET(ipcref_view_make_mut(&v));
  QUIET(ipcref_view_contiguous(&v, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&v);
}

/* Dims out of range: the message names the argument, its value and the
 * view's rank. */
static void test_view_dims(void) {
  ipcref_view v = matrix(), out;
  REFUSED(ipcref_view_slice(&v, 2, 0, 1, 1, &out), "ipcref_view_slice",
          "dim 2 out of range for a 2-d view");
  REFUSED(ipcref_view_slice(&v, 0, 0, 1, 0, &out), "ipcref_view_slice",
          "step is 0");
  QUIET(ipcref_view_slice(&v, -1, 0, 2, 1, &out));
  ipcref_view_release(&out);
  REFUSED(ipcref_view_select(&v, -3, 0, &out), "ipcref_view_select",
          "dim -3 out of range for a 2-d view");
  SILENT(IPCREF_ERANGE, ipcref_view_select(&v, 0, 5, &out));
  QUIET(ipcref_view_select(&v, 0, 1, &out));
  ipcref_view_release(&out);
  REFUSED(ipcref_view_narrow(&v, 7, 0, 1, &out), "ipcref_view_narrow",
          "dim 7 out of range for a 2-d view");
  QUIET(ipcref_view_narrow(&v, 1, 1, 2, &out));
  ipcref_view_release(&out);
  REFUSED(ipcref_view_transpose(&v, 2, 0, &out), "ipcref_view_transpose",
          "d0 2 out of range");
  REFUSED(ipcref_view_transpose(&v, 0, -5, &out), "ipcref_view_transpose",
          "d1 -5 out of range");
  QUIET(ipcref_view_transpose(&v, 0, 1, &out));
  ipcref_view_release(&out);
  REFUSED(ipcref_view_flip(&v, INT32_MIN, &out), "ipcref_view_flip",
          "dim -2147483648 out of range for a 2-d view");
  QUIET(ipcref_view_flip(&v, 1, &out));
  ipcref_view_release(&out);
  REFUSED(ipcref_view_unsqueeze(&v, 3, &out), "ipcref_view_unsqueeze",
          "dim 3 out of range");
  QUIET(ipcref_view_unsqueeze(&v, 2, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&v);
}

static void test_view_permute(void) {
  ipcref_view v = matrix(), out;
  int far[2] = {0, 9}, twice[2] = {1, -1}, ok[2] = {1, 0};
  REFUSED(ipcref_view_permute(&v, NULL, &out), "ipcref_view_permute",
          "perm is NULL");
  REFUSED(ipcref_view_permute(&v, far, &out), "ipcref_view_permute",
          "perm entry 9 out of range for a 2-d view");
  REFUSED(ipcref_view_permute(&v, twice, &out), "ipcref_view_permute",
          "perm names a dim twice");
  QUIET(ipcref_view_permute(&v, ok, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&v);
}

static void test_view_reshape(void) {
  ipcref_view v = matrix(), t, out;
  int64_t two_inferred[2] = {-1, -1}, wrong[2] = {4, 2}, odd[2] = {-1, 4},
          zero[2] = {0, -1}, six[1] = {6}, three_two[2] = {3, -1};
  const char *fns[2] = {"ipcref_view_reshape", "ipcref_view_reshape_copy"};
  int k;
  CHECK_EQ(ipcref_view_transpose(&v, 0, 1, &t), IPCREF_OK); /* not C order */
  for (k = 0; k < 2; k++) {
    ipcref_result (*reshape)(const ipcref_view *, int, const int64_t *,
                             ipcref_view *) =
        k ? ipcref_view_reshape_copy : ipcref_view_reshape;
    REFUSED(reshape(&v, 2, NULL, &out), fns[k], "shape is NULL");
    REFUSED(reshape(&v, 2, two_inferred, &out), fns[k], "more than one -1");
    REFUSED(reshape(&v, 2, wrong, &out), fns[k], "element count differs");
    REFUSED(reshape(&v, 2, odd, &out), fns[k], "cannot be inferred");
    REFUSED(reshape(&v, 2, zero, &out), fns[k], "cannot be inferred");
    /* A view that needs a copy: the shape is checked first, by name. */
    REFUSED(reshape(&t, 2, wrong, &out), fns[k], "element count differs");
    QUIET(reshape(&v, 1, six, &out));
    ipcref_view_release(&out);
  }
  SILENT(IPCREF_ENEEDCOPY, ipcref_view_reshape(&t, 1, six, &out));
  QUIET(ipcref_view_reshape_copy(&t, 2, three_two, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&t);
  ipcref_view_release(&v);
}

static void test_view_flatten(void) {
  ipcref_view v = matrix(), s, out;
  const char *fn = "ipcref_view_flatten";
  CHECK_EQ(ipcref_view_select(&v, 0, 0, &s), IPCREF_OK);
  CHECK_EQ(ipcref_view_select(&s, 0, 0, &s), IPCREF_OK); /* 0-d */
  REFUSED(ipcref_view_flatten(&s, 1, -1, &out), fn, "0 or -1 for a 0-d view");
  QUIET(ipcref_view_flatten(&s, 0, -1, &out));
  ipcref_view_release(&out);
  REFUSED(ipcref_view_flatten(&v, 2, -1, &out), fn,
          "start_dim 2 out of range for a 2-d view");
  REFUSED(ipcref_view_flatten(&v, 0, -3, &out), fn,
          "end_dim -3 out of range for a 2-d view");
  REFUSED(ipcref_view_flatten(&v, 1, 0, &out), fn, "start_dim is after");
  QUIET(ipcref_view_flatten(&v, 0, -1, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&s);
  ipcref_view_release(&v);
}

static void test_view_expand(void) {
  ipcref_view v = matrix(), row, out;
  int64_t one[1] = {3}, lead[3] = {-1, 2, 3}, grow[2] = {4, 3},
          ok[3] = {5, 2, 3}, rows[2] = {4, -1};
  const char *fn = "ipcref_view_expand";
  REFUSED(ipcref_view_expand(&v, 1, one, &out), fn, "ndim is below");
  REFUSED(ipcref_view_expand(&v, 3, NULL, &out), fn, "shape is NULL");
  REFUSED(ipcref_view_expand(&v, 3, lead, &out), fn, "new leading dim");
  REFUSED(ipcref_view_expand(&v, 2, grow, &out), fn, "cannot grow");
  QUIET(ipcref_view_expand(&v, 3, ok, &out));
  ipcref_view_release(&out);
  CHECK_EQ(ipcref_view_narrow(&v, 0, 0, 1, &row), IPCREF_OK); /* 1 x 3 */
  QUIET(ipcref_view_expand(&row, 2, rows, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&row);
  ipcref_view_release(&v);
}

static void test_view_squeeze_as_strided(void) {
  ipcref_view v = matrix(), out;
  int64_t shape[2] = {3, 2}, strides[2] = {2, 1};
  const char *fn = "ipcref_view_as_strided";
  REFUSED(ipcref_view_squeeze(&v, 0, &out), "ipcref_view_squeeze",
          "the dim's size is not 1");
  REFUSED(ipcref_view_squeeze(&v, 4, &out), "ipcref_view_squeeze",
          "dim 4 out of range for a 2-d view");
  QUIET(ipcref_view_squeeze(&v, IPCREF_DIM_ALL, &out));
  ipcref_view_release(&out);
  REFUSED(ipcref_view_as_strided(&v, 2, NULL, strides, 0, &out), fn,
          "shape is NULL");
  REFUSED(ipcref_view_as_strided(&v, 2, shape, NULL, 0, &out), fn,
          "strides is NULL");
  REFUSED(ipcref_view_as_strided(&v, 2, shape, strides, 2, &out), fn,
          "byte_offset is not a multiple");
  SILENT(IPCREF_ERANGE,
         ipcref_view_as_strided(&v, 2, shape, strides, 64, &out));
  QUIET(ipcref_view_as_strided(&v, 2, shape, strides, 0, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&v);
}

static void test_view_copy(void) {
  ipcref_view dst = matrix(), src = matrix(), none, i32, col, bcast, out;
  int64_t shape[2] = {2, 3}, cols[2] = {2, 1};
  const char *fn = "ipcref_view_copy";
  memset(&none, 0, sizeof none);
  CHECK_EQ(ipcref_view_new(IPCREF_I32, 2, shape, &i32), IPCREF_OK);
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 2, cols, &col), IPCREF_OK);
  REFUSED(ipcref_view_copy(NULL, &src), fn, "dst is NULL");
  REFUSED(ipcref_view_copy(&dst, &none), fn, "src has no buffer");
  REFUSED(ipcref_view_copy(&dst, &i32), fn, "different dtypes");
  CHECK_EQ(ipcref_view_narrow(&src, 1, 0, 2, &out), IPCREF_OK); /* 2 x 2 */
  REFUSED(ipcref_view_copy(&dst, &out), fn,
          "src does not broadcast to dst's shape");
  ipcref_view_release(&out);
  /* A destination that repeats an element: 2 x 3 over a 2 x 1 column. */
  CHECK_EQ(ipcref_view_expand(&col, 2, shape, &bcast), IPCREF_OK);
  REFUSED(ipcref_view_copy(&bcast, &src), fn, "dst has a broadcast dim");
  QUIET(ipcref_view_copy(&dst, &src));
  CHECK_EQ(ipcref_view_narrow(&src, 1, 0, 1, &out), IPCREF_OK); /* 2 x 1 */
  QUIET(ipcref_view_copy(&dst, &out)); /* broadcast along dim 1 */
  ipcref_view_release(&out);
  /* Shared, not writable: EBUSY, which tells nothing. */
  CHECK_EQ(ipcref_view_clone(&dst, &out), IPCREF_OK);
  SILENT(IPCREF_EBUSY, ipcref_view_copy(&dst, &src));
  ipcref_view_release(&out);
  ipcref_view_release(&bcast);
  ipcref_view_release(&col);
  ipcref_view_release(&i32);
  ipcref_view_release(&src);
  ipcref_view_release(&dst);
}

/* IPCREF_CHECKED: a view whose buffer was released is told once, as EDEAD
 * naming the call; the EINVAL returned adds no second report. */
static void test_released_told_once(void) {
#ifdef IPCREF_CHECKED
  ipcref_view v = matrix(), copy = v, out, other = matrix();
  ipcref_view_iter it;
  ipcref_view_release(&v); /* its header waits in the quarantine */
  hear_nothing_yet();
  CHECK_EQ(ipcref_view_slice(&copy, 0, 0, 1, 1, &out), IPCREF_EINVAL);
  CHECK(heard_one(IPCREF_EDEAD, "ipcref_view_slice", "already released"));
  hear_nothing_yet();
  CHECK_EQ(ipcref_view_copy(&other, &copy), IPCREF_EINVAL);
  CHECK(heard_one(IPCREF_EDEAD, "ipcref_view_copy", "already released"));
  hear_nothing_yet();
  CHECK_EQ(ipcref_view_iter_init(&copy, &it), IPCREF_EINVAL);
  CHECK(heard_one(IPCREF_EDEAD, "ipcref_view_iter_init", "already released"));
  ipcref_view_release(&other);
#else
  printf("    (IPCREF_CHECKED not defined: a released buffer is not "
         "readable)\n");
#endif
}

/* ------------------------------------------------------------ DLPack */

#ifdef IPCREF_HAVE_DLPACK
static int deleted;

static void count_delete(DLManagedTensor *self) {
  (void)self;
  deleted++;
}

/* A 1-d f32 tensor of 4 elements over `data`, deleter counted. */
static void tensor(DLManagedTensor *mt, float *data, int64_t *shape) {
  memset(mt, 0, sizeof *mt);
  shape[0] = 4;
  mt->dl_tensor.data = data;
  mt->dl_tensor.device.device_type = kDLCPU;
  mt->dl_tensor.device.device_id = 0;
  mt->dl_tensor.ndim = 1;
  mt->dl_tensor.dtype.code = (uint8_t)kDLFloat;
  mt->dl_tensor.dtype.bits = 32;
  mt->dl_tensor.dtype.lanes = 1;
  mt->dl_tensor.shape = shape;
  mt->deleter = count_delete;
}
#endif

static void test_dlpack_dtypes(void) {
#ifdef IPCREF_HAVE_DLPACK
  DLDataType dt;
  ipcref_dtype back;
  REFUSED(ipcref_dtype_to_dlpack(IPCREF_F32, NULL), "ipcref_dtype_to_dlpack",
          "out is NULL");
  REFUSED(ipcref_dtype_to_dlpack((ipcref_dtype)IPCREF_DTYPE_COUNT, &dt),
          "ipcref_dtype_to_dlpack", "dt is not a valid dtype");
  QUIET(ipcref_dtype_to_dlpack(IPCREF_F32, &dt));
  REFUSED(ipcref_dtype_from_dlpack(dt, NULL), "ipcref_dtype_from_dlpack",
          "out is NULL");
  dt.lanes = 4;
  REFUSED(ipcref_dtype_from_dlpack(dt, &back), "ipcref_dtype_from_dlpack",
          "lanes is not 1");
  dt.lanes = 1;
  dt.bits = 24;
  REFUSED(ipcref_dtype_from_dlpack(dt, &back), "ipcref_dtype_from_dlpack",
          "no ipcref dtype has that");
  dt.bits = 32;
  QUIET(ipcref_dtype_from_dlpack(dt, &back));
  CHECK_EQ(back, IPCREF_F32);
#else
  printf("    (<dlpack/dlpack.h> not installed: skipped)\n");
#endif
}

static void test_dlpack_views(void) {
#ifdef IPCREF_HAVE_DLPACK
  float data[4] = {1, 2, 3, 4};
  int64_t shape[1];
  DLManagedTensor mt, *out = NULL;
  ipcref_view v = matrix(), none, got;
  const char *to = "ipcref_view_to_dlpack", *from = "ipcref_view_from_dlpack";
  memset(&none, 0, sizeof none);
  REFUSED(ipcref_view_to_dlpack(&v, NULL), to, "out is NULL");
  REFUSED(ipcref_view_to_dlpack(NULL, &out), to, "v is NULL");
  REFUSED(ipcref_view_to_dlpack(&none, &out), to, "v has no buffer");
  CHECK(out == NULL);
  QUIET(ipcref_view_to_dlpack(&v, &out));
  if (out) out->deleter(out);

  deleted = 0;
  tensor(&mt, data, shape);
  REFUSED(ipcref_view_from_dlpack(NULL, &got), from, "t is NULL");
  REFUSED(ipcref_view_from_dlpack(&mt, NULL), from, "out is NULL");
  mt.dl_tensor.dtype.lanes = 2;
  REFUSED(ipcref_view_from_dlpack(&mt, &got), from, "lanes is not 1");
  mt.dl_tensor.dtype.lanes = 1;
  mt.dl_tensor.dtype.code = 99;
  REFUSED(ipcref_view_from_dlpack(&mt, &got), from, "no ipcref dtype");
  mt.dl_tensor.dtype.code = (uint8_t)kDLFloat;
  mt.dl_tensor.shape = NULL;
  REFUSED(ipcref_view_from_dlpack(&mt, &got), from, "shape is NULL");
  mt.dl_tensor.shape = shape;
  mt.dl_tensor.data = NULL;
  REFUSED(ipcref_view_from_dlpack(&mt, &got), from, "data is NULL");
  mt.dl_tensor.data = data;
  mt.dl_tensor.device.device_type = kDLCUDAHost;
  SILENT(IPCREF_ENODEV, ipcref_view_from_dlpack(&mt, &got));
  mt.dl_tensor.device.device_type = kDLCPU;
  CHECK_EQ(deleted, 0); /* nothing taken on error */
  QUIET(ipcref_view_from_dlpack(&mt, &got));
  ipcref_view_release(&got);
  CHECK_EQ(deleted, 1);
  ipcref_view_release(&v);
#else
  printf("    (<dlpack/dlpack.h> not installed: skipped)\n");
#endif
}

#ifdef IPCREF_HAVE_DLPACK_VERSIONED
static void count_delete_v(struct DLManagedTensorVersioned *self) {
  (void)self;
  deleted++;
}
#endif

static void test_dlpack_versioned(void) {
#ifdef IPCREF_HAVE_DLPACK_VERSIONED
  float data[4] = {1, 2, 3, 4};
  int64_t shape[1];
  DLManagedTensor legacy;
  struct DLManagedTensorVersioned mt, *out = NULL;
  ipcref_view v = matrix(), none, got;
  const char *to = "ipcref_view_to_dlpack_versioned",
             *from = "ipcref_view_from_dlpack_versioned";
  memset(&none, 0, sizeof none);
  REFUSED(ipcref_view_to_dlpack_versioned(&v, NULL), to, "out is NULL");
  REFUSED(ipcref_view_to_dlpack_versioned(NULL, &out), to, "v is NULL");
  REFUSED(ipcref_view_to_dlpack_versioned(&none, &out), to, "v has no buffer");
  QUIET(ipcref_view_to_dlpack_versioned(&v, &out));
  if (out) out->deleter(out);

  deleted = 0;
  tensor(&legacy, data, shape);
  memset(&mt, 0, sizeof mt);
  mt.version.major = DLPACK_MAJOR_VERSION;
  mt.version.minor = DLPACK_MINOR_VERSION;
  mt.dl_tensor = legacy.dl_tensor;
  mt.deleter = count_delete_v;
  REFUSED(ipcref_view_from_dlpack_versioned(NULL, &got), from, "t is NULL");
  REFUSED(ipcref_view_from_dlpack_versioned(&mt, NULL), from, "out is NULL");
  mt.version.major = DLPACK_MAJOR_VERSION + 1;
  TOLD(IPCREF_EPROTO, ipcref_view_from_dlpack_versioned(&mt, &got), from,
       "t->version.major is");
  mt.version.major = DLPACK_MAJOR_VERSION;
  mt.dl_tensor.dtype.lanes = 3;
  REFUSED(ipcref_view_from_dlpack_versioned(&mt, &got), from, "lanes");
  mt.dl_tensor.dtype.lanes = 1;
  mt.dl_tensor.shape = NULL;
  REFUSED(ipcref_view_from_dlpack_versioned(&mt, &got), from, "shape is NULL");
  mt.dl_tensor.shape = shape;
  CHECK_EQ(deleted, 0);
  QUIET(ipcref_view_from_dlpack_versioned(&mt, &got));
  ipcref_view_release(&got);
  CHECK_EQ(deleted, 1);
  ipcref_view_release(&v);
#else
  printf("    (no DLPack 1.x header: the versioned structs are skipped)\n");
#endif
}

/* ------------------------------------------------------------ the table */

static void test_table_ids(void) {
  ipcref_table *t = NULL;
  ipcref_id id = 0, unknown = 1000;
  uint64_t n = 0;
  ipcref_table_stats st;
  REFUSED(ipcref_table_new(NULL, NULL), "ipcref_table_new", "out is NULL");
  QUIET(ipcref_table_new(NULL, &t));
  REFUSED(ipcref_table_create(NULL, &id), "ipcref_table_create", "t is NULL");
  REFUSED(ipcref_table_create(t, NULL), "ipcref_table_create", "out is NULL");
  QUIET(ipcref_table_create(t, &id));
  REFUSED(ipcref_table_incref(NULL, id), "ipcref_table_incref", "t is NULL");
  REFUSED(ipcref_table_incref(t, unknown), "ipcref_table_incref",
          "id was never handed out");
  REFUSED(ipcref_table_incref(t, 0), "ipcref_table_incref",
          "id was never handed out");
  QUIET(ipcref_table_incref(t, id));
  REFUSED(ipcref_table_decref(NULL, id), "ipcref_table_decref", "t is NULL");
  REFUSED(ipcref_table_decref(t, unknown), "ipcref_table_decref",
          "id was never handed out");
  QUIET(ipcref_table_decref(t, id));
  REFUSED(ipcref_table_count(NULL, id, &n), "ipcref_table_count", "t is NULL");
  REFUSED(ipcref_table_count(t, id, NULL), "ipcref_table_count", "out is NULL");
  REFUSED(ipcref_table_count(t, unknown, &n), "ipcref_table_count",
          "id was never handed out");
  QUIET(ipcref_table_count(t, id, &n));
  CHECK_EQ(n, 1);
  REFUSED(ipcref_table_alias(NULL, id, id), "ipcref_table_alias", "t is NULL");
  REFUSED(ipcref_table_alias(t, unknown, id), "ipcref_table_alias",
          "a was never handed out");
  REFUSED(ipcref_table_alias(t, id, unknown), "ipcref_table_alias",
          "b was never handed out");
  REFUSED(ipcref_table_get_stats(NULL, &st), "ipcref_table_get_stats",
          "t is NULL");
  REFUSED(ipcref_table_get_stats(t, NULL), "ipcref_table_get_stats",
          "out is NULL");
  QUIET(ipcref_table_get_stats(t, &st));
  /* A dead id: EDEAD, told to the table's violation hook only. */
  QUIET(ipcref_table_decref(t, id));
  SILENT(IPCREF_EDEAD, ipcref_table_incref(t, id));
  ipcref_table_free(t);
}

static void test_table_put(void) {
  ipcref_table *t = NULL;
  ipcref_id a = 0, b = 0, unknown = 1000, list[1];
  const char *fn = "ipcref_table_put";
  CHECK_EQ(ipcref_table_new(NULL, &t), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  REFUSED(ipcref_table_put(NULL, a, 1, NULL, 0), fn, "t is NULL");
  REFUSED(ipcref_table_put(t, a, 1, NULL, 2), fn, "contained is NULL");
  REFUSED(ipcref_table_put(t, a, 1, list, SIZE_MAX), fn, "n is too large");
  REFUSED(ipcref_table_put(t, unknown, 1, NULL, 0), fn,
          "id was never handed out");
  list[0] = a;
  REFUSED(ipcref_table_put(t, a, 1, list, 1), fn, "contained lists id itself");
  list[0] = unknown;
  REFUSED(ipcref_table_put(t, a, 1, list, 1), fn,
          "contained lists an id never handed out");
  list[0] = b;
  QUIET(ipcref_table_put(t, a, 1, list, 1));
  REFUSED(ipcref_table_put(t, a, 2, list, 1), fn, "contained given again");
  QUIET(ipcref_table_put(t, a, 2, NULL, 0));
  ipcref_table_free(t);
}

static void test_table_messages(void) {
  ipcref_table *t = NULL;
  ipcref_id a = 0, unknown[1] = {1000};
  uint64_t tok = 0, tok2 = 0;
  const char *fn = "ipcref_table_msg_out";
  CHECK_EQ(ipcref_table_new(NULL, &t), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  REFUSED(ipcref_table_msg_out(NULL, &a, 1, &tok), fn, "t is NULL");
  REFUSED(ipcref_table_msg_out(t, &a, 1, NULL), fn, "token is NULL");
  REFUSED(ipcref_table_msg_out(t, NULL, 1, &tok), fn, "ids is NULL");
  REFUSED(ipcref_table_msg_out(t, &a, SIZE_MAX, &tok), fn, "n is too large");
  REFUSED(ipcref_table_msg_out(t, unknown, 1, &tok), fn,
          "ids lists an id never handed out");
  QUIET(ipcref_table_msg_out(t, &a, 1, &tok));
  QUIET(ipcref_table_msg_out(t, &a, 1, &tok2));
  REFUSED(ipcref_table_msg_in(NULL, tok), "ipcref_table_msg_in", "t is NULL");
  REFUSED(ipcref_table_msg_in(t, 0), "ipcref_table_msg_in", "token is 0");
  REFUSED(ipcref_table_msg_in(t, 999), "ipcref_table_msg_in",
          "token was never handed out");
  REFUSED(ipcref_table_msg_cancel(NULL, tok), "ipcref_table_msg_cancel",
          "t is NULL");
  REFUSED(ipcref_table_msg_cancel(t, 0), "ipcref_table_msg_cancel",
          "token is 0");
  REFUSED(ipcref_table_msg_cancel(t, 999), "ipcref_table_msg_cancel",
          "token was never handed out");
  QUIET(ipcref_table_msg_in(t, tok));
  QUIET(ipcref_table_msg_cancel(t, tok2));
  REFUSED(ipcref_table_msg_cancel(t, tok), "ipcref_table_msg_cancel",
          "let go of already");
  REFUSED(ipcref_table_msg_in(t, tok2), "ipcref_table_msg_in",
          "let go of already");
  ipcref_table_free(t);
}

static void test_table_view(void) {
  ipcref_table *t = NULL;
  ipcref_id a = 0;
  ipcref_view v = matrix(), none, out;
  const char *fn = "ipcref_table_view";
  memset(&none, 0, sizeof none);
  CHECK_EQ(ipcref_table_new(NULL, &t), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  REFUSED(ipcref_table_view(NULL, a, &v, &out), fn, "t is NULL");
  REFUSED(ipcref_table_view(t, a, &v, NULL), fn, "out is NULL");
  REFUSED(ipcref_table_view(t, a, NULL, &out), fn, "src is NULL");
  REFUSED(ipcref_table_view(t, a, &none, &out), fn, "src has no buffer");
  REFUSED(ipcref_table_view(t, 1000, &v, &out), fn, "id was never handed out");
  QUIET(ipcref_table_view(t, a, &v, &out));
  ipcref_view_release(&out);
  ipcref_view_release(&v);
  ipcref_table_free(t);
}

/* ------------------------------------------------------------ devices */

/* The backends' own checks come before any driver is loaded. */
static void test_gpu_args(void) {
  static char long_path[300];
  ipcref_cuda *cu = NULL;
  ipcref_hip *hip = NULL;
  ipcref_ctx *ctx = NULL;
  ipcref_buf *b = NULL;
  char dev_mem[16];
  memset(long_path, 'x', sizeof long_path - 1);
  REFUSED(ipcref_cuda_open(NULL, NULL), "ipcref_cuda_open", "out is NULL");
  REFUSED(ipcref_cuda_open(long_path, &cu), "ipcref_cuda_open",
          "the library path is over 255 bytes");
  REFUSED(ipcref_hip_open(NULL, NULL), "ipcref_hip_open", "out is NULL");
  REFUSED(ipcref_hip_open(long_path, &hip), "ipcref_hip_open",
          "the library path is over 255 bytes");
  /* No driver there: ENODEV, which says why through ipcref_cuda_error. */
  SILENT(IPCREF_ENODEV, ipcref_cuda_open("/nonexistent/libcuda.so.1", &cu));
  CHECK(cu == NULL);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  REFUSED(ipcref_cuda_alloc(NULL, 0, 64, &b), "ipcref_cuda_alloc",
          "ctx is NULL");
  REFUSED(ipcref_cuda_alloc(ctx, 0, 64, NULL), "ipcref_cuda_alloc",
          "out is NULL");
  REFUSED(ipcref_cuda_alloc(ctx, -1, 64, &b), "ipcref_cuda_alloc",
          "device is negative");
  REFUSED(ipcref_hip_alloc(ctx, -2, 64, &b), "ipcref_hip_alloc",
          "device is negative");
  REFUSED(ipcref_cuda_wrap(ctx, 0, NULL, 16, no_free, NULL, &b),
          "ipcref_cuda_wrap", "ptr is NULL");
  REFUSED(ipcref_cuda_wrap(ctx, -1, dev_mem, 16, no_free, NULL, &b),
          "ipcref_cuda_wrap", "device is negative");
  REFUSED(ipcref_hip_wrap(NULL, 0, dev_mem, 16, no_free, NULL, &b),
          "ipcref_hip_wrap", "ctx is NULL");
  REFUSED(ipcref_hip_wrap(ctx, 0, dev_mem, 16, no_free, NULL, NULL),
          "ipcref_hip_wrap", "out is NULL");
  CHECK(b == NULL);
  ipcref_ctx_free(ctx);
}

/* ---------------------------------------------------- the sharing layer */

#ifdef IPCREF__SHARING_IMPL
static void test_share_ctx_args(void) {
  ipcref_ctx_options o;
  ipcref_ctx *ctx = NULL;
  ipcref_buf *b = NULL;
  ipcref_view v;
  ipcref_device cpu;
  int64_t n = 8;
  size_t freed;
  REFUSED(ipcref_ctx_new(NULL, NULL), "ipcref_ctx_new", "out is NULL");
  memset(&o, 0, sizeof o);
  o.segment_size = 5000;
  REFUSED(ipcref_ctx_new(&o, &ctx), "ipcref_ctx_new", "segment_size");
  o.segment_size = (size_t)1 << 38; /* 2^32 blocks of 64 bytes */
  REFUSED(ipcref_ctx_new(&o, &ctx), "ipcref_ctx_new", "up to 1 GiB");
  o.segment_size = ((size_t)1 << 30) + 4096;
  REFUSED(ipcref_ctx_new(&o, &ctx), "ipcref_ctx_new", "up to 1 GiB");
  o.segment_size = (size_t)1 << 30;
  CHECK_EQ(ipcref_ctx_new(&o, &ctx), IPCREF_OK);
  ipcref_ctx_free(ctx);
  ctx = NULL;
  o.segment_size = 0;
  o.ledger_slots = 9;
  REFUSED(ipcref_ctx_new(&o, &ctx), "ipcref_ctx_new", "ledger_slots");
  o.ledger_slots = 0;
  o.allow_uids_count = 2;
  REFUSED(ipcref_ctx_new(&o, &ctx), "ipcref_ctx_new", "allow_uids");
  CHECK(ctx == NULL);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  REFUSED(ipcref_shared_new(NULL, 64, &b), "ipcref_shared_new",
          "ctx or out is NULL");
  REFUSED(ipcref_shared_new_isolated(ctx, 64, NULL),
          "ipcref_shared_new_isolated", "ctx or out is NULL");
  REFUSED(ipcref_shared_new_wait(ctx, 64, -5, &b), "ipcref_shared_new_wait",
          "timeout_ms below -1");
  REFUSED(ipcref_view_new_shared(ctx, IPCREF_DTYPE_COUNT, 1, &n, &v),
          "ipcref_view_new_shared", "dt out of range");
  REFUSED(ipcref_view_new_shared(ctx, IPCREF_F32, 1, NULL, &v),
          "ipcref_view_new_shared", "shape is NULL");
  REFUSED(ipcref_ctx_poll(NULL, 0, &freed), "ipcref_ctx_poll", "ctx is NULL");
  REFUSED(ipcref_ctx_poll(ctx, -2, &freed), "ipcref_ctx_poll",
          "timeout_ms below -1");
  REFUSED(ipcref_ctx_stats(ctx, NULL), "ipcref_ctx_stats",
          "ctx or out is NULL");
  REFUSED(ipcref_ctx_add_backend(ctx, NULL), "ipcref_ctx_add_backend",
          "ctx or be is NULL");
  cpu.type = IPCREF_DEVICE_CPU;
  cpu.id = 0;
  REFUSED(ipcref_device_new(ctx, cpu, 64, &b), "ipcref_device_new",
          "dev is not a device");
  CHECK(b == NULL);
  ipcref_ctx_free(ctx);
}

static void test_share_peer_args(void) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_peer_options o;
  char long_path[200];
  int sv[2], pv[2], fd;
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  REFUSED(ipcref_peer_new(ctx, -1, &p), "ipcref_peer_new",
          "sockfd is negative");
  CHECK_EQ(pipe(pv), 0);
  REFUSED(ipcref_peer_new(ctx, pv[0], &p), "ipcref_peer_new",
          "sockfd is not a socket");
  CHECK_EQ(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
  REFUSED(ipcref_peer_new(ctx, sv[0], &p), "ipcref_peer_new",
          "neither SOCK_STREAM nor SOCK_SEQPACKET");
  close(sv[0]);
  close(sv[1]);
  fd = socket(AF_UNIX, SOCK_STREAM, 0);
  REFUSED(ipcref_peer_new(ctx, fd, &p), "ipcref_peer_new",
          "not a connected AF_UNIX socket");
  close(fd);
  memset(&o, 0, sizeof o);
  o.hello_timeout_ms = -1;
  CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  REFUSED(ipcref_peer_new_with(ctx, sv[0], &o, &p), "ipcref_peer_new_with",
          "a negative timeout");
  REFUSED(ipcref_peer_new_with(NULL, sv[0], NULL, &p), "ipcref_peer_new_with",
          "ctx or out is NULL");
  CHECK(p == NULL);
  memset(long_path, 'x', sizeof long_path - 1);
  long_path[sizeof long_path - 1] = '\0';
  REFUSED(ipcref_listen(ctx, "", &fd), "ipcref_listen", "path is empty");
  REFUSED(ipcref_listen(ctx, "@", &fd), "ipcref_listen", "path is empty");
  REFUSED(ipcref_listen(ctx, long_path, &fd), "ipcref_listen", "too long");
  REFUSED(ipcref_listen(ctx, "@x", NULL), "ipcref_listen",
          "ctx or listen_fd is NULL");
  REFUSED(ipcref_connect(ctx, NULL, &p), "ipcref_connect", "path is NULL");
  REFUSED(ipcref_accept(ctx, -1, 0, &p), "ipcref_accept",
          "listen_fd is negative");
  REFUSED(ipcref_accept(ctx, pv[0], -1, &p), "ipcref_accept",
          "not a listening socket");
  CHECK_EQ(ipcref_listen(ctx, "@ipcref-test-errors", &fd), IPCREF_OK);
  REFUSED(ipcref_accept(ctx, fd, -2, &p), "ipcref_accept",
          "timeout_ms below -1");
  /* A listening socket has credentials (its own), but no other end. */
  REFUSED(ipcref_peer_new(ctx, fd, &p), "ipcref_peer_new",
          "not a connected AF_UNIX socket");
  CHECK(p == NULL);
  close(fd);
  close(pv[0]);
  close(pv[1]);
  close(sv[0]);
  close(sv[1]);
  ipcref_ctx_free(ctx);
}

/* Two contexts of this process, a peer each on a socketpair: p in *ctx,
 * q in *other. */
static void two_peers(ipcref_ctx **ctx, ipcref_ctx **other, ipcref_peer **p,
                      ipcref_peer **q) {
  int sv[2];
  CHECK_EQ(ipcref_ctx_new(NULL, ctx), IPCREF_OK);
  CHECK_EQ(ipcref_ctx_new(NULL, other), IPCREF_OK);
  CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  CHECK_EQ(ipcref_peer_new(*ctx, sv[0], p), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(*other, sv[1], q), IPCREF_OK);
}
static void two_peers_free(ipcref_ctx *ctx, ipcref_ctx *other, ipcref_peer *p,
                           ipcref_peer *q) {
  ipcref_peer_free(q);
  ipcref_peer_free(p);
  ipcref_ctx_free(other);
  ipcref_ctx_free(ctx);
}

/* The calls on a peer: each wrong argument named; a refused view leaves
 * no lease. */
static void test_share_send_args(void) {
  ipcref_ctx *ctx = NULL, *other = NULL;
  ipcref_peer *p = NULL, *q = NULL;
  ipcref_view v, heap, theirs, bad, got;
  ipcref_peer_info in;
  ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
  int64_t n = 8;
  two_peers(&ctx, &other, &p, &q);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  CHECK_EQ(ipcref_view_new(IPCREF_U8, 1, &n, &heap), IPCREF_OK);
  CHECK_EQ(ipcref_view_new_shared(other, IPCREF_U8, 1, &n, &theirs), IPCREF_OK);
  bad = v;
  bad.ndim = -1;
  REFUSED(ipcref_send(NULL, &v), "ipcref_send", "p or views is NULL");
  REFUSED(ipcref_send_batch(p, &v, 0), "ipcref_send_batch",
          "n not in 1..IPCREF_MSG_MAX_VIEWS");
  REFUSED(ipcref_send(p, &heap), "ipcref_send", "not shared");
  REFUSED(ipcref_send(p, &bad), "ipcref_send", "not valid");
  REFUSED(ipcref_send(p, &theirs), "ipcref_send", "another context");
  REFUSED(ipcref_send_meta(p, &v, 1, NULL, 3), "ipcref_send_meta",
          "meta is NULL");
  REFUSED(ipcref_export(p, &heap, msg), "ipcref_export", "not shared");
  REFUSED(ipcref_export(p, &v, NULL), "ipcref_export", "p, v or msg is NULL");
  REFUSED(ipcref_recv(NULL, &got, 0), "ipcref_recv", "p or out is NULL");
  REFUSED(ipcref_recv_on(q, NULL, 0, NULL), "ipcref_recv", "p or out is NULL");
  REFUSED(ipcref_recv(q, &got, -2), "ipcref_recv", "timeout_ms below -1");
  REFUSED(ipcref_recv_on(q, &got, -7, NULL), "ipcref_recv",
          "timeout_ms below -1");
  /* A message exported here, imported on the peer it was exported to:
   * refused, the message untouched (its fds open, its lease live), and
   * then settled by ipcref_msg_free. */
  CHECK_EQ(ipcref_export(p, &v, msg), IPCREF_OK);
  CHECK(msg->nfds > 0);
  REFUSED(ipcref_import(p, msg, &got), "ipcref_import",
          "exported through this peer");
  CHECK(msg->nfds > 0 && fcntl(msg->fds[0], F_GETFD) != -1);
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  CHECK_EQ(in.leases, 1);
  ipcref_msg_free(msg);
  CHECK_EQ(msg->nfds, 0);
  memset(msg, 0, sizeof *msg);
  msg->nfds = -1;
  REFUSED(ipcref_import(q, msg, &got), "ipcref_import", "msg->nfds");
  REFUSED(ipcref_peer_flush(NULL), "ipcref_peer_flush", "p is NULL");
  REFUSED(ipcref_peer_stats(p, NULL), "ipcref_peer_stats", "p or out is NULL");
  REFUSED(ipcref_peer_set_options(NULL, NULL), "ipcref_peer_set_options",
          "p is NULL");
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  CHECK_EQ(in.leases, 0); /* nothing refused took a lease */
  hear_nothing_yet();
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK); /* a good one says nothing */
  CHECK_EQ(ipcref_recv(q, &got, 5000), IPCREF_OK);
  CHECK_EQ(heard.calls, 0);
  ipcref_view_release(&got);
  ipcref_view_release(&theirs);
  ipcref_view_release(&heap);
  ipcref_view_release(&v);
  two_peers_free(ctx, other, p, q);
  free(msg);
}
/* The calls that take a message, and a few others that cannot fail:
 * NULL and counts out of range change nothing and tell nothing (a NULL
 * peer for the calls that return an error is named). */
static void test_share_msg_args(void) {
  ipcref_ctx *ctx = NULL, *other = NULL;
  ipcref_peer *p = NULL, *q = NULL;
  ipcref_msg *msg = (ipcref_msg *)calloc(1, sizeof *msg);
  ipcref_peer_info in;
  ipcref_view v;
  ipcref_buf *b = NULL;
  size_t len = 7;
  int64_t n = 8;
  two_peers(&ctx, &other, &p, &q);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  hear_nothing_yet();
  ipcref_msg_free(NULL);
  ipcref_msg_sent(NULL);
  CHECK(ipcref_msg_meta(NULL, &len) == NULL && len == 0);
  CHECK(ipcref_msg_meta(msg, NULL) == NULL);
  msg->len = sizeof msg->bytes + 1;
  len = 7;
  CHECK(ipcref_msg_meta(msg, &len) == NULL && len == 0);
  CHECK_EQ(ipcref_peer_alive(NULL), 0);
  CHECK_EQ(ipcref_buf_is_shared_mut(NULL), 0);
  CHECK_EQ(heard.calls, 0);
  /* An exported message with its counts damaged: freeing it closes no fd
   * it does not hold and leaves the lease alone (its bytes are not read
   * past their length); the undamaged one ends it. */
  CHECK_EQ(ipcref_export(p, &v, msg), IPCREF_OK);
  {
    ipcref_msg *bad = (ipcref_msg *)malloc(sizeof *bad);
    memcpy(bad, msg, sizeof *bad);
    bad->nfds = -3;
    bad->len = sizeof bad->bytes + 1;
    ipcref_msg_free(bad);
    CHECK_EQ(bad->nfds, 0);
    CHECK(fcntl(msg->fds[0], F_GETFD) != -1); /* still msg's */
    CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
    CHECK_EQ(in.leases, 1);
    memcpy(bad, msg, sizeof *bad);
    bad->nfds = 1000; /* at most IPCREF_MSG_MAX_FDS are looked at */
    bad->origin_ctx = bad->origin_peer = 0; /* a copy, not the export */
    for (n = 0; n < IPCREF_MSG_MAX_FDS; n++) bad->fds[n] = -1;
    ipcref_msg_free(bad);
    CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
    CHECK_EQ(in.leases, 1);
    free(bad);
  }
  ipcref_msg_free(msg);
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  CHECK_EQ(in.leases, 0);
  CHECK_EQ(heard.calls, 0);
  REFUSED(ipcref_send_on(NULL, &v, NULL), "ipcref_send_on",
          "p or views is NULL");
  REFUSED(ipcref_send_on(p, NULL, NULL), "ipcref_send_on",
          "p or views is NULL");
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  CHECK_EQ(in.leases, 0);
  {
    ipcref_peer_options o;
    memset(&o, 0, sizeof o);
    o.send_timeout_ms = -5;
    REFUSED(ipcref_peer_set_options(p, &o), "ipcref_peer_set_options",
            "a negative timeout");
    QUIET(ipcref_peer_set_options(p, NULL)); /* the defaults */
  }
  CHECK_EQ(ipcref_buf_new(8, &b), IPCREF_OK);
  CHECK_EQ(ipcref_buf_is_shared_mut(b), 0);
  ipcref_buf_release(b);
  ipcref_view_release(&v);
  two_peers_free(ctx, other, p, q);
  free(msg);
}
#endif /* IPCREF__SHARING_IMPL */

int main(void) {
  ipcref_set_error_hook(&hook);
  RUN(test_buf_new);
  RUN(test_buf_wrap);
  RUN(test_buf_make_mut);
  RUN(test_view_new_of);
  RUN(test_view_invalid);
  RUN(test_view_ops_nulls);
  RUN(test_view_dims);
  RUN(test_view_permute);
  RUN(test_view_reshape);
  RUN(test_view_flatten);
  RUN(test_view_expand);
  RUN(test_view_squeeze_as_strided);
  RUN(test_view_copy);
  RUN(test_released_told_once);
  RUN(test_dlpack_dtypes);
  RUN(test_dlpack_views);
  RUN(test_dlpack_versioned);
  RUN(test_table_ids);
  RUN(test_table_put);
  RUN(test_table_messages);
  RUN(test_table_view);
  RUN(test_gpu_args);
#ifdef IPCREF__SHARING_IMPL
  RUN(test_share_ctx_args);
  RUN(test_share_peer_args);
  RUN(test_share_send_args);
  RUN(test_share_msg_args);
#endif
  ipcref_set_error_hook(NULL);
  return harness_finish();
}
