/* The DLPack layer: dtypes both ways, export (the deleter releases our
 * reference), import (the producer's deleter runs exactly once, when our
 * last reference goes, and never on error), strided, negative-stride,
 * zero-size and 0-d tensors, every wrong input, a tensor lent read-only
 * (never written, even unique or opened for shared writes, nor exported
 * writable), and with a DLPack 1.x header the versioned structs. Library
 * allocations go through a counting allocator so that each test proves that
 * everything it made is freed.
 *
 * Build against the system header (DLPack 0.6 on Debian 12) or any other
 * with -I: the versioned tests run when the header defines
 * DLPACK_MAJOR_VERSION.
 *
 * Received memory (fork + socketpair, a real producer and consumer): a
 * consumer's read-only mapping is refused by the legacy export (ENEEDCOPY,
 * and the error hook names the ways out), goes out flagged READ_ONLY in the
 * versioned one, and with the producer's writable_shares goes out legacy
 * and a write through it reaches the producer. Children are forked before
 * the producer makes its context, report through their exit status, and
 * free all they made before they _exit (valgrind checks them too). */
#define _GNU_SOURCE /* the sharing layer needs GNU declarations */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlpack/dlpack.h>

#include "harness.h"

#include "counting_alloc.h"
#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"

#ifndef IPCREF_HAVE_DLPACK
#error "ipcref.h must offer the DLPack layer when <dlpack/dlpack.h> comes first"
#endif

/* ---- helpers */

/* Fills every byte of the view's buffer with a pattern (the buffer must be
 * unique). */
static void fill_bytes(const ipcref_view *v, unsigned seed) {
  unsigned char *p = (unsigned char *)ipcref_buf_get_mut(v->buf);
  size_t i, n = ipcref_buf_size(v->buf);
  CHECK(p != NULL || n == 0);
  for (i = 0; p && i < n; i++) p[i] = (unsigned char)(i * 7u + seed);
}

/* 1 when the two views visit the very same addresses in C order. */
static int same_addresses(const ipcref_view *a, const ipcref_view *b) {
  ipcref_view_iter ia, ib;
  void *pa, *pb;
  if (ipcref_view_numel(a) != ipcref_view_numel(b)) return 0;
  if (ipcref_view_iter_init(a, &ia) != IPCREF_OK ||
      ipcref_view_iter_init(b, &ib) != IPCREF_OK)
    return 0;
  for (;;) {
    pa = ipcref_view_iter_next(&ia);
    pb = ipcref_view_iter_next(&ib);
    if (pa != pb) return 0;
    if (!pa) return 1;
  }
}

/* The address of element `index` of a DLTensor, as a consumer computes it. */
static void *dl_elem(const DLTensor *t, const int64_t *index) {
  int64_t off = 0;
  int d;
  for (d = 0; d < t->ndim; d++) off += index[d] * t->strides[d];
  return (char *)t->data + t->byte_offset + off * ((t->dtype.bits + 7) / 8);
}

/* 1 when the DLTensor describes the same elements at the same addresses as
 * the view (shape, strides, dtype and every element's address). */
static int dl_matches(const DLTensor *t, const ipcref_view *v) {
  int64_t index[IPCREF_MAX_DIMS] = {0};
  int64_t n = ipcref_view_numel(v), k;
  int d;
  DLDataType dt;
  if (t->ndim != v->ndim) return 0;
  if (ipcref_dtype_to_dlpack(v->dtype, &dt) != IPCREF_OK) return 0;
  if (t->dtype.code != dt.code || t->dtype.bits != dt.bits ||
      t->dtype.lanes != 1)
    return 0;
  if (t->device.device_type != kDLCPU || t->device.device_id != 0) return 0;
  for (d = 0; d < v->ndim; d++)
    if (t->shape[d] != v->shape[d] || t->strides[d] != v->strides[d]) return 0;
  for (k = 0; k < n; k++) {
    if (dl_elem(t, index) != ipcref_view_ptr(v, index)) return 0;
    for (d = v->ndim - 1; d >= 0; d--) {
      if (++index[d] < v->shape[d]) break;
      index[d] = 0;
    }
  }
  return 1;
}

/* A foreign producer: its own memory, shape and strides, and a deleter that
 * counts its calls. */
typedef struct fake {
  DLManagedTensor mt;
  int64_t shape[16];
  int64_t strides[16];
  void *mem;
} fake;

static int fake_deleted;

static void fake_deleter(DLManagedTensor *self) {
  fake *f = (fake *)self->manager_ctx;
  fake_deleted++;
  free(f->mem);
  free(f);
}

/* A fake tensor of `ndim` dims over `bytes` bytes of fresh memory (filled
 * with a pattern); data points `data_off` bytes into it. strides may be
 * NULL (then the tensor has none). */
static fake *fake_new(DLDataType dt, int ndim, const int64_t *shape,
                      const int64_t *strides, size_t bytes, size_t data_off) {
  fake *f = (fake *)calloc(1, sizeof *f);
  size_t i;
  int d;
  f->mem = malloc(bytes ? bytes : 1);
  for (i = 0; i < bytes; i++) ((unsigned char *)f->mem)[i] = (unsigned char)i;
  for (d = 0; d < ndim && d < 16; d++) {
    f->shape[d] = shape[d];
    f->strides[d] = strides ? strides[d] : 0;
  }
  f->mt.dl_tensor.data = (char *)f->mem + data_off;
  f->mt.dl_tensor.device.device_type = kDLCPU;
  f->mt.dl_tensor.device.device_id = 0;
  f->mt.dl_tensor.ndim = ndim;
  f->mt.dl_tensor.dtype = dt;
  f->mt.dl_tensor.shape = f->shape;
  f->mt.dl_tensor.strides = strides ? f->strides : NULL;
  f->mt.dl_tensor.byte_offset = 0;
  f->mt.manager_ctx = f;
  f->mt.deleter = fake_deleter;
  return f;
}

static DLDataType dl_type(uint8_t code, uint8_t bits) {
  DLDataType t;
  t.code = code;
  t.bits = bits;
  t.lanes = 1;
  return t;
}

/* ---- dtypes */

