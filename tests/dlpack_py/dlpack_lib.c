/* A small shared library over ipcref.h for tests/dlpack_py/test_dlpack.py:
 * plain C functions that ctypes can call to make views, derive strided ones,
 * hand them out as DLPack tensors and take other frameworks' tensors in,
 * and share views between two processes (a producer and a consumer over a
 * socket). Views live on the heap here so that Python can hold them by
 * pointer. The library's error hook is ours: dl_last_error tells what it
 * heard last (why an export was refused).
 *
 *   gcc -shared -fPIC -I. tests/dlpack_py/dlpack_lib.c -o libdlpack_test.so
 */
#define _GNU_SOURCE /* the sharing layer needs GNU declarations */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

#define IPCREF_IMPLEMENTATION
#include "../../ipcref.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- the element pattern (test_dlpack.py computes the same) */

/* IEEE half bits of a float that is exactly representable as a normal
 * half (or zero): the pattern's values all are. */
static uint16_t half_bits(float f) {
  uint32_t u, sign, mant;
  int32_t exp;
  memcpy(&u, &f, sizeof u);
  sign = (u >> 16) & 0x8000u;
  if ((u & 0x7fffffffu) == 0) return (uint16_t)sign;
  exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  mant = (u >> 13) & 0x3ffu;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | mant);
}

static uint16_t bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

/* Element k of the pattern, written at p. */
static void pattern(ipcref_dtype dt, int64_t k, void *p) {
  float f = (float)((k % 64) - 32) * 0.25f;
  double re = (double)k * 0.5, im = -(double)(k % 7);
  switch (dt) {
  case IPCREF_BOOL: *(uint8_t *)p = (uint8_t)(k % 3 == 0); break;
  case IPCREF_I8: *(int8_t *)p = (int8_t)(k % 100 - 50); break;
  case IPCREF_I16: *(int16_t *)p = (int16_t)(k % 100 - 50); break;
  case IPCREF_I32: *(int32_t *)p = (int32_t)(k % 100 - 50); break;
  case IPCREF_I64: *(int64_t *)p = (int64_t)(k % 100 - 50); break;
  case IPCREF_U8: *(uint8_t *)p = (uint8_t)(k % 200); break;
  case IPCREF_U16: *(uint16_t *)p = (uint16_t)(k % 200); break;
  case IPCREF_U32: *(uint32_t *)p = (uint32_t)(k % 200); break;
  case IPCREF_U64: *(uint64_t *)p = (uint64_t)(k % 200); break;
  case IPCREF_F16: *(uint16_t *)p = half_bits(f); break;
  case IPCREF_BF16: *(uint16_t *)p = bf16_bits(f); break;
  case IPCREF_F32: *(float *)p = f; break;
  case IPCREF_F64: *(double *)p = (double)f; break;
  case IPCREF_C64:
    ((float *)p)[0] = (float)re;
    ((float *)p)[1] = (float)im;
    break;
  case IPCREF_C128:
    ((double *)p)[0] = re;
    ((double *)p)[1] = im;
    break;
  default: break;
  }
}

static ipcref_view *heap_view(const ipcref_view *v) {
  ipcref_view *h = (ipcref_view *)malloc(sizeof *h);
  if (h) *h = *v;
  return h;
}

/* A new C-contiguous view filled with the pattern, or NULL. */
EXPORT ipcref_view *dl_view_new(int dtype, int ndim, const int64_t *shape) {
  ipcref_view v, *h;
  ipcref_view_iter it;
  char *p;
  int64_t k = 0;
  if (ipcref_view_new((ipcref_dtype)dtype, ndim, shape, &v) != IPCREF_OK)
    return NULL;
  ipcref_view_iter_init(&v, &it);
  while ((p = (char *)ipcref_view_iter_next(&it)) != NULL)
    pattern(v.dtype, k++, p);
  h = heap_view(&v);
  if (!h) ipcref_view_release(&v);
  return h;
}

static ipcref_view *derived(ipcref_result r, ipcref_view *v) {
  ipcref_view *h;
  if (r != IPCREF_OK) return NULL;
  h = heap_view(v);
  if (!h) ipcref_view_release(v);
  return h;
}

EXPORT ipcref_view *dl_view_transpose(const ipcref_view *v, int d0, int d1) {
  ipcref_view r;
  return derived(ipcref_view_transpose(v, d0, d1, &r), &r);
}

EXPORT ipcref_view *dl_view_slice(const ipcref_view *v, int dim, int64_t start,
                                  int64_t stop, int64_t step) {
  ipcref_view r;
  return derived(ipcref_view_slice(v, dim, start, stop, step, &r), &r);
}

