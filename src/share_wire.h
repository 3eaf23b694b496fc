/* share_wire: the record a message carries, versioned and little endian:
 * its header, one record per segment or ledger the peer lacks, the ids of
 * retired segments, one record per view. Encoding and decoding only: no
 * state, no lock, no system call. */

#ifdef IPCREF__SHARING_IMPL

/* ---- the wire format ----------------------------------------------------
 * Little endian, field by field (no struct copies, no padding):
 *
 *   u32 magic "IPCM"  u16 version  u16 nviews  u16 nrecs  u16 nretired
 *   u32 sender pid    u64 sender nonce  u16 meta length
 *   nrecs x     { u8 kind (1 segment, 2 ledger, 3 device segment by
 *                 handle, 4 device segment by fd, 5 device pool memory,
 *                 6 device segment in chunks)
 *                 u8 writable  u32 origin pid  u64 origin nonce  u64 id
 *                 u64 size
 *                 kinds 3 to 6: u32 device type  u32 device id
 *                 kinds 3, 5: 64 B handle (5: the allocation in its pool)
 *                 kind 6: u32 n (2..IPCREF_CHUNKS_MAX)  n x u64 size }
 *               (kinds 1, 4 and 5 come with one fd (5: its pool's), kind
 *               2 with two: the ledger and its bell, kind 6 with n: one
 *               per chunk; in this order)
 *   nretired x  { u64 id }          (sender's segments it has destroyed)
 *   nviews x    { u32 origin pid  u64 origin nonce  u64 segment id
 *                 u64 segment size  u64 block offset  u64 block size
 *                 u64 ledger id  u32 slot  u32 generation
 *                 u8 dtype  u8 ndim  u8 writable  u8 flags  i64 byte offset
 *                 ndim x i64 shape  ndim x i64 strides
 *                 flags bit 0: 64 B event handle }
 *   meta length x u8   (the user's metadata, at most IPCREF_META_MAX)
 *
 * Caches key on (origin nonce, id), never on bytes of a handle. */
#define IPCREF__MSG_MAGIC   0x4d435049u /* "IPCM" */
#define IPCREF__MSG_VERSION 2u
#define IPCREF__MSG_RETIRED 64 /* announced per message at most */

typedef struct ipcref__wire {
  unsigned char *p;
  size_t len, pos;
  int bad; /* overflowed or short */
} ipcref__wire;

/* A cursor over `len` bytes at `p`; the puts and gets of `bytes` bytes
 * (little endian) set `bad` instead of overrunning. */
IPCREF__PRIVATE void ipcref__wire_init(ipcref__wire *w, unsigned char *p,
                                       size_t len) {
  w->p = p;
  w->len = len;
  w->pos = 0;
  w->bad = 0;
}

/* On a little-endian machine a field's bytes are its memory as it is: one
 * memcpy of a constant size, which the compiler makes a single move (the
 * byte loop cost a fifth of a hand-off's CPU). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define IPCREF__WIRE_LE 1
#else
#define IPCREF__WIRE_LE 0
#endif

/* The next `n` bytes of the cursor, taken whole: NULL (and `bad` set)
 * when fewer are left, or the cursor was moved past its end. A record's
 * fixed part is checked once so, not field by field: decoding a hand-off's
 * header and view took 430 instructions field by field, 175 so
 * (callgrind, bench/maps.c). */
IPCREF__PRIVATE IPCREF__INLINE unsigned char *ipcref__wire_take(ipcref__wire *w,
                                                                size_t n) {
  unsigned char *q;
  if (w->bad || w->pos > w->len || n > w->len - w->pos) {
    w->bad = 1;
    return NULL;
  }
  q = w->p + w->pos;
  w->pos += n;
  return q;
}

/* A field of `bytes` bytes, little endian, at `q` (taken already). */
IPCREF__PRIVATE IPCREF__INLINE uint64_t ipcref__le_get(const unsigned char *q,
                                                       int bytes) {
  uint64_t v = 0;
  int i;
  if (IPCREF__WIRE_LE) {
    memcpy(&v, q, (size_t)bytes);
    return v;
  }
  for (i = 0; i < bytes; i++) v |= (uint64_t)q[i] << (8 * i);
  return v;
}

IPCREF__PRIVATE IPCREF__INLINE void ipcref__le_put(unsigned char *q, uint64_t v,
                                                   int bytes) {
  int i;
  if (IPCREF__WIRE_LE) {
    memcpy(q, &v, (size_t)bytes);
    return;
  }
  for (i = 0; i < bytes; i++) q[i] = (unsigned char)(v >> (8 * i));
}