static void test_dtype_map(void) {
  static const struct {
    ipcref_dtype dt;
    uint8_t code, bits;
  } table[] = {{IPCREF_BOOL, 6, 8},           {IPCREF_I8, kDLInt, 8},
               {IPCREF_I16, kDLInt, 16},      {IPCREF_I32, kDLInt, 32},
               {IPCREF_I64, kDLInt, 64},      {IPCREF_U8, kDLUInt, 8},
               {IPCREF_U16, kDLUInt, 16},     {IPCREF_U32, kDLUInt, 32},
               {IPCREF_U64, kDLUInt, 64},     {IPCREF_F16, kDLFloat, 16},
               {IPCREF_BF16, kDLBfloat, 16},  {IPCREF_F32, kDLFloat, 32},
               {IPCREF_F64, kDLFloat, 64},    {IPCREF_C64, kDLComplex, 64},
               {IPCREF_C128, kDLComplex, 128}};
  size_t i;
  DLDataType t;
  ipcref_dtype back;
  CHECK_EQ(sizeof table / sizeof table[0], IPCREF_DTYPE_COUNT);
  for (i = 0; i < sizeof table / sizeof table[0]; i++) {
    memset(&t, 0xff, sizeof t);
    CHECK_EQ(ipcref_dtype_to_dlpack(table[i].dt, &t), IPCREF_OK);
    CHECK_EQ(t.code, table[i].code);
    CHECK_EQ(t.bits, table[i].bits);
    CHECK_EQ(t.lanes, 1);
    CHECK_EQ(t.bits, 8 * ipcref_dtype_size(table[i].dt));
    back = IPCREF_DTYPE_COUNT;
    CHECK_EQ(ipcref_dtype_from_dlpack(t, &back), IPCREF_OK);
    CHECK_EQ(back, table[i].dt);
  }
  /* Wrong ones, both ways. */
  CHECK_EQ(ipcref_dtype_to_dlpack(IPCREF_DTYPE_COUNT, &t), IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_to_dlpack((ipcref_dtype)-1, &t), IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_to_dlpack(IPCREF_F32, NULL), IPCREF_EINVAL);
  back = IPCREF_DTYPE_COUNT;
  t = dl_type(kDLFloat, 32);
  t.lanes = 4;
  CHECK_EQ(ipcref_dtype_from_dlpack(t, &back), IPCREF_EINVAL);
  t.lanes = 0;
  CHECK_EQ(ipcref_dtype_from_dlpack(t, &back), IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(kDLFloat, 8), &back),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(kDLInt, 128), &back),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(kDLBfloat, 32), &back),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(kDLComplex, 32), &back),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(6, 1), &back), IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(kDLOpaqueHandle, 64), &back),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(8, 8), &back), IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(200, 32), &back), IPCREF_EINVAL);
  CHECK_EQ(ipcref_dtype_from_dlpack(dl_type(kDLFloat, 32), NULL),
           IPCREF_EINVAL);
  CHECK_EQ(back, IPCREF_DTYPE_COUNT); /* untouched by every failure */
}

/* ---- export */

static void test_export_basic(void) {
  long before = live_allocs;
  int64_t shape[2] = {2, 3};
  ipcref_view v;
  DLManagedTensor *mt = NULL;
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 2, shape, &v), IPCREF_OK);
  fill_bytes(&v, 1);
  CHECK_EQ(ipcref_view_to_dlpack(&v, &mt), IPCREF_OK);
  CHECK(mt != NULL);
  if (!mt) return;
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 2);
  CHECK(mt->dl_tensor.data == ipcref_buf_data(v.buf));
  CHECK_EQ(mt->dl_tensor.byte_offset, 0);
  CHECK_EQ(mt->dl_tensor.ndim, 2);
  CHECK_EQ(mt->dl_tensor.shape[0], 2);
  CHECK_EQ(mt->dl_tensor.shape[1], 3);
  CHECK_EQ(mt->dl_tensor.strides[0], 3);
  CHECK_EQ(mt->dl_tensor.strides[1], 1);
  CHECK_EQ(mt->dl_tensor.dtype.code, kDLFloat);
  CHECK_EQ(mt->dl_tensor.dtype.bits, 32);
  CHECK_EQ(mt->dl_tensor.dtype.lanes, 1);
  CHECK_EQ(mt->dl_tensor.device.device_type, kDLCPU);
  CHECK_EQ(mt->dl_tensor.device.device_id, 0);
  CHECK(mt->deleter != NULL);
  CHECK(dl_matches(&mt->dl_tensor, &v));
  /* The export outlives the view: the data stays until the deleter. */
  ipcref_view_release(&v);
  CHECK(live_allocs > before);
  CHECK_EQ(((unsigned char *)mt->dl_tensor.data)[5], 5 * 7 + 1);
  mt->deleter(mt);
  CHECK_EQ(live_allocs, before);
}

static void test_export_every_dtype(void) {
  long before = live_allocs;
  int64_t shape[3] = {2, 3, 4};
  int dt;
  for (dt = 0; dt < IPCREF_DTYPE_COUNT; dt++) {
    ipcref_view v, back;
    DLManagedTensor *mt = NULL;
    CHECK_EQ(ipcref_view_new((ipcref_dtype)dt, 3, shape, &v), IPCREF_OK);
    fill_bytes(&v, (unsigned)dt);
    CHECK_EQ(ipcref_view_to_dlpack(&v, &mt), IPCREF_OK);
    if (!mt) continue;
    CHECK(dl_matches(&mt->dl_tensor, &v));
    CHECK_EQ(mt->dl_tensor.dtype.bits, 8 * ipcref_dtype_size((ipcref_dtype)dt));
    /* And back into ipcref: the same elements, no copy. */
    CHECK_EQ(ipcref_view_from_dlpack(mt, &back), IPCREF_OK);
    CHECK_EQ(back.dtype, dt);
    CHECK_EQ(back.ndim, 3);
    CHECK(memcmp(back.shape, v.shape, sizeof shape) == 0);
    CHECK(memcmp(back.strides, v.strides, sizeof shape) == 0);
    CHECK(same_addresses(&back, &v));
    CHECK_EQ(ipcref_buf_strong_count(v.buf), 2); /* the export's */
    ipcref_view_release(&back);                  /* runs our deleter */
    CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);
    ipcref_view_release(&v);
  }
  CHECK_EQ(live_allocs, before);
}

/* Strided views go out as they are: data at element (0,...,0), element
 * strides, negative and zero ones included. */
static void test_export_strided(void) {
  long before = live_allocs;
  int64_t shape[3] = {4, 5, 6}, small[2] = {1, 6}, big[3] = {3, 7, 6};
  ipcref_view base, views[7], one;
  int i, n = 0;
  CHECK_EQ(ipcref_view_new(IPCREF_I16, 3, shape, &base), IPCREF_OK);
  fill_bytes(&base, 3);
  CHECK_EQ(ipcref_view_transpose(&base, 0, 2, &views[n++]), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&base, 1, 1, 5, 2, &views[n++]), IPCREF_OK);
  CHECK_EQ(ipcref_view_flip(&base, 1, &views[n]), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&views[n], 2, 4, IPCREF_SLICE_MIN, -3, &views[n]),
           IPCREF_OK);
  n++;
  CHECK_EQ(ipcref_view_select(&base, 0, 3, &views[n++]), IPCREF_OK);
  CHECK_EQ(ipcref_view_select(&base, 0, 2, &one), IPCREF_OK);
  CHECK_EQ(ipcref_view_select(&one, 0, 4, &one), IPCREF_OK);
  CHECK_EQ(ipcref_view_select(&one, 0, 5, &views[n++]), IPCREF_OK); /* 0-d */
  CHECK_EQ(ipcref_view_reshape(&one, 2, small, &one), IPCREF_OK);
  CHECK_EQ(ipcref_view_expand(&one, 3, big, &views[n++]), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&base, 0, 2, 2, 1, &views[n++]), IPCREF_OK);
  ipcref_view_release(&one);
  CHECK_EQ(views[2].strides[1], -6); /* flipped: negative */
  CHECK_EQ(views[2].strides[2], -3); /* stepped backwards */
  CHECK_EQ(views[5].strides[0], 0);  /* expanded */
  CHECK_EQ(views[6].shape[0], 0);    /* empty */
  for (i = 0; i < n; i++) {
    DLManagedTensor *mt = NULL;
    ipcref_view back;
    CHECK_EQ(ipcref_view_to_dlpack(&views[i], &mt), IPCREF_OK);
    if (!mt) continue;
    CHECK(dl_matches(&mt->dl_tensor, &views[i]));
    CHECK_EQ(mt->dl_tensor.byte_offset, 0);
    CHECK(mt->dl_tensor.data ==
          (char *)ipcref_buf_data(base.buf) + views[i].byte_offset);
    CHECK_EQ(ipcref_view_from_dlpack(mt, &back), IPCREF_OK);
    CHECK(same_addresses(&back, &views[i]));
    CHECK(memcmp(back.strides, views[i].strides,
                 (size_t)views[i].ndim * sizeof(int64_t)) == 0);
    /* The imported buffer covers exactly what the view can reach. */
    if (ipcref_view_numel(&views[i]) > 0) {
      const int64_t zero[IPCREF_MAX_DIMS] = {0};
      CHECK(ipcref_view_ptr(&back, zero) == ipcref_view_ptr(&views[i], zero));
    }
    ipcref_view_release(&back);
  }
  CHECK_EQ(ipcref_buf_strong_count(base.buf), 1 + n);
  for (i = 0; i < n; i++) ipcref_view_release(&views[i]);
  ipcref_view_release(&base);
  CHECK_EQ(live_allocs, before);
}