EXPORT ipcref_view *dl_view_flip(const ipcref_view *v, int dim) {
  ipcref_view r;
  return derived(ipcref_view_flip(v, dim, &r), &r);
}

EXPORT ipcref_view *dl_view_select(const ipcref_view *v, int dim,
                                   int64_t index) {
  ipcref_view r;
  return derived(ipcref_view_select(v, dim, index, &r), &r);
}

EXPORT void dl_view_free(ipcref_view *v) {
  if (!v) return;
  ipcref_view_release(v);
  free(v);
}

EXPORT long dl_strong_count(const ipcref_view *v) {
  return (long)ipcref_buf_strong_count(v->buf);
}

/* dtype, ndim, shape[ndim], strides[ndim] (elements). */
EXPORT int dl_view_info(const ipcref_view *v, int *dtype, int *ndim,
                        int64_t *shape, int64_t *strides) {
  int d;
  *dtype = (int)v->dtype;
  *ndim = v->ndim;
  for (d = 0; d < v->ndim; d++) {
    shape[d] = v->shape[d];
    strides[d] = v->strides[d];
  }
  return 0;
}

/* The address of element (0,...,0), or 0 for an empty view. */
EXPORT uintptr_t dl_view_addr(const ipcref_view *v) {
  int64_t zero[IPCREF_MAX_DIMS] = {0};
  return (uintptr_t)ipcref_view_ptr(v, zero);
}

/* Copies the elements in C order into dst (cap bytes); returns the number
 * of bytes, or -1. */
EXPORT int64_t dl_view_read(const ipcref_view *v, void *dst, int64_t cap) {
  ipcref_view_iter it;
  size_t item = ipcref_dtype_size(v->dtype);
  int64_t n = 0;
  char *p;
  if (ipcref_view_numel(v) * (int64_t)item > cap) return -1;
  if (ipcref_view_iter_init(v, &it) != IPCREF_OK) return -1;
  while ((p = (char *)ipcref_view_iter_next(&it)) != NULL) {
    memcpy((char *)dst + n, p, item);
    n += (int64_t)item;
  }
  return n;
}

EXPORT int dl_view_writable(const ipcref_view *v) {
  return ipcref_view_data_mut(v) != NULL;
}

/* ---- the error hook */

static char last_error[1024];

static void hook_fn(void *user, ipcref_result code, const char *message) {
  (void)user;
  snprintf(last_error, sizeof last_error, "%s (%s)", message ? message : "",
           ipcref_strerror(code));
}

static const ipcref_error_hook hook = {hook_fn, NULL};

/* Installs the hook (once the library is loaded; idempotent). */
EXPORT void dl_install_hook(void) {
  ipcref_set_error_hook(&hook);
}

/* What the hook heard last ("" if nothing), and forgets it. */
EXPORT const char *dl_last_error(void) {
  static char copy[sizeof last_error];
  memcpy(copy, last_error, sizeof copy);
  last_error[0] = 0;
  return copy;
}

/* ---- DLPack */

/* A DLManagedTensor* for v (its own reference), or NULL with *err set. */
EXPORT DLManagedTensor *dl_to_dlpack_err(const ipcref_view *v, int *err) {
  DLManagedTensor *mt = NULL;
  *err = ipcref_view_to_dlpack(v, &mt);
  return *err == IPCREF_OK ? mt : NULL;
}

/* A DLManagedTensor* for v (its own reference), or NULL. */
EXPORT DLManagedTensor *dl_to_dlpack(const ipcref_view *v) {
  int err;
  return dl_to_dlpack_err(v, &err);
}

EXPORT void dl_call_deleter(DLManagedTensor *mt) {
  if (mt && mt->deleter) mt->deleter(mt);
}

/* The destructor of the "dltensor" capsules the test makes: a capsule that
 * was not consumed (not renamed "used_dltensor") still owns its tensor.
 * In C rather than a ctypes callback, because consumers free a refused
 * capsule while their exception is set, and a Python callback would clobber
 * it. The two capsule functions come from the Python process that loaded
 * this library (weak, so the library also loads elsewhere). */
extern int PyCapsule_IsValid(void *capsule, const char *name)
    __attribute__((weak));
extern void *PyCapsule_GetPointer(void *capsule, const char *name)
    __attribute__((weak));

EXPORT void dl_capsule_destructor(void *capsule) {
  if (!PyCapsule_IsValid || !PyCapsule_GetPointer) abort();
  if (PyCapsule_IsValid(capsule, "dltensor"))
    dl_call_deleter(
        (DLManagedTensor *)PyCapsule_GetPointer(capsule, "dltensor"));
}

/* Imports count the producer's deleter calls: the managed tensor's deleter
 * is replaced by one that counts and then calls the original. */