/* One field of `bytes` bytes: written, or read (0 once the cursor is
 * bad). */
IPCREF__PRIVATE IPCREF__INLINE void ipcref__wire_put(ipcref__wire *w,
                                                     uint64_t v, int bytes) {
  unsigned char *q = ipcref__wire_take(w, (size_t)bytes);
  if (q) ipcref__le_put(q, v, bytes);
}

IPCREF__PRIVATE IPCREF__INLINE uint64_t ipcref__wire_get(ipcref__wire *w,
                                                         int bytes) {
  const unsigned char *q = ipcref__wire_take(w, (size_t)bytes);
  return q ? ipcref__le_get(q, bytes) : 0;
}

typedef struct ipcref__view_rec {
  uint32_t origin_pid;
  uint64_t origin_nonce, seg_id, seg_size, block_offset, block_size;
  uint64_t ledger_id;
  uint32_t slot, gen;
  ipcref_view view; /* buf NULL; the geometry relative to the block */
  int writable;
  int has_event; /* device views: the producer's event follows */
  unsigned char event[IPCREF_HANDLE_BYTES];
} ipcref__view_rec;

/* What a message carries for a segment or a ledger: kind 1 (a memfd
 * segment) and 2 (a ledger) come with an fd, in order; kind 3 (a device
 * segment) with its device and IPC handle instead; kind 4 (a device
 * segment shared by fd) with its device and an fd; kind 5 (stream-ordered
 * pool memory) with its device, its pool's fd and the allocation's data
 * (in `handle`); kind 6 (VMM chunks) with its device, the chunks' sizes
 * (adding up to `size`) and an fd each. */
typedef struct ipcref__fd_rec {
  int kind, writable;
  uint32_t origin_pid;
  uint64_t origin_nonce, id, size;
  int32_t dev_type, dev_id; /* kinds 3 to 6 */
  unsigned char handle[IPCREF_HANDLE_BYTES];
  int nchunks; /* kind 6 */
  uint64_t chunk[IPCREF_CHUNKS_MAX];
} ipcref__fd_rec;

/* Writes / reads `n` bytes as they are (read: 0s once the cursor is
 * bad). */
IPCREF__PRIVATE void ipcref__put_bytes(ipcref__wire *w, const unsigned char *b,
                                       size_t n) {
  unsigned char *q = ipcref__wire_take(w, n);
  if (q) memcpy(q, b, n);
}

IPCREF__PRIVATE void ipcref__get_bytes(ipcref__wire *w, unsigned char *b,
                                       size_t n) {
  const unsigned char *q = ipcref__wire_take(w, n);
  if (q)
    memcpy(b, q, n);
  else
    memset(b, 0, n);
}

/* Writes / reads a segment or ledger record (0 when malformed). */
IPCREF__PRIVATE void ipcref__put_fd_rec(ipcref__wire *w,
                                        const ipcref__fd_rec *f) {
  ipcref__wire_put(w, (uint64_t)f->kind, 1);
  ipcref__wire_put(w, (uint64_t)f->writable, 1);
  ipcref__wire_put(w, f->origin_pid, 4);
  ipcref__wire_put(w, f->origin_nonce, 8);
  ipcref__wire_put(w, f->id, 8);
  ipcref__wire_put(w, f->size, 8);
  if (f->kind < IPCREF__KIND_DEVICE) return;
  ipcref__wire_put(w, (uint64_t)(uint32_t)f->dev_type, 4);
  ipcref__wire_put(w, (uint64_t)(uint32_t)f->dev_id, 4);
  if (f->kind == IPCREF__KIND_DEVICE || f->kind == IPCREF__KIND_DEVICE_POOL)
    ipcref__put_bytes(w, f->handle, IPCREF_HANDLE_BYTES);
  if (f->kind == IPCREF__KIND_DEVICE_CHUNKS) {
    int i;
    ipcref__wire_put(w, (uint64_t)f->nchunks, 4);
    for (i = 0; i < f->nchunks; i++) ipcref__wire_put(w, f->chunk[i], 8);
  }
}

/* Reads kind 6's chunk sizes: 0 unless 2..IPCREF_CHUNKS_MAX of them,
 * none 0, adding up to the record's size. */