static void test_export_errors(void) {
  long before = live_allocs;
  int64_t shape[1] = {8};
  ipcref_view v, zero;
  DLManagedTensor *mt = (DLManagedTensor *)&shape; /* a sentinel */
  DLManagedTensor *const sentinel = mt;
  memset(&zero, 0, sizeof zero);
  CHECK_EQ(ipcref_view_new(IPCREF_U8, 1, shape, &v), IPCREF_OK);
  CHECK_EQ(ipcref_view_to_dlpack(NULL, &mt), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_to_dlpack(&v, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_to_dlpack(&zero, &mt), IPCREF_EINVAL);
  {
    ipcref_view bad = v;
    bad.shape[0] = 9; /* reaches past the buffer */
    CHECK_EQ(ipcref_view_to_dlpack(&bad, &mt), IPCREF_EINVAL);
    bad = v;
    bad.dtype = IPCREF_DTYPE_COUNT;
    CHECK_EQ(ipcref_view_to_dlpack(&bad, &mt), IPCREF_EINVAL);
  }
  fail_alloc_in = 1;
  CHECK_EQ(ipcref_view_to_dlpack(&v, &mt), IPCREF_ENOMEM);
  CHECK(mt == sentinel);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, before);
}

/* ---- import */

/* A foreign tensor: our view reads the producer's memory in place, and
 * views derived from it keep it alive; the deleter runs exactly once, when
 * the last of them goes. */
static void test_import_lifetime(void) {
  long before = live_allocs;
  int64_t shape[2] = {3, 4}, idx[2] = {2, 1};
  fake *f = fake_new(dl_type(kDLInt, 32), 2, shape, NULL, 48, 0);
  int32_t *data = (int32_t *)f->mem;
  ipcref_view v, row, col;
  int k;
  for (k = 0; k < 12; k++) data[k] = k * 10;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &v), IPCREF_OK);
  CHECK_EQ(fake_deleted, 0);
  CHECK_EQ(v.dtype, IPCREF_I32);
  CHECK_EQ(v.ndim, 2);
  CHECK_EQ(v.strides[0], 4); /* NULL strides: compact row-major */
  CHECK_EQ(v.strides[1], 1);
  CHECK_EQ(ipcref_buf_size(v.buf), 48);
  CHECK(ipcref_view_ptr(&v, idx) == &data[9]);
  CHECK_EQ(*(int32_t *)ipcref_view_ptr(&v, idx), 90);
  /* Derived views outlive the imported one. */
  CHECK_EQ(ipcref_view_select(&v, 0, 1, &row), IPCREF_OK);
  CHECK_EQ(ipcref_view_select(&v, 1, 3, &col), IPCREF_OK);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 0);
  CHECK_EQ(*(int32_t *)ipcref_view_ptr(&col, idx), 110);
  ipcref_view_release(&row);
  CHECK_EQ(fake_deleted, 0);
  ipcref_view_release(&col);
  CHECK_EQ(fake_deleted, 1);
  CHECK_EQ(live_allocs, before);
}

/* An imported legacy tensor is ours to write while we hold the only
 * reference (the producer handed it over); writes land in its memory. */
static void test_import_writes_in_place(void) {
  long before = live_allocs;
  int64_t shape[1] = {4};
  fake *f = fake_new(dl_type(kDLFloat, 64), 1, shape, NULL, 32, 0);
  double *mem = (double *)f->mem;
  ipcref_view v, copy;
  double *p;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &v), IPCREF_OK);
  p = (double *)ipcref_view_data_mut(&v);
  CHECK(p == mem);
  if (p) p[3] = 2.5;
  CHECK(mem[3] == 2.5);
  /* Shared: copy-on-write leaves the producer's memory alone. */
  CHECK_EQ(ipcref_view_clone(&v, &copy), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&v) == NULL);
  CHECK_EQ(ipcref_view_make_mut(&copy), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&copy) != mem);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 1); /* the copy does not keep it */
  ipcref_view_release(&copy);
  CHECK_EQ(live_allocs, before);
}

/* Negative strides reach below `data`: the buffer starts at the lowest
 * element, and the view's offset points back at element (0,...,0). */
static void test_import_negative_strides(void) {
  long before = live_allocs;
  /* A 3x4 i16 matrix at mem[0..11], seen flipped on both dims and stepped:
   * element (0,0) is mem[11], strides (-4, -1). Then a 2x2 one with
   * strides (-8, 2) from mem[8]: reaches mem[0], mem[2], mem[8], mem[10]. */
  int64_t shape[2] = {3, 4}, strides[2] = {-4, -1};
  int64_t shape2[2] = {2, 2}, strides2[2] = {-8, 2};
  int64_t idx[2];
  fake *f = fake_new(dl_type(kDLInt, 16), 2, shape, strides, 24, 22);
  fake *g = fake_new(dl_type(kDLUInt, 16), 2, shape2, strides2, 40, 16);
  int16_t *m = (int16_t *)f->mem;
  ipcref_view v, w;
  int k;
  for (k = 0; k < 12; k++) m[k] = (int16_t)k;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &v), IPCREF_OK);
  CHECK(ipcref_buf_data(v.buf) == f->mem);
  CHECK_EQ(ipcref_buf_size(v.buf), 24);
  CHECK_EQ(v.byte_offset, 22);
  for (k = 0; k < 12; k++) {
    idx[0] = k / 4;
    idx[1] = k % 4;
    CHECK_EQ(*(int16_t *)ipcref_view_ptr(&v, idx), 11 - k);
  }
  CHECK_EQ(ipcref_view_from_dlpack(&g->mt, &w), IPCREF_OK);
  CHECK(ipcref_buf_data(w.buf) == g->mem);
  CHECK_EQ(ipcref_buf_size(w.buf), 22); /* mem[0] .. mem[10] */
  CHECK_EQ(w.byte_offset, 16);
  idx[0] = 1;
  idx[1] = 1;
  CHECK(ipcref_view_ptr(&w, idx) == (uint16_t *)g->mem + 2);
  ipcref_view_release(&v);
  ipcref_view_release(&w);
  CHECK_EQ(fake_deleted, 2);
  CHECK_EQ(live_allocs, before);
}

