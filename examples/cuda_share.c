/* cuda_share: a producer hands a device tensor to a consumer process
 * without a copy, and never waits for it.
 *
 * The producer fills a 1024 x 1024 float tensor on device 0 and sends a
 * view of it; the consumer's stream waits on the producer's event, then
 * the consumer reads the tensor through the driver, and its release is
 * returned once its stream's work has completed. The producer lets go of
 * its own reference right after sending: the block waits in the limbo
 * until the consumer is done.
 *
 * Build: cc -std=c11 -I. -I/usr/local/cuda/include examples/cuda_share.c \
 *           -o cuda_share -pthread -ldl      (no -lcuda: loaded at run time)
 * Run:   ./cuda_share            (IPCREF_CUDA_DRIVER names another driver)
 * Without a GPU it says why and exits 0. */
#define _GNU_SOURCE
#include <cuda.h> /* the driver's types: ipcref_cuda.h checks against them */

#define IPCREF_IMPLEMENTATION
#define IPCREF_CUDA_IMPLEMENTATION
#include "ipcref.h"
#include "ipcref_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define N (1024 * 1024)

/* Copies between host and device: the driver's own calls, found in the
 * library the backend loaded (the example links nothing either). */
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);

static void driver_symbol(const char *name, void *fn) {
  const char *path = getenv("IPCREF_CUDA_DRIVER");
  void *lib = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *sym = lib ? dlsym(lib, name) : NULL;
  memcpy(fn, &sym, sizeof sym); /* POSIX: an object pointer to a function */
}

/* The device address of a view's first element. */
static CUdeviceptr device_ptr(const ipcref_view *v) {
  return (CUdeviceptr)(uintptr_t)ipcref_buf_data(v->buf) +
         (CUdeviceptr)v->byte_offset;
}

static int consumer(int fd) {
  const char *driver = getenv("IPCREF_CUDA_DRIVER");
  ipcref_cuda *cu;
  ipcref_ctx *ctx;
  ipcref_peer *peer;
  ipcref_view v;
  dtoh_fn dtoh;
  float *host;
  int bad = 0, i;
  if (ipcref_cuda_open(driver, &cu) != IPCREF_OK) return 1;
  if (ipcref_ctx_new(NULL, &ctx) ||
      ipcref_ctx_add_backend(ctx, ipcref_cuda_backend(cu)) ||
      ipcref_peer_new(ctx, fd, &peer))
    return 1;
  /* The default stream (NULL) waits on the producer's event. */
  if (ipcref_recv_on(peer, &v, 10000, NULL) != IPCREF_OK) return 1;
  host = (float *)malloc(N * sizeof *host);
  driver_symbol("cuMemcpyDtoH_v2", &dtoh);
  if (!host || !dtoh ||
      dtoh(host, device_ptr(&v), N * sizeof *host) != CUDA_SUCCESS)
    return 1;
  for (i = 0; i < N; i++) bad += host[i] != (float)i;
  printf("consumer: read %d floats on device %d, %d wrong\n", N,
         ipcref_buf_device(v.buf).id, bad);
  free(host);
  ipcref_view_release(&v); /* returned once the stream's work is done */
  ipcref_peer_free(peer);
  ipcref_ctx_free(ctx); /* waits for that, if it has not happened yet */
  ipcref_cuda_close(cu);
  return bad != 0;
}

int main(void) {
  const char *driver = getenv("IPCREF_CUDA_DRIVER");
  int64_t shape[2] = {1024, 1024};
  ipcref_cuda *cu;
  ipcref_ctx *ctx;
  ipcref_peer *peer;
  ipcref_buf *buf;
  ipcref_view v;
  ipcref_stats st;
  htod_fn htod;
  float *host;
  int sv[2], status = 1, i;
  pid_t pid;
  /* Probe the driver before forking: no GPU, nothing to show. */
  if (ipcref_cuda_open(driver, &cu) != IPCREF_OK) {
    printf("cuda_share: no CUDA here: %s\n", ipcref_cuda_error());
    return 0;
  }
  ipcref_cuda_close(cu);
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return 1;
  pid = fork(); /* before the parent initializes the driver again */
  if (pid == 0) {
    close(sv[0]);
    status = consumer(sv[1]);
    fflush(stdout);
    _exit(status);
  }
  close(sv[1]);
  if (ipcref_cuda_open(driver, &cu) || ipcref_ctx_new(NULL, &ctx) ||
      ipcref_ctx_add_backend(ctx, ipcref_cuda_backend(cu)) ||
      ipcref_peer_new(ctx, sv[0], &peer) ||
      ipcref_cuda_alloc(ctx, 0, N * sizeof(float), &buf) ||
      ipcref_view_of(buf, IPCREF_F32, 2, shape, &v))
    return 1;
  ipcref_buf_release(buf); /* the view holds it */
  host = (float *)malloc(N * sizeof *host);
  driver_symbol("cuMemcpyHtoD_v2", &htod);
  if (!host || !htod) return 1;
  for (i = 0; i < N; i++) host[i] = (float)i;
  if (htod(device_ptr(&v), host, N * sizeof *host) != CUDA_SUCCESS) return 1;
  free(host);
  if (ipcref_send_on(peer, &v, NULL) != IPCREF_OK) return 1; /* 4 MiB */
  ipcref_view_release(&v); /* to the limbo while the consumer holds it */
  waitpid(pid, &status, 0);
  ipcref_collect(ctx);
  ipcref_ctx_stats(ctx, &st);
  printf("producer: sent 4 MiB of device memory, %zu leases out, %zu blocks "
         "in the limbo\n",
         st.live_slots, st.limbo_blocks);
  ipcref_peer_free(peer);
  ipcref_ctx_free(ctx);
  ipcref_cuda_close(cu);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
