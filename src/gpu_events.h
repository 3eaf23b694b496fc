/* gpu_events: ordering device work across processes, the logic both
 * backends share (tools/amalgamate.py writes it into src/gpu.h at its
 * "@events" line, with the same renaming). A send records an interprocess
 * event on the producer's stream, pooled per device and never destroyed
 * before ipcref_gpu_close; the consumer opens its handle and makes its
 * stream wait on it (a driver without interprocess events synchronizes
 * the stream instead, and sends no handle). A fence is a plain event after
 * the work queued on a stream, which a deferred release polls. The pool
 * of free events is guarded by the backend's lock (g->lock). */

IPCREF__PRIVATE ipcref_result ipcref__gpu_event_record(ipcref_backend *be,
                                                       int32_t dev,
                                                       void *stream,
                                                       unsigned char *handle,
                                                       void **event) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_ipc_event *e, **pp;
  ipcref_result r = ipcref__gpu_on(g, dev);
  int code;
  *event = NULL;
  if (r != IPCREF_OK) return r;
  if (!IPCREF__GPU_IPC_EVENTS) { /* no interprocess events: wait here */
    code = ipcref__gpu_d_stream_sync(&g->drv, stream);
    memset(handle, 0, IPCREF_HANDLE_BYTES);
    return code ? ipcref__gpu_fail(ipcref__gpu_code(code),
                                   "synchronizing the stream", g, code)
                : IPCREF_OK;
  }
  pthread_mutex_lock(&g->lock); /* a free event of this device */
  for (pp = &g->free_events; *pp && (*pp)->dev != dev; pp = &(*pp)->next) {
  }
  e = *pp;
  if (e) *pp = e->next;
  pthread_mutex_unlock(&g->lock);
  if (!e) { /* the pool grows: no limit on events outstanding */
    e = (ipcref__gpu_ipc_event *)IPCREF_MALLOC(sizeof *e);
    if (!e) return IPCREF_ENOMEM;
    code = ipcref__gpu_d_event_new(&g->drv, 1, &e->ev);
    if (!code) {
      code = ipcref__gpu_d_event_handle(&g->drv, e->ev, e->handle);
      if (code) (void)ipcref__gpu_d_event_destroy(&g->drv, e->ev);
    }
    if (code) {
      IPCREF_FREE(e);
      return ipcref__gpu_fail(ipcref__gpu_code(code),
                              "making an interprocess event", g, code);
    }
    e->dev = dev;
  }
  code = ipcref__gpu_d_event_record(&g->drv, e->ev, stream);
  if (code) {
    ipcref__gpu_event_free(be, e);
    return ipcref__gpu_fail(ipcref__gpu_code(code), "recording the event", g,
                            code);
  }
  memcpy(handle, e->handle, IPCREF_HANDLE_BYTES);
  *event = e;
  return IPCREF_OK;
}

/* Back to the pool, never destroyed before ipcref_gpu_close: a consumer
 * that opens the handle late finds the event recorded again later, which
 * only makes it wait longer. */
IPCREF__PRIVATE void ipcref__gpu_event_free(ipcref_backend *be, void *event) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_ipc_event *e = (ipcref__gpu_ipc_event *)event;
  pthread_mutex_lock(&g->lock);
  e->next = g->free_events;
  g->free_events = e;
  pthread_mutex_unlock(&g->lock);
}

IPCREF__PRIVATE ipcref_result
ipcref__gpu_event_wait(ipcref_backend *be, int32_t dev, void *stream,
                       const unsigned char *handle) {
  static const unsigned char zero[IPCREF_HANDLE_BYTES] = {0};
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  void *ev = NULL;
  ipcref_result r;
  int code;
  if (memcmp(handle, zero, IPCREF_HANDLE_BYTES) == 0) return IPCREF_OK;
  r = ipcref__gpu_on(g, dev);
  if (r != IPCREF_OK) return r;
  code = ipcref__gpu_d_event_open(&g->drv, handle, &ev);
  if (code == IPCREF__GPU_INVALID_CONTEXT) { /* one of our own events */
    ipcref__gpu_ipc_event *e;
    pthread_mutex_lock(&g->lock);
    for (e = g->free_events;
         e && memcmp(e->handle, handle, IPCREF_HANDLE_BYTES) != 0;
         e = e->next) {
    }
    pthread_mutex_unlock(&g->lock);
    /* One in use is not on the free list: it was recorded in this process
     * on the producer's stream, and the caller orders its own streams. */
    if (!e) return IPCREF_OK;
    code = ipcref__gpu_d_stream_wait(&g->drv, stream, e->ev);
    return code ? ipcref__gpu_fail(IPCREF_EPROTO, "waiting on the event", g,
                                   code)
                : IPCREF_OK;
  }
  if (code)
    return ipcref__gpu_fail(IPCREF_EPROTO, "opening the event", g, code);
  code = ipcref__gpu_d_stream_wait(&g->drv, stream, ev);
  (void)ipcref__gpu_d_event_destroy(&g->drv, ev); /* the wait is queued */
  return code ? ipcref__gpu_fail(ipcref__gpu_code(code), "waiting on the event",
                                 g, code)
              : IPCREF_OK;
}

/* A fence: a plain event after the work queued on `stream`; NULL when
 * that work has completed already. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_fence(ipcref_backend *be, int32_t dev,
                                                void *stream, void **fence) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  void *ev = NULL;
  ipcref_result r = ipcref__gpu_on(g, dev);
  int code;
  *fence = NULL;
  if (r != IPCREF_OK) return r;
  code = ipcref__gpu_d_event_new(&g->drv, 0, &ev);
  if (code)
    return ipcref__gpu_fail(ipcref__gpu_code(code), "making an event", g, code);
  code = ipcref__gpu_d_event_record(&g->drv, ev, stream);
  if (code || ipcref__gpu_d_event_query(&g->drv, ev) == 0) {
    (void)ipcref__gpu_d_event_destroy(&g->drv, ev);
    return code ? ipcref__gpu_fail(ipcref__gpu_code(code),
                                   "recording the event", g, code)
                : IPCREF_OK;
  }
  *fence = ev;
  return IPCREF_OK;
}

IPCREF__PRIVATE int ipcref__gpu_fence_done(ipcref_backend *be, void *fence) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  if (ipcref__gpu_d_event_query(&g->drv, fence) == IPCREF__GPU_NOT_READY)
    return 0;
  /* Done, or an error: either way nothing more to wait for. */
  (void)ipcref__gpu_d_event_destroy(&g->drv, fence);
  return 1;
}