/* byte_offset is honoured (data + byte_offset is element (0,...,0)), and
 * stride-0 (broadcast) dims are accepted. */
static void test_import_byte_offset_and_broadcast(void) {
  long before = live_allocs;
  int64_t shape[2] = {5, 3}, strides[2] = {0, 1}, idx[2] = {4, 2};
  fake *f = fake_new(dl_type(kDLUInt, 8), 2, shape, strides, 64, 0);
  ipcref_view v;
  f->mt.dl_tensor.byte_offset = 40;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &v), IPCREF_OK);
  CHECK_EQ(ipcref_buf_size(v.buf), 3);
  CHECK(ipcref_buf_data(v.buf) == (char *)f->mem + 40);
  CHECK_EQ(*(uint8_t *)ipcref_view_ptr(&v, idx), 42);
  CHECK(ipcref_view_data_mut(&v) != NULL); /* unique, although broadcast */
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 1);
  CHECK_EQ(live_allocs, before);
}

/* Zero-size tensors (even with a NULL data pointer or strides that would
 * overflow) and 0-d tensors (shape NULL). */
static void test_import_empty_and_scalar(void) {
  long before = live_allocs;
  int64_t shape[3] = {4, 0, 3}, huge[3] = {0, INT64_MAX, INT64_MAX};
  int64_t bigstrides[3] = {INT64_MAX, INT64_MAX, INT64_MAX};
  fake *a = fake_new(dl_type(kDLFloat, 32), 3, shape, NULL, 0, 0);
  fake *b = fake_new(dl_type(kDLFloat, 32), 3, huge, NULL, 0, 0);
  fake *c = fake_new(dl_type(kDLComplex, 128), 3, huge, bigstrides, 0, 0);
  fake *s = fake_new(dl_type(kDLFloat, 64), 0, NULL, NULL, 8, 0);
  ipcref_view v;
  fake_deleted = 0;
  a->mt.dl_tensor.data = NULL;
  CHECK_EQ(ipcref_view_from_dlpack(&a->mt, &v), IPCREF_OK);
  CHECK_EQ(ipcref_view_numel(&v), 0);
  CHECK_EQ(v.ndim, 3);
  CHECK_EQ(v.shape[1], 0);
  CHECK_EQ(ipcref_view_is_contiguous(&v), 1);
  {
    /* An empty view goes out and in again. */
    DLManagedTensor *mt = NULL;
    ipcref_view w;
    CHECK_EQ(ipcref_view_to_dlpack(&v, &mt), IPCREF_OK);
    if (mt) {
      CHECK_EQ(mt->dl_tensor.shape[1], 0);
      /* Never NULL data (PyTorch 1.13 would never call the deleter). */
      CHECK(ipcref_buf_data(v.buf) == NULL);
      CHECK(mt->dl_tensor.data != NULL);
      CHECK_EQ(ipcref_view_from_dlpack(mt, &w), IPCREF_OK);
      CHECK_EQ(ipcref_view_numel(&w), 0);
      ipcref_view_release(&w);
    }
  }
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 1);
  CHECK_EQ(ipcref_view_from_dlpack(&b->mt, &v), IPCREF_OK);
  CHECK_EQ(ipcref_view_numel(&v), 0);
  ipcref_view_release(&v);
  CHECK_EQ(ipcref_view_from_dlpack(&c->mt, &v), IPCREF_OK);
  CHECK_EQ(v.dtype, IPCREF_C128);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 3);

  ((double *)s->mem)[0] = 6.25;
  CHECK_EQ(ipcref_view_from_dlpack(&s->mt, &v), IPCREF_OK);
  CHECK_EQ(v.ndim, 0);
  CHECK_EQ(ipcref_view_numel(&v), 1);
  CHECK_EQ(ipcref_buf_size(v.buf), 8);
  CHECK(*(double *)ipcref_view_ptr(&v, NULL) == 6.25);
  {
    DLManagedTensor *mt = NULL;
    CHECK_EQ(ipcref_view_to_dlpack(&v, &mt), IPCREF_OK);
    if (mt) {
      CHECK_EQ(mt->dl_tensor.ndim, 0);
      CHECK(*(double *)mt->dl_tensor.data == 6.25);
      mt->deleter(mt);
    }
  }
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 4);
  CHECK_EQ(live_allocs, before);
}

/* Every wrong input: the right code, *out untouched, no deleter call, and
 * the caller still owns the tensor. */
static void test_import_errors(void) {
  long before = live_allocs;
  int64_t shape[2] = {3, 4}, strides[2] = {4, 1};
  fake *f = fake_new(dl_type(kDLFloat, 32), 2, shape, strides, 48, 0);
  DLTensor good = f->mt.dl_tensor;
  DLTensor *t = &f->mt.dl_tensor;
  ipcref_view out, sentinel;
  int64_t big[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  int64_t overflow[2] = {INT64_MAX / 2, 4};
  int64_t far[2] = {INT64_MAX / 2, 1};
  memset(&sentinel, 0x5a, sizeof sentinel);
  out = sentinel;
  fake_deleted = 0;

#define EXPECT_IMPORT(code)                                                    \
  do {                                                                         \
    CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &out), code);                     \
    CHECK(memcmp(&out, &sentinel, sizeof out) == 0);                           \
    CHECK_EQ(fake_deleted, 0);                                                 \
    *t = good;                                                                 \
  } while (0)

  CHECK_EQ(ipcref_view_from_dlpack(NULL, &out), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, NULL), IPCREF_EINVAL);
  t->device.device_type = kDLCUDA; /* device memory, but no such ordinal */
  t->device.device_id = -1;
  EXPECT_IMPORT(IPCREF_ENODEV);
  t->device.device_type = kDLCUDAHost;
  EXPECT_IMPORT(IPCREF_ENODEV);
  t->device.device_type = (DLDeviceType)99;
  EXPECT_IMPORT(IPCREF_ENODEV);
  t->device.device_id = 1;
  EXPECT_IMPORT(IPCREF_ENODEV);
  t->ndim = IPCREF_MAX_DIMS + 1;
  t->shape = big;
  t->strides = NULL;
  EXPECT_IMPORT(IPCREF_ERANGE);
  t->ndim = -1;
  EXPECT_IMPORT(IPCREF_ERANGE);
  t->dtype.lanes = 2;
  EXPECT_IMPORT(IPCREF_EINVAL);
  t->dtype.lanes = 0;
  EXPECT_IMPORT(IPCREF_EINVAL);
  t->dtype.code = 77;
  EXPECT_IMPORT(IPCREF_EINVAL);
  t->dtype.bits = 24;
  EXPECT_IMPORT(IPCREF_EINVAL);
  t->dtype = dl_type(kDLOpaqueHandle, 64);
  EXPECT_IMPORT(IPCREF_EINVAL);
  t->shape = NULL;
  EXPECT_IMPORT(IPCREF_EINVAL);
  t->data = NULL;
  EXPECT_IMPORT(IPCREF_EINVAL);
  f->shape[1] = -4;
  EXPECT_IMPORT(IPCREF_ERANGE);
  f->shape[1] = 4;
  t->shape = overflow; /* element count overflows int64 */
  EXPECT_IMPORT(IPCREF_ERANGE);
  t->shape = far; /* the stride reach overflows (elements, then bytes) */
  t->strides = overflow;
  EXPECT_IMPORT(IPCREF_ERANGE);
  t->shape = far;
  t->strides = NULL; /* fits as elements, not as bytes */
  EXPECT_IMPORT(IPCREF_ERANGE);
  t->byte_offset = (uint64_t)INT64_MAX + 1;
  EXPECT_IMPORT(IPCREF_ERANGE);
  t->byte_offset = UINT64_MAX - 8;
  EXPECT_IMPORT(IPCREF_ERANGE);
  {
    /* Negative strides from an address too low to reach that far down. */
    int64_t neg[2] = {-4, -1};
    t->data = (void *)(uintptr_t)16;
    t->strides = neg;
    EXPECT_IMPORT(IPCREF_ERANGE);
  }
  /* Out of memory: for our record, then for the buffer's header. */
  fail_alloc_in = 1;
  EXPECT_IMPORT(IPCREF_ENOMEM);
  fail_alloc_in = 2;
  EXPECT_IMPORT(IPCREF_ENOMEM);
  fail_alloc_in = 0;