IPCREF__PRIVATE int ipcref__get_chunks(ipcref__wire *w, ipcref__fd_rec *f) {
  uint64_t sum = 0, n = ipcref__wire_get(w, 4);
  int i;
  if (n < 2 || n > IPCREF_CHUNKS_MAX) return 0;
  f->nchunks = (int)n;
  for (i = 0; i < f->nchunks; i++) {
    f->chunk[i] = ipcref__wire_get(w, 8);
    if (f->chunk[i] == 0 || __builtin_add_overflow(sum, f->chunk[i], &sum))
      return 0;
  }
  return !w->bad && sum == f->size;
}

IPCREF__PRIVATE int ipcref__get_fd_rec(ipcref__wire *w, ipcref__fd_rec *f) {
  memset(f, 0, sizeof *f);
  f->kind = (int)ipcref__wire_get(w, 1);
  f->writable = (int)ipcref__wire_get(w, 1);
  f->origin_pid = (uint32_t)ipcref__wire_get(w, 4);
  f->origin_nonce = ipcref__wire_get(w, 8);
  f->id = ipcref__wire_get(w, 8);
  f->size = ipcref__wire_get(w, 8);
  if (f->kind >= IPCREF__KIND_DEVICE && f->kind <= IPCREF__KIND_DEVICE_CHUNKS) {
    f->dev_type = (int32_t)(uint32_t)ipcref__wire_get(w, 4);
    f->dev_id = (int32_t)(uint32_t)ipcref__wire_get(w, 4);
    if (f->kind == IPCREF__KIND_DEVICE || f->kind == IPCREF__KIND_DEVICE_POOL)
      ipcref__get_bytes(w, f->handle, IPCREF_HANDLE_BYTES);
    if (f->kind == IPCREF__KIND_DEVICE_CHUNKS && !ipcref__get_chunks(w, f))
      return 0;
    if (f->dev_type <= IPCREF_DEVICE_CPU || f->dev_id < 0) return 0;
  }
  return !w->bad && f->kind >= IPCREF__KIND_SEGMENT &&
         f->kind <= IPCREF__KIND_DEVICE_CHUNKS;
}

/* Writes / reads a view record (0 when malformed): IPCREF__VIEW_FIXED
 * bytes at these offsets, then the shape and the strides, then the event
 * handle when flags says so. */
#define IPCREF__VIEW_FIXED 72
IPCREF__PRIVATE void ipcref__put_view(ipcref__wire *w,
                                      const ipcref__view_rec *r) {
  int d, nd = r->view.ndim;
  unsigned char *q =
      ipcref__wire_take(w, IPCREF__VIEW_FIXED + 16 * (size_t)nd +
                               (r->has_event ? IPCREF_HANDLE_BYTES : 0));
  if (!q) return;
  ipcref__le_put(q, r->origin_pid, 4);
  ipcref__le_put(q + 4, r->origin_nonce, 8);
  ipcref__le_put(q + 12, r->seg_id, 8);
  ipcref__le_put(q + 20, r->seg_size, 8);
  ipcref__le_put(q + 28, r->block_offset, 8);
  ipcref__le_put(q + 36, r->block_size, 8);
  ipcref__le_put(q + 44, r->ledger_id, 8);
  ipcref__le_put(q + 52, r->slot, 4);
  ipcref__le_put(q + 56, r->gen, 4);
  q[60] = (unsigned char)r->view.dtype;
  q[61] = (unsigned char)nd;
  q[62] = (unsigned char)r->writable;
  q[63] = (unsigned char)(r->has_event ? 1 : 0); /* flags */
  ipcref__le_put(q + 64, (uint64_t)r->view.byte_offset, 8);
  q += IPCREF__VIEW_FIXED;
  for (d = 0; d < nd; d++)
    ipcref__le_put(q + 8 * d, (uint64_t)r->view.shape[d], 8);
  for (d = 0; d < nd; d++)
    ipcref__le_put(q + 8 * (nd + d), (uint64_t)r->view.strides[d], 8);
  if (r->has_event) memcpy(q + 16 * nd, r->event, IPCREF_HANDLE_BYTES);
}

