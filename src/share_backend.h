/* share_backend: the device backend's interface, struct ipcref_backend
 * (its typedef, IPCREF_HANDLE_BYTES and IPCREF_CHUNKS_MAX are share's):
 * what the sharing layer calls on a backend, and what each call owes it.
 * No implementation: the backend headers fill one in. */

#if !defined(IPCREF_NO_SHARING)

#ifdef __cplusplus
extern "C" {
#endif

struct ipcref_backend {
  int32_t device_type; /* IPCREF_DEVICE_CUDA, IPCREF_DEVICE_ROCM */
  const char *name;
  void *user;
  /* A device allocation of `size` bytes (a segment) and its free. */
  ipcref_result (*seg_alloc)(ipcref_backend *be, int32_t dev, size_t size,
                             uint64_t *addr);
  void (*seg_free)(ipcref_backend *be, int32_t dev, uint64_t addr);
  /* The allocation that contains `addr`: its base and size. */
  ipcref_result (*seg_range)(ipcref_backend *be, int32_t dev, uint64_t addr,
                             uint64_t *base, size_t *size);
  /* The IPC handle of the allocation at `base` (called once per segment).
   * Memory the driver cannot export this way is refused (EINVAL). */
  ipcref_result (*seg_export)(ipcref_backend *be, int32_t dev, uint64_t base,
                              unsigned char *handle);
  /* Opens a segment another process exported (once per segment and
   * process: the caller caches it); a handle this process exported gives
   * back its own address. seg_close undoes it. */
  ipcref_result (*seg_import)(ipcref_backend *be, int32_t dev,
                              const unsigned char *handle, uint64_t *addr);
  void (*seg_close)(ipcref_backend *be, int32_t dev, uint64_t addr);
  /* Ordering. event_record: an event after the work queued on `stream`
   * so far, that another process can wait on; its handle goes with the
   * message, and *event is kept until the lease ends (event_free). A
   * backend without interprocess events synchronizes the stream instead
   * and gives an all-zero handle. event_wait: `stream` waits for the event
   * of `handle` (all zero: nothing to wait for). */
  ipcref_result (*event_record)(ipcref_backend *be, int32_t dev, void *stream,
                                unsigned char *handle, void **event);
  void (*event_free)(ipcref_backend *be, void *event);
  ipcref_result (*event_wait)(ipcref_backend *be, int32_t dev, void *stream,
                              const unsigned char *handle);
  /* Deferred release: *fence marks the work queued on `stream` so far
   * (NULL: nothing pending); fence_done is 1 once it completed, and frees
   * the fence then. */
  ipcref_result (*fence)(ipcref_backend *be, int32_t dev, void *stream,
                         void **fence);
  int (*fence_done)(ipcref_backend *be, void *fence);
  /* Segments shared by fd, for memory a handle cannot carry (CUDA's
   * virtual memory management, stream-ordered pools); both NULL where
   * the backend has none. seg_export_fd: a shareable fd for the
   * allocation at `base` (made once per segment; the caller owns it and
   * sends it over SCM_RIGHTS) and `data` (IPCREF_HANDLE_BYTES) to go
   * with it, or ENOTSUP when that allocation is shared by handle
   * (seg_export). Either the fd is the allocation's (data all zero,
   * *pooled 0), or it is a pool's and `data` names the allocation in it
   * (*pooled 1): then the segment goes with every hand-off, and each
   * process lets go of its mapping (seg_close) as soon as its last buffer
   * in it goes, before that buffer's lease returns, since pool memory must
   * be freed in every importer before its exporter frees it.
   * seg_import_fd: maps `size` bytes of what `fd` and `data` share (the
   * fd stays the caller's), readable, and writable when `writable`; what
   * is no such allocation, or is smaller than `size`, is refused
   * (EPROTO). seg_close undoes it. */
  ipcref_result (*seg_export_fd)(ipcref_backend *be, int32_t dev, uint64_t base,
                                 int *fd, unsigned char *data, int *pooled);
  ipcref_result (*seg_import_fd)(ipcref_backend *be, int32_t dev, int fd,
                                 const unsigned char *data, int pooled,
                                 uint64_t size, int writable, uint64_t *addr);
  /* VMM memory mapped from several allocations (chunks) one after the
   * other in one range, as PyTorch's expandable segments map it: a
   * wrapped buffer across chunks (IPCREF_CHUNKS_MAX at most) is one
   * segment of them all; both NULL where the backend has none.
   * seg_export_chunks: an fd for each of the `n` chunks of sizes[i]
   * bytes one after the other from `base` (the caller owns them).
   * seg_import_chunks: maps the `n` chunks the fds share, one after the
   * other in one range of its own, readable, and writable when asked;
   * refused (EPROTO) as seg_import_fd refuses. seg_close undoes it. */
  ipcref_result (*seg_export_chunks)(ipcref_backend *be, int32_t dev,
                                     uint64_t base, const uint64_t *sizes,
                                     int n, int *fds);
  ipcref_result (*seg_import_chunks)(ipcref_backend *be, int32_t dev,
                                     const int *fds, const uint64_t *sizes,
                                     int n, int writable, uint64_t *addr);
  /* A wrapped allocation's segment, exported by handle (seg_export), goes
   * without seg_free (its memory stays its owner's): whatever the backend
   * noted of it goes too, once no other segment was exported with it.
   * May be NULL: nothing noted. */
  void (*seg_forget)(ipcref_backend *be, int32_t dev, uint64_t base);
};

#ifdef __cplusplus
}
#endif

#endif /* !IPCREF_NO_SHARING */

/* @implementation */