#undef EXPECT_IMPORT

  CHECK_EQ(live_allocs, before);
  /* Still ours: it imports fine now, and the deleter runs once. */
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &out), IPCREF_OK);
  CHECK_EQ(fake_deleted, 0);
  ipcref_view_release(&out);
  CHECK_EQ(fake_deleted, 1);
  CHECK_EQ(live_allocs, before);
}

/* A NULL deleter is allowed by DLPack: nothing to call. */
static void test_import_null_deleter(void) {
  long before = live_allocs;
  int64_t shape[1] = {4};
  fake *f = fake_new(dl_type(kDLInt, 8), 1, shape, NULL, 4, 0);
  ipcref_view v;
  f->mt.deleter = NULL;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &v), IPCREF_OK);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 0);
  CHECK_EQ(live_allocs, before);
  free(f->mem);
  free(f);
}

/* A framework's device tensor (kDLCUDA, ordinal 1) is adopted as device
 * memory: views of it work, the buffer says where it lives, an export
 * reports the same device, and nothing copies it on the host (EDEVICE).
 * The "device" memory here is host memory with a device label, never
 * touched by the library (ASan would see it if it were, after the free). */
static void test_device_tensor(void) {
  long before = live_allocs;
  int64_t shape[2] = {4, 8}, strides[2] = {8, 1}, idx[2] = {1, 2};
  fake *f = fake_new(dl_type(kDLFloat, 32), 2, shape, strides, 128, 0);
  ipcref_view v, t, c, sel;
  ipcref_buf *b;
  ipcref_device dev;
  DLManagedTensor *out = NULL;
  f->mt.dl_tensor.device.device_type = kDLCUDA;
  f->mt.dl_tensor.device.device_id = 1;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack(&f->mt, &v), IPCREF_OK);
  dev = ipcref_buf_device(v.buf);
  CHECK_EQ(dev.type, IPCREF_DEVICE_CUDA);
  CHECK_EQ(dev.id, 1);
  /* Metadata-only views are fine on a device; addresses are computed,
   * never dereferenced. */
  CHECK_EQ(ipcref_view_transpose(&v, 0, 1, &t), IPCREF_OK);
  CHECK(ipcref_view_ptr(&v, idx) == (char *)f->mem + 4 * (8 + 2));
  CHECK_EQ(ipcref_view_select(&v, 0, 3, &sel), IPCREF_OK);
  /* What would copy on the host refuses. */
  CHECK_EQ(ipcref_view_contiguous(&t, &c), IPCREF_EDEVICE);
  CHECK_EQ(ipcref_view_copy(&v, &v), IPCREF_EDEVICE);
  CHECK_EQ(ipcref_view_make_mut(&t), IPCREF_EDEVICE);
  b = ipcref_buf_retain(v.buf);
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_EDEVICE);
  CHECK(b == v.buf);
  ipcref_buf_release(b);
  CHECK_EQ(ipcref_view_reshape_copy(&t, 1, (const int64_t[]){32}, &c),
           IPCREF_EDEVICE);
  /* Out again: the same device. */
  CHECK_EQ(ipcref_view_to_dlpack(&sel, &out), IPCREF_OK);
  CHECK_EQ(out->dl_tensor.device.device_type, kDLCUDA);
  CHECK_EQ(out->dl_tensor.device.device_id, 1);
  out->deleter(out);
  ipcref_view_release(&sel);
  ipcref_view_release(&t);
  CHECK_EQ(fake_deleted, 0);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 1);
  CHECK_EQ(live_allocs, before);
}

/* Import in one thread of ownership, release in another place: the deleter
 * runs with the last reference even when it is a clone made from an
 * exported-then-imported chain (ipcref -> DLPack -> ipcref -> DLPack). */
static void test_chain(void) {
  long before = live_allocs;
  int64_t shape[2] = {6, 2}, last_row[2] = {5, 0};
  ipcref_view v, a, b;
  DLManagedTensor *m1 = NULL, *m2 = NULL;
  CHECK_EQ(ipcref_view_new(IPCREF_C64, 2, shape, &v), IPCREF_OK);
  fill_bytes(&v, 9);
  CHECK_EQ(ipcref_view_to_dlpack(&v, &m1), IPCREF_OK);
  if (!m1) return;
  CHECK_EQ(ipcref_view_from_dlpack(m1, &a), IPCREF_OK);
  CHECK_EQ(ipcref_view_flip(&a, 0, &a), IPCREF_OK);
  CHECK_EQ(ipcref_view_to_dlpack(&a, &m2), IPCREF_OK);
  if (!m2) return;
  CHECK_EQ(ipcref_view_from_dlpack(m2, &b), IPCREF_OK);
  CHECK(same_addresses(&a, &b));
  ipcref_view_release(&v);
  ipcref_view_release(&a);
  CHECK_EQ(*(unsigned char *)ipcref_view_ptr(&b, last_row), 9);
  ipcref_view_release(&b);
  CHECK_EQ(live_allocs, before);
}

/* ---- read-only imports */

/* The versioned export of `v` goes out flagged READ_ONLY (where this
 * DLPack has versioned tensors). */