IPCREF__PRIVATE int ipcref__get_view(ipcref__wire *w, ipcref__view_rec *r) {
  const unsigned char *q = ipcref__wire_take(w, IPCREF__VIEW_FIXED);
  unsigned dt, nd, flags;
  int d;
  if (!q) return 0;
  dt = q[60];
  nd = q[61];
  flags = q[63];
  if (dt >= IPCREF_DTYPE_COUNT || nd > IPCREF_MAX_DIMS || flags > 1) return 0;
  /* Field by field, not a memset of the whole record: the reads that
   * follow would wait for a string store to land. */
  r->origin_pid = (uint32_t)ipcref__le_get(q, 4);
  r->origin_nonce = ipcref__le_get(q + 4, 8);
  r->seg_id = ipcref__le_get(q + 12, 8);
  r->seg_size = ipcref__le_get(q + 20, 8);
  r->block_offset = ipcref__le_get(q + 28, 8);
  r->block_size = ipcref__le_get(q + 36, 8);
  r->ledger_id = ipcref__le_get(q + 44, 8);
  r->slot = (uint32_t)ipcref__le_get(q + 52, 4);
  r->gen = (uint32_t)ipcref__le_get(q + 56, 4);
  r->writable = q[62];
  r->view.buf = NULL;
  r->view.dtype = (ipcref_dtype)dt;
  r->view.ndim = (int)nd;
  r->view.byte_offset = (int64_t)ipcref__le_get(q + 64, 8);
  if (!(q = ipcref__wire_take(w, 16 * (size_t)nd))) return 0;
  /* The dimensions past ndim: 0 (a constant size: a few vector stores). */
  memset(r->view.shape, 0, sizeof r->view.shape);
  memset(r->view.strides, 0, sizeof r->view.strides);
  for (d = 0; d < (int)nd; d++) {
    r->view.shape[d] = (int64_t)ipcref__le_get(q + 8 * d, 8);
    r->view.strides[d] = (int64_t)ipcref__le_get(q + 8 * ((int)nd + d), 8);
  }
  r->has_event = (int)flags;
  if (flags)
    ipcref__get_bytes(w, r->event, IPCREF_HANDLE_BYTES);
  else
    memset(r->event, 0, sizeof r->event);
  return !w->bad;
}

/* The user's metadata for a message: `len` bytes (at most
 * IPCREF_META_MAX) at `bytes`. */
typedef struct ipcref__meta {
  const unsigned char *bytes;
  size_t len;
} ipcref__meta;

/* Checks the metadata a public call `fn` was given, into *m: EINVAL,
 * reported, for a length over IPCREF_META_MAX or NULL bytes with one. */
IPCREF__PRIVATE ipcref_result ipcref__meta_arg(const void *bytes, size_t len,
                                               const char *fn,
                                               ipcref__meta *m) {
  m->bytes = (const unsigned char *)bytes;
  m->len = len;
  if (len > IPCREF_META_MAX)
    return ipcref__invalid(fn, "meta_len over IPCREF_META_MAX");
  if (len && !bytes)
    return ipcref__invalid(fn, "meta is NULL, meta_len is not 0");
  return IPCREF_OK;
}

/* A message's header (the counts bound the arrays of ipcref__msg_in). */
typedef struct ipcref__msg_head {
  int nviews, nrecs, nretired;
  size_t meta_len;
  uint32_t sender_pid;
  uint64_t sender_nonce;
} ipcref__msg_head;

/* The header: IPCREF__HEAD_BYTES at these offsets. */
#define IPCREF__HEAD_BYTES 26
IPCREF__PRIVATE void ipcref__put_msg_head(ipcref__wire *w,
                                          const ipcref__msg_head *h) {
  unsigned char *q = ipcref__wire_take(w, IPCREF__HEAD_BYTES);
  if (!q) return;
  ipcref__le_put(q, IPCREF__MSG_MAGIC, 4);
  ipcref__le_put(q + 4, IPCREF__MSG_VERSION, 2);
  ipcref__le_put(q + 6, (uint64_t)h->nviews, 2);
  ipcref__le_put(q + 8, (uint64_t)h->nrecs, 2);
  ipcref__le_put(q + 10, (uint64_t)h->nretired, 2);
  ipcref__le_put(q + 12, h->sender_pid, 4);
  ipcref__le_put(q + 16, h->sender_nonce, 8);
  ipcref__le_put(q + 24, (uint64_t)h->meta_len, 2);
}