#define MAX_WATCHED 256
static struct {
  DLManagedTensor *mt;
  void (*deleter)(DLManagedTensor *);
} watched[MAX_WATCHED];
static long deleter_calls;

static void counting_deleter(DLManagedTensor *mt) {
  int i;
  deleter_calls++;
  for (i = 0; i < MAX_WATCHED; i++) {
    if (watched[i].mt == mt) {
      void (*d)(DLManagedTensor *) = watched[i].deleter;
      watched[i].mt = NULL;
      if (d) d(mt);
      return;
    }
  }
  abort(); /* a deleter called twice, or on a tensor never seen */
}

EXPORT long dl_deleter_calls(void) {
  return deleter_calls;
}

/* Takes `mt` in: a view, or NULL with *err set (then the caller still owns
 * mt, whose deleter is still counted). */
EXPORT ipcref_view *dl_from_dlpack(DLManagedTensor *mt, int *err) {
  ipcref_view v, *h;
  int i;
  *err = 0;
  if (mt) {
    for (i = 0; i < MAX_WATCHED && watched[i].mt; i++) {
    }
    if (i == MAX_WATCHED) {
      *err = -100;
      return NULL;
    }
    watched[i].mt = mt;
    watched[i].deleter = mt->deleter;
    mt->deleter = counting_deleter;
  }
  *err = ipcref_view_from_dlpack(mt, &v);
  if (*err != IPCREF_OK) return NULL;
  h = heap_view(&v);
  if (!h) {
    ipcref_view_release(&v);
    *err = IPCREF_ENOMEM;
  }
  return h;
}

EXPORT const char *dl_strerror(int r) {
  return ipcref_strerror((ipcref_result)r);
}

/* ---- sharing between processes */

/* A context; writable_shares: consumers map our segments writable. */
EXPORT ipcref_ctx *dl_ctx_new(int writable_shares, int *err) {
  ipcref_ctx_options opt;
  ipcref_ctx *ctx = NULL;
  memset(&opt, 0, sizeof opt);
  opt.writable_shares = writable_shares;
  *err = ipcref_ctx_new(&opt, &ctx);
  return ctx;
}

EXPORT void dl_ctx_free(ipcref_ctx *ctx) {
  ipcref_ctx_free(ctx);
}

/* A peer over `fd` (adopted on success only). */
EXPORT ipcref_peer *dl_peer_new(ipcref_ctx *ctx, int fd, int *err) {
  ipcref_peer *p = NULL;
  *err = ipcref_peer_new(ctx, fd, &p);
  return p;
}

EXPORT void dl_peer_free(ipcref_peer *p) {
  ipcref_peer_free(p);
}

/* A new C-contiguous shared view filled with the pattern, or NULL. */
EXPORT ipcref_view *dl_shared_view_new(ipcref_ctx *ctx, int dtype, int ndim,
                                       const int64_t *shape, int *err) {
  ipcref_view v, *h;
  ipcref_view_iter it;
  char *p;
  int64_t k = 0;
  *err = ipcref_view_new_shared(ctx, (ipcref_dtype)dtype, ndim, shape, &v);
  if (*err != IPCREF_OK) return NULL;
  if (!ipcref_view_data_mut(&v)) { /* ours and unique: must be writable */
    ipcref_view_release(&v);
    *err = IPCREF_EBUSY;
    return NULL;
  }
  ipcref_view_iter_init(&v, &it);
  while ((p = (char *)ipcref_view_iter_next(&it)) != NULL)
    pattern(v.dtype, k++, p);
  h = heap_view(&v);
  if (!h) {
    ipcref_view_release(&v);
    *err = IPCREF_ENOMEM;
  }
  return h;
}

EXPORT int dl_send(ipcref_peer *p, const ipcref_view *v) {
  return ipcref_send(p, v);
}

/* The next view from the peer, or NULL with *err set. */
EXPORT ipcref_view *dl_recv(ipcref_peer *p, int timeout_ms, int *err) {
  ipcref_view v;
  return derived((ipcref_result)(*err = ipcref_recv(p, &v, timeout_ms)), &v);
}

/* A private, writable copy of v's elements (ipcref_view_make_mut on a
 * clone), or NULL with *err set. */
EXPORT ipcref_view *dl_view_private_copy(const ipcref_view *v, int *err) {
  ipcref_view c;
  *err = ipcref_view_clone(v, &c);
  if (*err != IPCREF_OK) return NULL;
  *err = ipcref_view_make_mut(&c);
  if (*err != IPCREF_OK) {
    ipcref_view_release(&c);
    return NULL;
  }
  return derived(IPCREF_OK, &c);
}

EXPORT int dl_view_same_buffer(const ipcref_view *a, const ipcref_view *b) {
  return a->buf == b->buf;
}