static void versioned_read_only(const ipcref_view *v) {
#ifdef IPCREF_HAVE_DLPACK_VERSIONED
  struct DLManagedTensorVersioned *vt = NULL;
  CHECK_EQ(ipcref_view_to_dlpack_versioned(v, &vt), IPCREF_OK);
  if (vt) {
    CHECK(vt->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
    vt->deleter(vt);
  }
#else
  (void)v;
#endif
}

/* `v`: the whole of a 2x3 f32 tensor at `mem`, lent read-only, and
 * unique. It is never writable, not even opened for shared writes: no
 * pointer, no copy into it, no legacy export (ENEEDCOPY, nothing taken);
 * the versioned export says READ_ONLY; make_mut copies. No weak reference
 * is ours. */
static void check_lent_read_only(ipcref_view *v, const float *mem) {
  DLManagedTensor *const sentinel = (DLManagedTensor *)(void *)&fake_deleted;
  DLManagedTensor *mt = sentinel;
  int64_t shape[2] = {2, 3};
  float lent[6];
  ipcref_view zeros, c;
  memcpy(lent, mem, sizeof lent);
  CHECK_EQ(ipcref_buf_weak_count(v->buf), 0);
  CHECK(ipcref_buf_is_unique(v->buf));
  CHECK(ipcref_view_data_mut(v) == NULL);
  ipcref_buf_set_shared_mut(v->buf, 1);
  CHECK(ipcref_view_data_mut(v) == NULL);
  CHECK(ipcref_buf_get_mut(v->buf) == NULL);
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 2, shape, &zeros), IPCREF_OK);
  memset(ipcref_buf_data(zeros.buf), 0, sizeof lent);
  CHECK_EQ(ipcref_view_copy(v, &zeros), IPCREF_EBUSY);
  ipcref_view_release(&zeros);
  CHECK(memcmp(mem, lent, sizeof lent) == 0);
  CHECK_EQ(ipcref_view_to_dlpack(v, &mt), IPCREF_ENEEDCOPY);
  CHECK(mt == sentinel);
  CHECK_EQ(ipcref_buf_strong_count(v->buf), 1);
  versioned_read_only(v);
  ipcref_buf_set_shared_mut(v->buf, 0);
  CHECK_EQ(ipcref_view_clone(v, &c), IPCREF_OK);
  CHECK_EQ(ipcref_view_make_mut(&c), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&c) != NULL);
  CHECK(ipcref_view_data_mut(&c) != (const void *)mem);
  ipcref_view_release(&c);
}

/* A tensor lent read-only, as the versioned import of one flagged
 * READ_ONLY takes it: the common import with read_only set, called with
 * the legacy struct, so that this runs with a DLPack 0.x header too
 * (test_versioned_read_only goes through the public call). */
static void test_import_read_only(void) {
  long before = live_allocs;
  int64_t shape[2] = {2, 3};
  fake *f = fake_new(dl_type(kDLFloat, 32), 2, shape, NULL, 24, 0);
  ipcref_view v;
  fake_deleted = 0;
  CHECK_EQ(ipcref__dlpack_import(&f->mt.dl_tensor, &f->mt, 0, 1, &v,
                                 "test_import_read_only"),
           IPCREF_OK);
  check_lent_read_only(&v, (const float *)f->mem);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 1);
  CHECK_EQ(live_allocs, before);
}

/* ---- received memory (a real producer and consumer) */

#ifdef IPCREF_HAVE_SHARING
#define RECV_MS  20000 /* longest ipcref_recv in a child */
#define REAP_MS  30000 /* longest wait for a child to exit */
#define SHARED_N 4096  /* bytes in the shared view */

/* What the error hook heard (in the process that installed it). */
static int hook_calls;
static ipcref_result hook_code;
static char hook_message[1024];

static void hook_fn(void *user, ipcref_result code, const char *message) {
  (void)user;
  hook_calls++;
  hook_code = code;
  snprintf(hook_message, sizeof hook_message, "%s", message ? message : "");
}

static const ipcref_error_hook test_hook = {hook_fn, NULL};

/* Byte i of the producer's view, and what the consumer writes instead. */
static unsigned char produced(size_t i) {
  return (unsigned char)(i * 7u + 3u);
}
static unsigned char written(size_t i) {
  return (unsigned char)~produced(i);
}