/* 0 when malformed: not ours, another version, or counts out of range. */
IPCREF__PRIVATE int ipcref__get_msg_head(ipcref__wire *w, ipcref__msg_head *h) {
  const unsigned char *q = ipcref__wire_take(w, IPCREF__HEAD_BYTES);
  if (!q || ipcref__le_get(q, 4) != IPCREF__MSG_MAGIC ||
      ipcref__le_get(q + 4, 2) != IPCREF__MSG_VERSION)
    return 0;
  h->nviews = (int)ipcref__le_get(q + 6, 2);
  h->nrecs = (int)ipcref__le_get(q + 8, 2);
  h->nretired = (int)ipcref__le_get(q + 10, 2);
  h->sender_pid = (uint32_t)ipcref__le_get(q + 12, 4);
  h->sender_nonce = ipcref__le_get(q + 16, 8);
  h->meta_len = (size_t)ipcref__le_get(q + 24, 2);
  return h->nviews >= 1 && h->nviews <= IPCREF_MSG_MAX_VIEWS &&
         h->nrecs <= IPCREF_MSG_MAX_FDS && h->nretired <= IPCREF__MSG_RETIRED &&
         h->meta_len <= IPCREF_META_MAX;
}

/* A whole message, decoded: its header, its segment and ledger records
 * (with the index of each one's fd among those the message carries, -1
 * for a device segment by handle), the ids of the segments its sender retired,
 * and its views. */
typedef struct ipcref__msg_in {
  ipcref__msg_head head;
  int nfds; /* fds the records call for (a ledger's bell after it) */
  ipcref__fd_rec recs[IPCREF_MSG_MAX_FDS];
  int fd_index[IPCREF_MSG_MAX_FDS];
  uint64_t retired[IPCREF__MSG_RETIRED];
  ipcref__view_rec views[IPCREF_MSG_MAX_VIEWS];
  const char *why; /* what made ipcref__msg_decode refuse it */
} ipcref__msg_in;

/* Decodes `len` bytes into *m: 0 when they are not exactly one well-formed
 * message (m->why says which part is not). Nothing else is read or
 * changed. */
IPCREF__PRIVATE int ipcref__msg_decode(const unsigned char *bytes, size_t len,
                                       ipcref__msg_in *m) {
  ipcref__wire w;
  int i;
  ipcref__wire_init(&w, (unsigned char *)(uintptr_t)bytes, len);
  m->why = "its header: not ipcref's, another version, or a count out of "
           "range";
  if (!ipcref__get_msg_head(&w, &m->head)) return 0;
  m->nfds = 0;
  m->why = "a segment or ledger record: cut short, or of an unknown kind or "
           "device";
  for (i = 0; i < m->head.nrecs; i++) { /* segments and ledgers: fds */
    if (!ipcref__get_fd_rec(&w, &m->recs[i])) return 0;
    m->fd_index[i] = m->recs[i].kind == IPCREF__KIND_DEVICE ? -1 : m->nfds;
    m->nfds += m->recs[i].kind == IPCREF__KIND_LEDGER   ? 2
               : m->recs[i].kind == IPCREF__KIND_DEVICE ? 0
               : m->recs[i].kind == IPCREF__KIND_DEVICE_CHUNKS
                   ? m->recs[i].nchunks
                   : 1;
  }
  m->why = "more fds than a message may carry";
  if (m->nfds > IPCREF_MSG_MAX_FDS) return 0;
  for (i = 0; i < m->head.nretired; i++)
    m->retired[i] = ipcref__wire_get(&w, 8);
  m->why = "a view record: cut short, or its dtype, ndim or flags out of "
           "range";
  for (i = 0; i < m->head.nviews; i++)
    if (!ipcref__get_view(&w, &m->views[i])) return 0;
  w.pos += m->head.meta_len; /* the user's bytes, as they are */
  m->why = w.bad || w.pos > w.len ? "shorter than its records say"
                                  : "bytes past its records and metadata";
  return !w.bad && w.pos == w.len;
}

/* The metadata of a message: its last meta_len bytes, the length its
 * header gives (NULL, 0 when `len` bytes cannot hold the header and that
 * many). Safe on any bytes; meaningful on a message that decodes. */
IPCREF__PRIVATE const unsigned char *
ipcref__msg_meta_at(const unsigned char *bytes, size_t len, size_t *meta_len) {
  ipcref__wire w;
  ipcref__msg_head h;
  ipcref__wire_init(&w, (unsigned char *)(uintptr_t)bytes, len);
  *meta_len = 0;
  if (!ipcref__get_msg_head(&w, &h) || h.meta_len > len - w.pos) return NULL;
  *meta_len = h.meta_len;
  return bytes + len - h.meta_len;
}

#endif /* IPCREF__SHARING_IMPL */