/* Waits for the child; kills it after REAP_MS. The wait status or -1. */
static int reap_child(pid_t pid) {
  struct timespec ms = {0, 1000000};
  int st = 0, waited;
  if (pid <= 0) return -1;
  for (waited = 0; waited < REAP_MS; waited++) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return -1;
    nanosleep(&ms, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  printf("    child %d timed out: killed\n", (int)pid);
  return -1;
}

/* 1 when the exported tensor is the view's memory, element for element. */
static int same_memory(const DLTensor *t, const ipcref_view *v) {
  const int64_t zero[IPCREF_MAX_DIMS] = {0};
  return t->data == ipcref_view_ptr(v, zero) && t->byte_offset == 0 &&
         t->ndim == v->ndim && t->shape[0] == v->shape[0];
}

/* The consumer of a read-only mapping: no legacy export of it (nor of a
 * slice, an empty view, or the buffer marked for shared writes: the
 * mapping decides), nothing taken; the versioned export is READ_ONLY; a
 * private copy goes out legacy and its writes stay here. */
static void consumer_read_only(ipcref_view *v) {
  DLManagedTensor *const sentinel = (DLManagedTensor *)(void *)&hook_calls;
  DLManagedTensor *mt = sentinel;
  ipcref_view s, c;
  long before = live_allocs;
  int32_t strong = ipcref_buf_strong_count(v->buf);
  CHECK(ipcref_view_data_mut(v) == NULL); /* mapped read-only */
  hook_calls = 0;
  CHECK_EQ(ipcref_view_to_dlpack(v, &mt), IPCREF_ENEEDCOPY);
  CHECK(mt == sentinel);
  CHECK_EQ(ipcref_buf_strong_count(v->buf), strong);
  CHECK_EQ(live_allocs, before);
  CHECK_EQ(hook_calls, 1);
  CHECK_EQ(hook_code, IPCREF_ENEEDCOPY);
  CHECK(strstr(hook_message, "read-only") != NULL);
  CHECK(strstr(hook_message, "ipcref_view_make_mut") != NULL); /* a copy */
  CHECK(strstr(hook_message, "writable_shares") != NULL);      /* or open */
  if (hook_calls != 1 || !strstr(hook_message, "writable_shares"))
    printf("    hook (%d calls): %s\n", hook_calls, hook_message);
  /* A slice and an empty view of it: the same. */
  CHECK_EQ(ipcref_view_slice(v, 0, 100, 200, 3, &s), IPCREF_OK);
  CHECK_EQ(ipcref_view_to_dlpack(&s, &mt), IPCREF_ENEEDCOPY);
  ipcref_view_release(&s);
  CHECK_EQ(ipcref_view_slice(v, 0, 5, 5, 1, &s), IPCREF_OK);
  CHECK_EQ(ipcref_view_to_dlpack(&s, &mt), IPCREF_ENEEDCOPY);
  ipcref_view_release(&s);
  /* Marked for shared writes here: the mapping still decides. */
  ipcref_buf_set_shared_mut(v->buf, 1);
  CHECK_EQ(ipcref_view_to_dlpack(v, &mt), IPCREF_ENEEDCOPY);
  CHECK(mt == sentinel);
  CHECK_EQ(hook_calls, 4);
  versioned_read_only(v);
  ipcref_buf_set_shared_mut(v->buf, 0);
#ifdef IPCREF_HAVE_DLPACK_VERSIONED
  /* The versioned export goes out, flagged READ_ONLY, zero-copy. */
  {
    struct DLManagedTensorVersioned *vt = NULL;
    CHECK_EQ(ipcref_view_to_dlpack_versioned(v, &vt), IPCREF_OK);
    if (vt) {
      CHECK(vt->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
      CHECK(same_memory(&vt->dl_tensor, v));
      CHECK_EQ(ipcref_buf_strong_count(v->buf), strong + 1);
      vt->deleter(vt);
    }
  }
#endif
  CHECK_EQ(ipcref_buf_strong_count(v->buf), strong);
  CHECK_EQ(live_allocs, before);
  /* The first way out: a private copy, writable, and its writes stay
   * here. */
  CHECK_EQ(ipcref_view_clone(v, &c), IPCREF_OK);
  CHECK_EQ(ipcref_view_make_mut(&c), IPCREF_OK);
  CHECK(c.buf != v->buf);
  hook_calls = 0;
  mt = NULL;
  CHECK_EQ(ipcref_view_to_dlpack(&c, &mt), IPCREF_OK);
  CHECK_EQ(hook_calls, 0);
  if (mt) {
    unsigned char *d = (unsigned char *)mt->dl_tensor.data;
    size_t i;
    for (i = 0; i < SHARED_N; i++) {
      if (d[i] != produced(i)) break;
      d[i] = written(i);
    }
    CHECK_EQ(i, SHARED_N);
    mt->deleter(mt);
  }
  ipcref_view_release(&c);
}

/* The consumer of a writable mapping (the producer's writable_shares): the
 * legacy export goes ahead as for our own memory, and a write through the
 * tensor lands in the producer's memory. The versioned one says READ_ONLY
 * until this buffer is opened for shared writes here. */
static void consumer_writable(ipcref_view *v) {
  DLManagedTensor *mt = NULL;
  CHECK(ipcref_view_data_mut(v) != NULL); /* mapped writable, and unique */
  hook_calls = 0;
  CHECK_EQ(ipcref_view_to_dlpack(v, &mt), IPCREF_OK);
  CHECK_EQ(hook_calls, 0);
  if (mt) {
    unsigned char *d = (unsigned char *)mt->dl_tensor.data;
    size_t i;
    CHECK(same_memory(&mt->dl_tensor, v));
    for (i = 0; i < SHARED_N; i++) {
      if (d[i] != produced(i)) break;
      d[i] = written(i);
    }
    CHECK_EQ(i, SHARED_N);
    mt->deleter(mt);
  }
  versioned_read_only(v);
#ifdef IPCREF_HAVE_DLPACK_VERSIONED
  {
    struct DLManagedTensorVersioned *vt = NULL;
    ipcref_buf_set_shared_mut(v->buf, 1);
    CHECK_EQ(ipcref_view_to_dlpack_versioned(v, &vt), IPCREF_OK);
    if (vt) {
      CHECK_EQ(vt->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
      vt->deleter(vt);
    }
  }
#endif
}

/* The forked consumer: its own context, one view received, then the
 * checks; exits 0 when none failed and everything it made is freed. */
static void consumer_main(int sock, int writable) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v;
  long before = live_allocs;
  const ipcref_error_hook *old;
  alarm(60);
  old = ipcref_set_error_hook(&test_hook);
  memset(&v, 0, sizeof v);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  if (ctx) CHECK_EQ(ipcref_peer_new(ctx, sock, &p), IPCREF_OK);
  if (p) CHECK_EQ(ipcref_recv(p, &v, RECV_MS), IPCREF_OK);
  if (v.buf) {
    CHECK_EQ(v.ndim, 1);
    CHECK_EQ(v.shape[0], SHARED_N);
    if (writable)
      consumer_writable(&v);
    else
      consumer_read_only(&v);
    ipcref_view_release(&v);
  }
  if (p)
    ipcref_peer_free(p);
  else
    close(sock);
  ipcref_ctx_free(ctx);
  ipcref_set_error_hook(old);
  CHECK_EQ(live_allocs, before);
  fflush(stdout);
  _exit(harness_failures_in_test ? 1 : 0);
}

/* One producer and one consumer: the producer shares SHARED_N bytes and
 * waits for the consumer to finish; then its bytes are the consumer's
 * writes (writable_shares) or untouched (the default). */
static void received(int writable) {
  long before = live_allocs;
  ipcref_ctx_options opt;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v;
  DLManagedTensor *mt = NULL;
  const int64_t shape[1] = {SHARED_N};
  int sv[2], st;
  size_t i, same = 0, changed = 0;
  pid_t pid;
  unsigned char *d;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    CHECK(!"socketpair");
    return;
  }
  fflush(stdout);
  pid = fork(); /* before the producer's context: nothing of it inherited */
  if (pid == 0) {
    close(sv[0]);
    consumer_main(sv[1], writable);
  }
  close(sv[1]);
  CHECK(pid > 0);
  memset(&opt, 0, sizeof opt);
  opt.writable_shares = writable;
  memset(&v, 0, sizeof v);
  CHECK_EQ(ipcref_ctx_new(&opt, &ctx), IPCREF_OK);
  if (ctx) CHECK_EQ(ipcref_peer_new(ctx, sv[0], &p), IPCREF_OK);
  if (!p) close(sv[0]);
  if (ctx)
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, shape, &v), IPCREF_OK);
  d = v.buf ? (unsigned char *)ipcref_view_data_mut(&v) : NULL;
  CHECK(d != NULL);
  for (i = 0; d && i < SHARED_N; i++) d[i] = produced(i);
  /* Our own memory goes out legacy, as ever. */
  if (d) {
    CHECK_EQ(ipcref_view_to_dlpack(&v, &mt), IPCREF_OK);
    if (mt) mt->deleter(mt);
  }
  if (p && d) CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  st = reap_child(pid);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    harness_failures_in_test++;
    if (st != -1 && WIFSIGNALED(st))
      printf("    consumer killed by signal %d\n", WTERMSIG(st));
    else
      printf("    consumer exited with %d\n", st == -1 ? -1 : WEXITSTATUS(st));
  }
  for (i = 0; d && i < SHARED_N; i++) {
    same += d[i] == produced(i);
    changed += d[i] == written(i);
  }
  if (d) CHECK_EQ(writable ? changed : same, SHARED_N);
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  CHECK_EQ(live_allocs, before);
}

static void test_received_read_only(void) {
  received(0);
}

static void test_received_writable_shares(void) {
  received(1);
}
#endif /* IPCREF_HAVE_SHARING */

/* ---- versioned (DLPack 1.x headers) */

#ifdef IPCREF_HAVE_DLPACK_VERSIONED
typedef struct fake_v {
  struct DLManagedTensorVersioned mt;
  int64_t shape[4];
  void *mem;
} fake_v;

static void fake_v_deleter(struct DLManagedTensorVersioned *self) {
  fake_v *f = (fake_v *)self->manager_ctx;
  fake_deleted++;
  free(f->mem);
  free(f);
}

static fake_v *fake_v_new(uint64_t flags) {
  fake_v *f = (fake_v *)calloc(1, sizeof *f);
  f->mem = calloc(6, sizeof(float));
  f->shape[0] = 2;
  f->shape[1] = 3;
  f->mt.version.major = DLPACK_MAJOR_VERSION;
  f->mt.version.minor = DLPACK_MINOR_VERSION;
  f->mt.manager_ctx = f;
  f->mt.deleter = fake_v_deleter;
  f->mt.flags = flags;
  f->mt.dl_tensor.data = f->mem;
  f->mt.dl_tensor.device.device_type = kDLCPU;
  f->mt.dl_tensor.ndim = 2;
  f->mt.dl_tensor.dtype = dl_type(kDLFloat, 32);
  f->mt.dl_tensor.shape = f->shape;
  return f;
}

static void test_versioned_export(void) {
  long before = live_allocs;
  int64_t shape[2] = {3, 2};
  ipcref_view v, back;
  struct DLManagedTensorVersioned *mt = NULL;
  CHECK_EQ(ipcref_view_new(IPCREF_BOOL, 2, shape, &v), IPCREF_OK);
  fill_bytes(&v, 0);
  CHECK_EQ(ipcref_view_transpose(&v, 0, 1, &v), IPCREF_OK);
  CHECK_EQ(ipcref_view_to_dlpack_versioned(&v, &mt), IPCREF_OK);
  if (!mt) return;
  CHECK_EQ(mt->version.major, DLPACK_MAJOR_VERSION);
  CHECK_EQ(mt->version.minor, DLPACK_MINOR_VERSION);
  CHECK(mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY); /* shared with us */
  CHECK(dl_matches(&mt->dl_tensor, &v));
  CHECK_EQ(mt->dl_tensor.dtype.code, 6);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 2);
  /* Back in: read-only, so never writable here either. */
  CHECK_EQ(ipcref_view_from_dlpack_versioned(mt, &back), IPCREF_OK);
  CHECK(same_addresses(&back, &v));
  ipcref_view_release(&v);
  CHECK(ipcref_view_data_mut(&back) == NULL);
  ipcref_view_release(&back);
  CHECK_EQ(live_allocs, before);

  /* A buffer open for shared writes goes out writable. */
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 2, shape, &v), IPCREF_OK);
  ipcref_buf_set_shared_mut(v.buf, 1);
  CHECK_EQ(ipcref_view_to_dlpack_versioned(&v, &mt), IPCREF_OK);
  CHECK_EQ(mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
  mt->deleter(mt);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);
  CHECK_EQ(ipcref_view_to_dlpack_versioned(NULL, &mt), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_to_dlpack_versioned(&v, NULL), IPCREF_EINVAL);
  fail_alloc_in = 1;
  CHECK_EQ(ipcref_view_to_dlpack_versioned(&v, &mt), IPCREF_ENOMEM);
  CHECK_EQ(ipcref_buf_strong_count(v.buf), 1);
  ipcref_view_release(&v);
  CHECK_EQ(live_allocs, before);
}

static void test_versioned_import(void) {
  long before = live_allocs;
  fake_v *rw = fake_v_new(0);
  fake_v *ro = fake_v_new(DLPACK_FLAG_BITMASK_READ_ONLY);
  fake_v *v2 = fake_v_new(0);
  ipcref_view a, b, c, sentinel, out;
  float *p;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&rw->mt, &a), IPCREF_OK);
  CHECK_EQ(a.dtype, IPCREF_F32);
  CHECK_EQ(a.strides[0], 3);
  p = (float *)ipcref_view_data_mut(&a);
  CHECK(p == (float *)rw->mem);
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&ro->mt, &b), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&b) == NULL);
  CHECK(ipcref_buf_get_mut(b.buf) == NULL);
  CHECK_EQ(ipcref_view_copy(&b, &a), IPCREF_EBUSY);
  CHECK_EQ(ipcref_view_clone(&b, &c), IPCREF_OK);
  CHECK_EQ(ipcref_view_make_mut(&c), IPCREF_OK); /* copies */
  CHECK(ipcref_view_data_mut(&c) != NULL);
  CHECK(ipcref_view_data_mut(&c) != ro->mem);
  ipcref_view_release(&a);
  ipcref_view_release(&b);
  CHECK_EQ(fake_deleted, 2);
  ipcref_view_release(&c);

  /* A major version we do not know: nothing read, nothing taken. */
  memset(&sentinel, 0x33, sizeof sentinel);
  out = sentinel;
  v2->mt.version.major = DLPACK_MAJOR_VERSION + 1;
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&v2->mt, &out), IPCREF_EPROTO);
  CHECK(memcmp(&out, &sentinel, sizeof out) == 0);
  CHECK_EQ(fake_deleted, 2);
  v2->mt.version.major = DLPACK_MAJOR_VERSION;
  v2->mt.dl_tensor.device.device_type = kDLCUDAHost;
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&v2->mt, &out), IPCREF_ENODEV);
  v2->mt.dl_tensor.device.device_type = kDLCPU;
  CHECK_EQ(ipcref_view_from_dlpack_versioned(NULL, &out), IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&v2->mt, NULL), IPCREF_EINVAL);
  fail_alloc_in = 2;
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&v2->mt, &out), IPCREF_ENOMEM);
  CHECK_EQ(fake_deleted, 2);
  CHECK_EQ(live_allocs, before);
  v2->mt.deleter(&v2->mt); /* still the caller's to delete */
  CHECK_EQ(fake_deleted, 3);
  CHECK_EQ(live_allocs, before);
}

/* A tensor flagged READ_ONLY, through the public import: never writable
 * (see check_lent_read_only), and the deleter runs once. */
static void test_versioned_read_only(void) {
  long before = live_allocs;
  fake_v *ro = fake_v_new(DLPACK_FLAG_BITMASK_READ_ONLY);
  ipcref_view v;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&ro->mt, &v), IPCREF_OK);
  check_lent_read_only(&v, (const float *)ro->mem);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 1);
  CHECK_EQ(live_allocs, before);
}

/* A read-only import's weak references are the user's alone (read-only
 * is a flag, not a reference of ours): they work, and nothing leaks. */
static void test_versioned_read_only_weak(void) {
  long before = live_allocs;
  fake_v *ro = fake_v_new(DLPACK_FLAG_BITMASK_READ_ONLY);
  ipcref_view v;
  ipcref_weak *w;
  fake_deleted = 0;
  CHECK_EQ(ipcref_view_from_dlpack_versioned(&ro->mt, &v), IPCREF_OK);
  w = ipcref_buf_downgrade(v.buf);
  CHECK_EQ(ipcref_buf_weak_count(v.buf), 1);
  ipcref_view_release(&v);
  CHECK_EQ(fake_deleted, 1);
  CHECK(ipcref_weak_upgrade(w) == NULL);
  ipcref_weak_release(w);
  CHECK_EQ(live_allocs, before);
}
#endif

int main(void) {
  printf("DLPack header: %s\n",
#ifdef IPCREF_HAVE_DLPACK_VERSIONED
         "1.x (versioned)"
#else
         "0.x (legacy only)"
#endif
  );
  RUN(test_dtype_map);
  RUN(test_export_basic);
  RUN(test_export_every_dtype);
  RUN(test_export_strided);
  RUN(test_export_errors);
  RUN(test_import_lifetime);
  RUN(test_import_writes_in_place);
  RUN(test_import_negative_strides);
  RUN(test_import_byte_offset_and_broadcast);
  RUN(test_import_empty_and_scalar);
  RUN(test_import_errors);
  RUN(test_import_null_deleter);
  RUN(test_device_tensor);
  RUN(test_chain);
  RUN(test_import_read_only);
#ifdef IPCREF_HAVE_SHARING
  RUN(test_received_read_only);
  RUN(test_received_writable_shares);
#endif
#ifdef IPCREF_HAVE_DLPACK_VERSIONED
  RUN(test_versioned_export);
  RUN(test_versioned_import);
  RUN(test_versioned_read_only);
  RUN(test_versioned_read_only_weak);
#endif
  return harness_finish();
}
