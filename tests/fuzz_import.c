/* A libFuzzer target for ipcref_import: arbitrary message bytes with
 * arbitrary fds, as a malicious producer would send them.
 *
 * Once per process: two producer contexts (read-only and writable shares)
 * holding four blocks (pooled read-only, pooled writable, isolated, large).
 * Per input: a fresh consumer context with a mock CUDA backend (see "the
 * device": device records, kinds 3 and 4, reach its driver calls), a
 * socketpair with a producer peer and a consumer peer, and one or two
 * genuine exports of the chosen block (so a real, live lease exists). The
 * input then says what the consumer is handed:
 *
 *   byte 0   flags: bits 0-1 the block (0 pooled, 1 pooled writable,
 *            2 isolated, 3 large); bit 2 a second lease; bit 3 patch mode;
 *            bit 4 the genuine fds, as exported (the fd list is ignored);
 *            bit 5 the consumer's peer capped at 1 mapping (max_maps), or
 *            at 2 with bit 6
 *   byte 1   the number of fds (0-7)
 *   2 bytes  per fd: a kind (low 4 bits: see make_fd) with a size index
 *            (high 4 bits), and a content byte (sealed memfds, files)
 *   the rest raw mode: the message bytes, where every 8-byte token
 *            0xa5a5a5a5a5a5a5NN (little endian) becomes a value of this
 *            run: NN 1 the producer's nonce, 2 the segment id, 3 its size,
 *            4 the block offset, 5 its size, 6 the ledger id, 7 its size,
 *            8 lease 1 (slot | generation << 32), 9 lease 2; and
 *            every 4-byte token 0xa5a5a50a becomes this process's pid
 *            patch mode: the genuine message, resized by the first byte
 *            (int8), then patched: {u16 offset, u8 length, bytes}...
 *
 * After every input:
 *   - the result is one of the documented codes (OK, EPROTO, ENOMEM,
 *     ESYS, ENODEV for a device without a backend here, e.g. ROCm, ERANGE
 *     past the caps; with FUZZ_IMPORT_STRICT=1 not ESYS);
 *   - a view imported is valid, lies inside one mapping (a device view:
 *     inside the segment the mock driver opened, on its device), and every
 *     element it reaches (up to 65,536, else every corner) lies inside its
 *     buffer and is read; a contiguous copy is made of it; then it is
 *     released;
 *   - no fd is left open, no memfd mapping is left, every device segment
 *     the driver opened was closed exactly once by the time the consumer
 *     context is freed, the producers have no live lease, no limbo and no
 *     extra ledger, and no return they got was refused.
 * And during it, the driver is never reached with an unchecked argument:
 * a size of 0, a negative device, an fd not open, or a handle, fd, size,
 * device or writable flag that no well-formed device record of the message
 * (with a size of 1..PTRDIFF_MAX) carries.
 * Any violation aborts. Built and run by tests/fuzz.sh (TARGET import).
 *
 * Built without -fsanitize=fuzzer and with -DFUZZ_IMPORT_SEEDS, main()
 * writes the seed corpus to the directory given (tests/corpus/import/)
 * and replays each seed, printing what it gave. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define MAX_FDS     7
#define MAX_VISIT   65536
#define COPY_LIMIT  ((int64_t)1 << 20)
#define SEGMENT     ((size_t)256 << 10) /* producers' segment size */
#define LEDGER_N    16u                 /* slots per ledger */
#define POOLED_SIZE 2048
#define ISO_SIZE    1000
#define LARGE_SIZE  ((size_t)160 << 10) /* over SEGMENT / 2: own segment */

#define FUZZ_NAME      "fuzz_import"
#define FUZZ_TRACE_ENV "FUZZ_IMPORT_TRACE"
#include "fuzz_common.h"

/* FUZZ_IMPORT_STRICT=1: ESYS is a finding too (what a hostile producer
 * sends should be EPROTO; a system call can still fail for real, e.g. an
 * mmap out of address space, so it is not the default). */
static int strict(void) {
  static int s = -1;
  if (s < 0) {
    const char *e = getenv("FUZZ_IMPORT_STRICT");
    s = e && *e && *e != '0';
  }
  return s;
}

/* ------------------------------------------------------------ resources */

/* Reads /proc/self/maps with read(2) into a static buffer (no allocation:
 * this runs between inputs). `lo`..`hi`: when nonzero, returns 1 when one
 * mapping covers the range; else returns the count of memfd mappings. */
static long scan_maps(uintptr_t lo, uintptr_t hi) {
  static char buf[1 << 20];
  size_t len = 0;
  ssize_t n;
  long memfds = 0;
  char *line, *nl;
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot read /proc/self/maps");
  while (len < sizeof buf - 1 &&
         (n = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
    len += (size_t)n;
  close(fd);
  buf[len] = 0;
  for (line = buf; *line; line = nl + 1) {
    unsigned long s, e;
    nl = strchr(line, '\n');
    if (!nl) break;
    *nl = 0;
    if (sscanf(line, "%lx-%lx", &s, &e) != 2) continue;
    if (hi) {
      if (s <= lo && hi <= e) return 1;
    } else if (strstr(line, "/memfd:")) {
      memfds++;
    }
  }
  return hi ? 0 : memfds;
}

/* ------------------------------------------------------------ producers */

typedef struct block {
  ipcref_ctx *ctx;
  ipcref_view v; /* U8, the whole block; held for the whole run */
} block;

static ipcref_ctx *prod_ro, *prod_rw;
static block blocks[4];
static int base_fds;
static long base_memfd_maps;
static ipcref_stats base_ro, base_rw;

static void make_block(block *b, ipcref_ctx *ctx, size_t size, int isolated) {
  ipcref_buf *buf = NULL;
  int64_t n = (int64_t)size, i;
  ipcref_result r = isolated ? ipcref_shared_new_isolated(ctx, size, &buf)
                             : ipcref_shared_new(ctx, size, &buf);
  if (r != IPCREF_OK) fail("cannot allocate a block");
  if (ipcref_view_of(buf, IPCREF_U8, 1, &n, &b->v) != IPCREF_OK)
    fail("cannot view a block");
  ipcref_buf_release(buf);
  for (i = 0; i < n; i++)
    ((unsigned char *)ipcref_buf_data(b->v.buf))[i] =
        (unsigned char)(i * 7 + (i >> 8));
  b->ctx = ctx;
}

static void setup(void) {
  ipcref_ctx_options opt;
  static int done;
  if (done) return;
  done = 1;
  memset(&opt, 0, sizeof opt);
  opt.segment_size = SEGMENT;
  opt.ledger_slots = LEDGER_N;
  if (ipcref_ctx_new(&opt, &prod_ro) != IPCREF_OK) fail("ctx");
  opt.writable_shares = 1;
  if (ipcref_ctx_new(&opt, &prod_rw) != IPCREF_OK) fail("ctx");
  make_block(&blocks[0], prod_ro, POOLED_SIZE, 0);
  make_block(&blocks[1], prod_rw, POOLED_SIZE, 0);
  make_block(&blocks[2], prod_ro, ISO_SIZE, 1);
  make_block(&blocks[3], prod_ro, LARGE_SIZE, 0);
  ipcref_ctx_stats(prod_ro, &base_ro);
  ipcref_ctx_stats(prod_rw, &base_rw);
  base_fds = count_fds();
  base_memfd_maps = scan_maps(0, 0);
}

/* ------------------------------------------------------------ the wire */

#define TOKEN      0xa5a5a5a5a5a5a500ull
#define PID_TOKEN  0xa5a5a50aull
#define VIEW_FIXED 72 /* bytes of a view record before shape and strides */

enum {
  T_NONCE = 1,
  T_SEG_ID,
  T_SEG_SIZE,
  T_BLOCK_OFF,
  T_BLOCK_SIZE,
  T_LEDGER_ID,
  T_LEDGER_SIZE,
  T_LEASE1,
  T_LEASE2,
  T_COUNT
};

static uint64_t le(const unsigned char *b, size_t at, int bytes) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < bytes; i++) v |= (uint64_t)b[at + (size_t)i] << (8 * i);
  return v;
}

#define HEAD_BYTES 26 /* a message's header (src/share_wire.h) */

static void put_le(unsigned char *b, size_t at, uint64_t v, int bytes) {
  int i;
  for (i = 0; i < bytes; i++) b[at + (size_t)i] = (unsigned char)(v >> (8 * i));
}

/* Where the first view record of an exported message starts (it has 26
 * header bytes, 30 per fd record, 8 per retired id); 0 if not there. */
static size_t view_at(const ipcref_msg *m) {
  size_t at;
  if (m->len < HEAD_BYTES || le(m->bytes, 0, 4) != 0x4d435049u) return 0;
  at = HEAD_BYTES + (size_t)le(m->bytes, 8, 2) * 30 +
       (size_t)le(m->bytes, 10, 2) * 8;
  return at + VIEW_FIXED <= m->len ? at : 0;
}

/* This run's values of the tokens, from the genuine exports. */
static void token_values(const ipcref_msg *e1, const ipcref_msg *e2,
                         uint64_t val[T_COUNT]) {
  size_t v = view_at(e1), i;
  memset(val, 0, sizeof(uint64_t) * T_COUNT);
  if (!v) fail("an exported message has an unknown layout");
  val[T_NONCE] = le(e1->bytes, v + 4, 8);
  val[T_SEG_ID] = le(e1->bytes, v + 12, 8);
  val[T_SEG_SIZE] = le(e1->bytes, v + 20, 8);
  val[T_BLOCK_OFF] = le(e1->bytes, v + 28, 8);
  val[T_BLOCK_SIZE] = le(e1->bytes, v + 36, 8);
  val[T_LEDGER_ID] = le(e1->bytes, v + 44, 8);
  val[T_LEASE1] = le(e1->bytes, v + 52, 8);
  for (i = 0; i < (size_t)le(e1->bytes, 8, 2); i++)
    if (e1->bytes[HEAD_BYTES + 30 * i] == 2)
      val[T_LEDGER_SIZE] = le(e1->bytes, HEAD_BYTES + 30 * i + 22, 8);
  if (e2 && (v = view_at(e2)) != 0) val[T_LEASE2] = le(e2->bytes, v + 52, 8);
}

static void substitute(unsigned char *b, size_t len,
                       const uint64_t val[T_COUNT]) {
  size_t i;
  for (i = 0; i + 8 <= len; i++) {
    uint64_t t = le(b, i, 8);
    if ((t & ~0xffull) == TOKEN && (t & 0xff) >= 1 && (t & 0xff) < T_COUNT) {
      put_le(b, i, val[t & 0xff], 8);
      i += 7;
    }
  }
  for (i = 0; i + 4 <= len; i++)
    if (le(b, i, 4) == PID_TOKEN) {
      put_le(b, i, (uint64_t)(uint32_t)getpid(), 4);
      i += 3;
    }
}

/* ------------------------------------------------------------ fds */

enum {
  FD_SEG,           /* the genuine segment fd */
  FD_LEDGER,        /* the genuine ledger fd */
  FD_SEALED,        /* a memfd sealed against shrink, grow and seals */
  FD_UNSEALED,      /* a memfd without sealing */
  FD_PIPE,          /* a pipe's read end */
  FD_SOCKET,        /* a socket: content bit 0, datagram (a bell's kind) */
  FD_DEVNULL,       /* /dev/null */
  FD_REGULAR,       /* a regular file (unlinked) */
  FD_SEG_RDWR,      /* the segment reopened read-write */
  FD_SEG_WRONLY,    /* the segment reopened write-only */
  FD_LEDGER_RDONLY, /* the ledger reopened read-only */
  FD_SEG_PATH,      /* the segment as O_PATH */
  FD_NONE,          /* -1 */
  FD_EVENTFD,       /* an eventfd (an anonymous inode) */
  FD_SEALED_RO,     /* a sealed memfd also sealed against writes */
  FD_SAME           /* a duplicate of the fd before it */
};

static const char *const fd_names[16] = {
    "seg",       "ledger",  "sealed",    "unsealed",   "pipe",      "socket",
    "/dev/null", "regular", "seg-rdwr",  "seg-wronly", "ledger-ro", "seg-path",
    "none",      "eventfd", "sealed-ro", "same"};

/* The size a size index names. */
static size_t size_of(unsigned idx, const uint64_t val[T_COUNT]) {
  switch (idx) {
  case 0: return 0;
  case 1: return 1;
  case 2: return 64;
  case 3: return 100;
  case 4: return 4095;
  case 5: return 4096;
  case 6: return 8192;
  case 7: return (size_t)val[T_SEG_SIZE];
  case 8: return (size_t)val[T_SEG_SIZE] + 4096;
  case 9: return (size_t)val[T_SEG_SIZE] - 1;
  case 10: return (size_t)val[T_LEDGER_SIZE];
  case 11: return (size_t)val[T_LEDGER_SIZE] + 16;
  case 12: return (size_t)val[T_LEDGER_SIZE] - 16;
  case 13: return ipcref__ledger_bytes(8);
  case 14: return ipcref__ledger_bytes(2);
  default: return (size_t)val[T_BLOCK_SIZE];
  }
}

/* Fills a new file's first bytes: content byte c, low 2 bits: 0 zeros,
 * 1 the genuine ledger's bytes, 2 the genuine segment's, 3 the byte c
 * repeated; in modes 1 and 2, c >> 2 nonzero flips the byte at
 * (c >> 2) * 8 (0: a perfect copy). */
static int fill_file(int fd, size_t size, unsigned c, int seg, int ledger) {
  static unsigned char buf[1 << 16];
  size_t n = size < sizeof buf ? size : sizeof buf;
  ssize_t got = 0;
  if (n == 0) return 0;
  memset(buf, 0, n);
  switch (c & 3) {
  case 1: got = pread(ledger, buf, n, 0); break;
  case 2: got = pread(seg, buf, n, 0); break;
  case 3: memset(buf, (int)c, n); break;
  default: break;
  }
  (void)got;
  if (((c & 3) == 1 || (c & 3) == 2) && (c >> 2)) {
    size_t at = (size_t)(c >> 2) * 8;
    if (at < n) buf[at] ^= 0x5a;
  }
  return pwrite(fd, buf, n, 0) == (ssize_t)n ? 0 : -1;
}

static int memfd_of(size_t size, unsigned seals, unsigned c, int seg,
                    int ledger) {
  int fd = memfd_create("fuzz-import",
                        MFD_CLOEXEC | (seals ? MFD_ALLOW_SEALING : 0));
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)size) != 0 || fill_file(fd, size, c, seg, ledger) ||
      (seals && fcntl(fd, F_ADD_SEALS, (int)seals) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

static int reopen(int fd, int flags) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  return open(path, flags | O_CLOEXEC);
}

/* A new fd of the kind selector `sel` names (-1 for FD_NONE or on
 * failure). `prev`: the fd made before it (for FD_SAME). */
static int make_fd(unsigned sel, unsigned c, int seg, int ledger, int prev,
                   const uint64_t val[T_COUNT]) {
  const unsigned sealed = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  size_t size = size_of(sel >> 4, val);
  int pv[2], fd;
  switch (sel & 15) {
  case FD_SEG: return fcntl(seg, F_DUPFD_CLOEXEC, 0);
  case FD_LEDGER: return fcntl(ledger, F_DUPFD_CLOEXEC, 0);
  case FD_SEALED: return memfd_of(size, sealed, c, seg, ledger);
  case FD_UNSEALED: return memfd_of(size, 0, c, seg, ledger);
  case FD_PIPE:
    if (pipe2(pv, O_CLOEXEC) != 0) return -1;
    close(pv[1]);
    return pv[0];
  case FD_SOCKET:
    if (socketpair(AF_UNIX,
                   (c & 1 ? SOCK_DGRAM : SOCK_SEQPACKET) | SOCK_CLOEXEC, 0,
                   pv) != 0)
      return -1;
    close(pv[1]);
    return pv[0];
  case FD_DEVNULL: return open("/dev/null", O_RDWR | O_CLOEXEC);
  case FD_REGULAR:
    fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      char path[] = "/tmp/fuzz-import-XXXXXX";
      fd = mkstemp(path);
      if (fd >= 0) unlink(path);
    }
    if (fd >= 0 && (ftruncate(fd, (off_t)size) != 0 ||
                    fill_file(fd, size, c, seg, ledger))) {
      close(fd);
      fd = -1;
    }
    return fd;
  case FD_SEG_RDWR: return reopen(seg, O_RDWR);
  case FD_SEG_WRONLY: return reopen(seg, O_WRONLY);
  case FD_LEDGER_RDONLY: return reopen(ledger, O_RDONLY);
  case FD_SEG_PATH: return reopen(seg, O_PATH);
  case FD_NONE: return -1;
  case FD_EVENTFD: return eventfd(0, EFD_CLOEXEC);
  case FD_SEALED_RO:
    return memfd_of(size, sealed | F_SEAL_FUTURE_WRITE, c, seg, ledger);
  default: return prev >= 0 ? fcntl(prev, F_DUPFD_CLOEXEC, 0) : -1;
  }
}

/* ------------------------------------------------------------ the device */

/* A mock driver behind a backend for IPCREF_DEVICE_CUDA, added to every
 * consumer: it opens a device segment by allocating zeroed host memory,
 * which the checks can read. Its seg_import and seg_import_fd are the
 * driver's entry points: reaching them with anything the sharing layer
 * should have checked (a size of 0, a negative device, a closed fd, or
 * arguments no well-formed record of the message carries) aborts. A
 * handle opens when it starts with MOCK_MARKER: u64 at byte 8 the
 * allocation's size, byte 16 bit 0 set: the driver gives back an address
 * inside the allocation rather than its base. An fd opens when it is a
 * memfd. Sizes over MOCK_MAX are refused (EPROTO), as a driver would. */
#define MOCK_MARKER "ipcMOCK!"
#define MOCK_MAX    ((uint64_t)64 << 20)
#define MOCK_MAPS   (2 * IPCREF_MSG_MAX_FDS)
#define MOCK_SKEW   256 /* the lying driver's offset into its allocation */

typedef struct mock_map {
  unsigned char *base; /* calloc'd */
  uint64_t addr;       /* what the driver gave back */
  size_t size;
  int32_t dev;
  int open; /* until seg_close */
} mock_map;

static mock_map mock_maps[MOCK_MAPS];
static int mock_nmaps; /* this run's, open or closed */

/* The device records of this run's message as it was handed over (kinds
 * 3 and 4, with the fd a kind 4 comes with): what the driver may be
 * asked for. */
typedef struct dev_rec {
  int kind, writable, fd;
  uint32_t dev_type, dev_id;
  uint64_t size;
  unsigned char handle[IPCREF_HANDLE_BYTES];
  int nchunks, chunk_fd[IPCREF_CHUNKS_MAX]; /* kind 6 */
  uint64_t chunk[IPCREF_CHUNKS_MAX];
} dev_rec;

static dev_rec dev_recs[IPCREF_MSG_MAX_FDS];
static int ndev_recs;

/* Reads the records of message `m` (as the library's decoder does, but
 * forgiving: what it cannot read is no record). */
static void dev_recs_scan(const ipcref_msg *m) {
  size_t at = 26;
  unsigned n, i, fdi = 0;
  ndev_recs = 0;
  if (m->len < 26) return;
  n = (unsigned)(m->bytes[8] | m->bytes[9] << 8);
  for (i = 0; i < n && i < IPCREF_MSG_MAX_FDS && at + 30 <= m->len; i++) {
    dev_rec *d = &dev_recs[ndev_recs];
    unsigned kind = m->bytes[at];
    uint64_t size = 0;
    int k;
    for (k = 0; k < 8; k++) size |= (uint64_t)m->bytes[at + 22 + k] << (8 * k);
    memset(d, 0, sizeof *d);
    d->kind = (int)kind;
    d->writable = m->bytes[at + 1];
    d->size = size;
    d->fd = -1;
    at += 30;
    if (kind >= 3 && kind <= 6) { /* device: handle, fd, pool, chunks */
      if (at + 8 > m->len) return;
      for (k = 0; k < 4; k++) {
        d->dev_type |= (uint32_t)m->bytes[at + (size_t)k] << (8 * k);
        d->dev_id |= (uint32_t)m->bytes[at + 4 + (size_t)k] << (8 * k);
      }
      at += 8;
      if (kind == 3 || kind == 5) { /* the handle; the pointer's data */
        if (at + IPCREF_HANDLE_BYTES > m->len) return;
        memcpy(d->handle, m->bytes + at, IPCREF_HANDLE_BYTES);
        at += IPCREF_HANDLE_BYTES;
      }
      if (kind == 6) { /* u32 n, n x u64 size; an fd each */
        unsigned c;
        if (at + 4 > m->len) return;
        d->nchunks = (int)le(m->bytes, at, 4);
        at += 4;
        if (d->nchunks < 2 || d->nchunks > IPCREF_CHUNKS_MAX) return;
        if (at + 8 * (size_t)d->nchunks > m->len) return;
        for (c = 0; c < (unsigned)d->nchunks; c++) {
          d->chunk[c] = le(m->bytes, at + 8 * c, 8);
          d->chunk_fd[c] = fdi + c < (unsigned)m->nfds ? m->fds[fdi + c] : -1;
        }
        at += 8 * (size_t)d->nchunks;
      } else if (kind != 3 && fdi < (unsigned)m->nfds) {
        d->fd = m->fds[fdi];
      }
      ndev_recs++;
    }
    fdi += kind == 2   ? 2
           : kind == 3 ? 0
           : kind == 6 ? (unsigned)dev_recs[ndev_recs - 1].nchunks
                       : 1;
  }
}

/* A device record of this message the driver call may be for. */
static int dev_rec_fits(int kind, int32_t dev, const unsigned char *handle,
                        int fd, uint64_t size, int writable) {
  int i;
  for (i = 0; i < ndev_recs; i++) {
    const dev_rec *d = &dev_recs[i];
    if (d->kind != kind || d->dev_type != IPCREF_DEVICE_CUDA ||
        d->dev_id != (uint32_t)dev || d->size == 0 ||
        d->size > (uint64_t)PTRDIFF_MAX)
      continue;
    if (kind == 3 && !memcmp(d->handle, handle, IPCREF_HANDLE_BYTES)) return 1;
    if (kind != 3 && d->fd == fd && d->size == size &&
        !d->writable == !writable &&
        (kind == 4 || !memcmp(d->handle, handle, IPCREF_HANDLE_BYTES)))
      return 1;
  }
  return 0;
}

/* An open mapping holding [lo, lo + size), or NULL. */
static mock_map *mock_find(uint64_t lo, size_t size) {
  int i;
  for (i = 0; i < mock_nmaps; i++) {
    mock_map *mm = &mock_maps[i];
    uint64_t b = (uint64_t)(uintptr_t)mm->base;
    if (mm->open && lo >= b && lo - b <= mm->size &&
        mm->size - (lo - b) >= size)
      return mm;
  }
  return NULL;
}

static ipcref_result mock_open(int32_t dev, uint64_t size, int skew,
                               uint64_t *addr) {
  mock_map *mm;
  if (mock_nmaps == MOCK_MAPS)
    fail("the driver opened more segments than "
         "a message has records");
  mm = &mock_maps[mock_nmaps];
  memset(mm, 0, sizeof *mm);
  mm->base = (unsigned char *)calloc(1, (size_t)size);
  if (!mm->base) return IPCREF_ENOMEM;
  mm->size = (size_t)size;
  mm->dev = dev;
  mm->open = 1;
  mm->addr = (uint64_t)(uintptr_t)mm->base + (skew ? MOCK_SKEW : 0);
  mock_nmaps++;
  *addr = mm->addr;
  tr("  driver: opened %zu bytes on device %d at %p%s\n", mm->size, (int)dev,
     (void *)mm->base, skew ? " (gave an inner address)" : "");
  return IPCREF_OK;
}

static ipcref_result mock_seg_import(ipcref_backend *be, int32_t dev,
                                     const unsigned char *handle,
                                     uint64_t *addr) {
  uint64_t size = 0;
  int k;
  (void)be;
  if (dev < 0) fail("the driver got a negative device id");
  if (!handle || !addr) fail("the driver got a NULL handle or address");
  if (!dev_rec_fits(3, dev, handle, -1, 0, 0))
    fail("the driver opened a handle no well-formed kind 3 record of "
         "the message carries (device, handle, size 1..PTRDIFF_MAX)");
  if (memcmp(handle, MOCK_MARKER, 8) != 0) return IPCREF_EPROTO;
  for (k = 0; k < 8; k++) size |= (uint64_t)handle[8 + k] << (8 * k);
  if (size == 0 || size > MOCK_MAX || (size <= MOCK_SKEW && (handle[16] & 1)))
    return IPCREF_EPROTO;
  return mock_open(dev, size, handle[16] & 1, addr);
}

static int is_memfd(int fd) {
  char path[64], target[64];
  ssize_t n;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  n = readlink(path, target, sizeof target - 1);
  if (n < 0) return 0;
  target[n] = 0;
  return strncmp(target, "/memfd:", 7) == 0;
}

/* Kind 4 (an allocation's fd) and 5 (a pool's fd and a pointer's data,
 * which must carry the mock's marker, as a handle does). */
static ipcref_result mock_seg_import_fd(ipcref_backend *be, int32_t dev, int fd,
                                        const unsigned char *data, int pooled,
                                        uint64_t size, int writable,
                                        uint64_t *addr) {
  (void)be;
  if (dev < 0) fail("the driver got a negative device id");
  if (size == 0) fail("the driver was asked to map 0 bytes");
  if (!addr || !data) fail("the driver got a NULL address or data");
  if (fd < 0 || fcntl(fd, F_GETFD) < 0) fail("the driver got an fd not open");
  if (!dev_rec_fits(pooled ? 5 : 4, dev, data, fd, size, writable))
    fail("the driver mapped an fd no well-formed kind 4 or 5 record of the "
         "message carries (device, its own fd, data, size, writable)");
  if (size > MOCK_MAX || !is_memfd(fd)) return IPCREF_EPROTO;
  if (pooled && memcmp(data, MOCK_MARKER, 8) != 0) return IPCREF_EPROTO;
  return mock_open(dev, size, 0, addr);
}

/* Kind 6: the chunks, each a memfd, mapped one after the other (the mock
 * gives one mapping of their sum). */
static ipcref_result mock_seg_import_chunks(ipcref_backend *be, int32_t dev,
                                            const int *fds,
                                            const uint64_t *sizes, int n,
                                            int writable, uint64_t *addr) {
  uint64_t sum = 0;
  int i, k, found = 0;
  (void)be;
  if (dev < 0) fail("the driver got a negative device id");
  if (n < 2 || n > IPCREF_CHUNKS_MAX)
    fail("the driver got a chunk count "
         "out of range");
  for (i = 0; i < n; i++) {
    if (sizes[i] == 0) fail("the driver was asked to map a chunk of 0 bytes");
    if (fds[i] < 0 || fcntl(fds[i], F_GETFD) < 0)
      fail("the driver got a chunk's fd not open");
    if (__builtin_add_overflow(sum, sizes[i], &sum) ||
        sum > (uint64_t)PTRDIFF_MAX)
      fail("the driver got chunks adding up past PTRDIFF_MAX");
  }
  for (i = 0; i < ndev_recs && !found; i++) {
    const dev_rec *d = &dev_recs[i];
    if (d->kind != 6 || d->nchunks != n || d->dev_id != (uint32_t)dev ||
        d->size != sum || !d->writable != !writable)
      continue;
    found = 1;
    for (k = 0; k < n; k++)
      if (d->chunk[k] != sizes[k] || d->chunk_fd[k] != fds[k]) found = 0;
  }
  if (!found)
    fail("the driver mapped chunks no well-formed kind 6 record of the "
         "message carries (device, sizes, their own fds, writable)");
  for (i = 0; i < n; i++)
    if (!is_memfd(fds[i])) return IPCREF_EPROTO;
  if (sum > MOCK_MAX) return IPCREF_EPROTO;
  return mock_open(dev, sum, 0, addr);
}

static ipcref_result mock_seg_export_chunks(ipcref_backend *be, int32_t dev,
                                            uint64_t base,
                                            const uint64_t *sizes, int n,
                                            int *fds) {
  (void)be, (void)dev, (void)base, (void)sizes, (void)n, (void)fds;
  return IPCREF_ENODEV;
}

static ipcref_result mock_seg_range(ipcref_backend *be, int32_t dev,
                                    uint64_t addr, uint64_t *base,
                                    size_t *size) {
  mock_map *mm = mock_find(addr, 1);
  (void)be;
  if (!mm || mm->dev != dev) return IPCREF_EINVAL;
  *base = (uint64_t)(uintptr_t)mm->base;
  *size = mm->size;
  return IPCREF_OK;
}

static void mock_seg_close(ipcref_backend *be, int32_t dev, uint64_t addr) {
  int i, closed = 0;
  (void)be;
  for (i = 0; i < mock_nmaps; i++) {
    mock_map *mm = &mock_maps[i];
    if (mm->addr != addr) continue;
    if (!mm->open) {
      closed = 1;
      continue;
    }
    if (mm->dev != dev) fail("a device segment closed on another device");
    tr("  driver: closed %p\n", (void *)mm->base);
    free(mm->base);
    mm->base = NULL;
    mm->open = 0;
    return;
  }
  fail(closed ? "a device segment closed twice"
              : "a device address closed that the driver never gave");
}

static ipcref_result mock_seg_alloc(ipcref_backend *be, int32_t dev,
                                    size_t size, uint64_t *addr) {
  (void)be, (void)dev, (void)size, (void)addr;
  return IPCREF_ENODEV;
}

static void mock_seg_free(ipcref_backend *be, int32_t dev, uint64_t addr) {
  (void)be, (void)dev, (void)addr;
  fail("seg_free of a device segment this process never allocated");
}

static ipcref_result mock_seg_export(ipcref_backend *be, int32_t dev,
                                     uint64_t base, unsigned char *handle) {
  (void)be, (void)dev, (void)base, (void)handle;
  return IPCREF_ENODEV;
}

static ipcref_result mock_seg_export_fd(ipcref_backend *be, int32_t dev,
                                        uint64_t base, int *fd,
                                        unsigned char *data, int *pooled) {
  (void)be, (void)dev, (void)base, (void)fd, (void)data, (void)pooled;
  return IPCREF_ENODEV;
}

static ipcref_result mock_event_record(ipcref_backend *be, int32_t dev,
                                       void *stream, unsigned char *handle,
                                       void **event) {
  (void)be, (void)dev, (void)stream, (void)handle, (void)event;
  return IPCREF_ENODEV;
}

static void mock_event_free(ipcref_backend *be, void *event) {
  (void)be, (void)event;
}

static ipcref_result mock_event_wait(ipcref_backend *be, int32_t dev,
                                     void *stream,
                                     const unsigned char *handle) {
  (void)be, (void)stream;
  if (dev < 0 || !handle) fail("event_wait: a negative device or no handle");
  return IPCREF_OK;
}

static ipcref_result mock_fence(ipcref_backend *be, int32_t dev, void *stream,
                                void **fence) {
  (void)be, (void)dev, (void)stream;
  *fence = NULL;
  return IPCREF_OK;
}

static int mock_fence_done(ipcref_backend *be, void *fence) {
  (void)be, (void)fence;
  return 1;
}

static ipcref_backend mock_backend = {
    .device_type = IPCREF_DEVICE_CUDA,
    .name = "fuzz-mock",
    .seg_alloc = mock_seg_alloc,
    .seg_free = mock_seg_free,
    .seg_range = mock_seg_range,
    .seg_export = mock_seg_export,
    .seg_import = mock_seg_import,
    .seg_close = mock_seg_close,
    .event_record = mock_event_record,
    .event_free = mock_event_free,
    .event_wait = mock_event_wait,
    .fence = mock_fence,
    .fence_done = mock_fence_done,
    .seg_export_fd = mock_seg_export_fd,
    .seg_import_fd = mock_seg_import_fd,
    .seg_export_chunks = mock_seg_export_chunks,
    .seg_import_chunks = mock_seg_import_chunks,
};

/* After the consumer context is gone: every segment the driver opened was
 * closed (once: seg_close checks that). */
static void mock_check_closed(void) {
  int i;
  for (i = 0; i < mock_nmaps; i++)
    if (mock_maps[i].open) fail("a device segment outlived its context");
  mock_nmaps = 0;
  ndev_recs = 0;
}

/* ------------------------------------------------------------ checking */

static volatile unsigned sink;

static void check_elem(const unsigned char *p, const unsigned char *lo,
                       size_t size, size_t item) {
  if (!p || p < lo || (size_t)(p - lo) > size || size - (size_t)(p - lo) < item)
    fail("an imported view reaches outside its buffer");
  sink += p[0] + p[item - 1];
}

/* Everything a successful import's view reaches lies in its buffer, and
 * the buffer in one mapping. */
static void check_view(const ipcref_view *v) {
  const unsigned char *lo;
  size_t size, item;
  int64_t numel;
  ipcref_view c;
  ipcref_device dev;
  if (!v->buf) fail("an import succeeded without a buffer");
  if (ipcref__view_check_new(v) != IPCREF_OK) fail("an invalid view imported");
  lo = (const unsigned char *)ipcref_buf_data(v->buf);
  size = ipcref_buf_size(v->buf);
  item = ipcref_dtype_size(v->dtype);
  dev = ipcref_buf_device(v->buf);
  if (dev.type != IPCREF_DEVICE_CPU) { /* the mock driver's host memory */
    const mock_map *mm = mock_find((uint64_t)(uintptr_t)lo, size);
    if (!mm)
      fail("an imported device buffer is not inside the segment "
           "the driver opened");
    if (dev.type != IPCREF_DEVICE_CUDA || dev.id != mm->dev)
      fail("an imported device buffer names another device");
  } else if (size && !scan_maps((uintptr_t)lo, (uintptr_t)lo + size)) {
    fail("an imported buffer is not inside one mapping");
  }
  numel = ipcref_view_numel(v);
  tr("  imported: dtype %d ndim %d numel %lld offset %lld in %zu bytes\n",
     (int)v->dtype, v->ndim, (long long)numel, (long long)v->byte_offset, size);
  if (numel <= 0) return;
  if (numel <= MAX_VISIT) {
    ipcref_view_iter it;
    const unsigned char *p;
    int64_t seen = 0;
    if (ipcref_view_iter_init(v, &it) != IPCREF_OK) fail("iter_init");
    while ((p = (const unsigned char *)ipcref_view_iter_next(&it)) != NULL) {
      check_elem(p, lo, size, item);
      seen++;
    }
    if (seen != numel) fail("the iterator missed elements");
  } else { /* every corner */
    int64_t idx[IPCREF_MAX_DIMS];
    unsigned mask, d;
    for (mask = 0; mask < (1u << v->ndim); mask++) {
      for (d = 0; d < (unsigned)v->ndim; d++)
        idx[d] = (mask >> d) & 1 ? v->shape[d] - 1 : 0;
      check_elem((const unsigned char *)ipcref_view_ptr(v, idx), lo, size,
                 item);
    }
  }
  if (numel <= COPY_LIMIT / (int64_t)item) {
    memset(&c, 0, sizeof c);
    if (ipcref_view_contiguous(v, &c) == IPCREF_OK) {
      if (ipcref_view_numel(&c) != numel) fail("contiguous lost elements");
      ipcref_view_release(&c);
    }
  }
}

static void check_producer(ipcref_ctx *ctx, const ipcref_stats *base) {
  ipcref_stats s;
  if (ipcref_ctx_stats(ctx, &s) != IPCREF_OK) fail("stats");
  if (s.live_slots || s.limbo_blocks ||
      s.counter_files != base->counter_files) {
    fprintf(stderr, "live_slots %zu limbo %zu ledgers %zu (%zu before)\n",
            s.live_slots, s.limbo_blocks, s.counter_files, base->counter_files);
    fail("a producer kept a lease, a limbo block or a ledger");
  }
  if (s.bad_returns != base->bad_returns)
    fail("a producer refused a return (a lease came back twice?)");
  if (s.live_bufs != base->live_bufs || s.imported_bufs != 0)
    fail("a producer's buffers changed");
}

/* ------------------------------------------------------------ one input */

/* Runs one input; returns the result of the import. */
static ipcref_result run_one(const uint8_t *data, size_t size) {
  reader rd;
  unsigned flags, nfds, kind, i;
  block *b;
  ipcref_ctx *cons = NULL;
  ipcref_peer *pp = NULL, *cp = NULL;
  ipcref_msg e1, e2, m;
  ipcref_view got;
  ipcref_result rc;
  uint64_t val[T_COUNT];
  int sv[2], seg = -1, ledger = -1, have_e2 = 0;
  setup();
  rd.p = data;
  rd.n = size;
  flags = u8(&rd);
  nfds = u8(&rd) % (MAX_FDS + 1);
  kind = flags & 3;
  b = &blocks[kind];
  /* A consumer, a pair of peers, and the genuine exports. */
  if (ipcref_ctx_new(NULL, &cons) != IPCREF_OK ||
      ipcref_ctx_add_backend(cons, &mock_backend) != IPCREF_OK)
    fail("consumer ctx");
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    fail("socketpair");
  if (ipcref_peer_new(b->ctx, sv[0], &pp) != IPCREF_OK ||
      ipcref_peer_new(cons, sv[1], &cp) != IPCREF_OK)
    fail("peers");
  if (flags & 32) { /* the consumer's caps: 1 or 2 mappings */
    ipcref_peer_options o;
    memset(&o, 0, sizeof o);
    o.max_maps = (flags & 64) ? 2 : 1;
    if (ipcref_peer_set_options(cp, &o) != IPCREF_OK) fail("the caps");
    tr("max_maps %zu\n", o.max_maps);
  }
  memset(&e1, 0, sizeof e1);
  memset(&e2, 0, sizeof e2);
  if (ipcref_export(pp, &b->v, &e1) != IPCREF_OK || e1.nfds != 3)
    fail("the genuine export");
  if (flags & 4) {
    if (ipcref_export(pp, &b->v, &e2) != IPCREF_OK) fail("a second export");
    have_e2 = 1;
  }
  for (i = 0; i < (unsigned)e1.nfds; i++) {
    size_t at = HEAD_BYTES + 30 * (size_t)i;
    if (e1.bytes[at] == 1) seg = e1.fds[i];
    if (e1.bytes[at] == 2) ledger = e1.fds[i];
  }
  if (seg < 0 || ledger < 0) fail("the genuine export lacks an fd");
  token_values(&e1, have_e2 ? &e2 : NULL, val);
  /* The message. */
  memset(&m, 0, sizeof m);
  if (flags & 16) {
    for (i = 0; i < (unsigned)e1.nfds; i++)
      m.fds[m.nfds++] = fcntl(e1.fds[i], F_DUPFD_CLOEXEC, 0);
    for (i = 0; i < nfds; i++) (void)u8(&rd), (void)u8(&rd);
    tr("fds: the genuine ones\n");
  } else {
    int prev = -1;
    for (i = 0; i < nfds; i++) {
      unsigned sel = u8(&rd), c = u8(&rd);
      int fd = make_fd(sel, c, seg, ledger, prev, val);
      tr("fd %u: %s size %zu content %u -> %d\n", i, fd_names[sel & 15],
         size_of(sel >> 4, val), c, fd);
      m.fds[m.nfds++] = fd;
      prev = fd;
    }
  }
  if (flags & 8) { /* patch the genuine message */
    int delta = (int)(int8_t)u8(&rd);
    size_t len = e1.len;
    memcpy(m.bytes, e1.bytes, e1.len);
    if (delta < 0 && (size_t)-delta > len)
      len = 0;
    else if (delta < 0)
      len -= (size_t)-delta;
    else
      len += (size_t)delta; /* the bytes past it are zeros */
    m.len = len;
    while (rd.n >= 3) {
      size_t off = u8(&rd);
      unsigned n;
      off |= (size_t)u8(&rd) << 8;
      n = u8(&rd) % 9;
      for (; n > 0 && rd.n > 0; n--, off++) {
        unsigned char byte = (unsigned char)u8(&rd);
        if (off < m.len) m.bytes[off] = byte;
      }
    }
    tr("patched message, %zu bytes\n", m.len);
  } else {
    m.len = rd.n < sizeof m.bytes ? rd.n : sizeof m.bytes;
    memcpy(m.bytes, rd.p, m.len);
    substitute(m.bytes, m.len, val);
    tr("raw message, %zu bytes\n", m.len);
  }
  /* The import. */
  dev_recs_scan(&m);
  memset(&got, 0, sizeof got);
  rc = ipcref_import(cp, &m, &got);
  tr("import: %s\n", ipcref_strerror(rc));
  if (m.nfds != 0) fail("ipcref_import did not take the message's fds");
  switch (rc) {
  case IPCREF_OK: check_view(&got); break;
  case IPCREF_ESYS:
    if (strict()) fail("ESYS for a message (FUZZ_IMPORT_STRICT=1)");
    /* fall through */
  case IPCREF_EPROTO:
  case IPCREF_ERANGE: /* past the caps (flags bit 5) */
  case IPCREF_ENOMEM:
  case IPCREF_ENODEV: /* a device segment, and no backend for it here */
    if (got.buf) fail("a failed import gave a buffer");
    break;
  default: fail("ipcref_import returned an undocumented code");
  }
  ipcref_view_release(&got);
  /* What came back is back; what never went out is cancelled. */
  {
    ipcref_stats s;
    ipcref_ctx_stats(b->ctx, &s);
  }
  ipcref_msg_free(&e1);
  ipcref_msg_free(&e2);
  ipcref_peer_free(cp);
  ipcref_ctx_free(cons);
  mock_check_closed();
  ipcref_peer_free(pp);
  check_producer(prod_ro, &base_ro);
  check_producer(prod_rw, &base_rw);
  if (count_fds() != base_fds) fail("an fd leaked");
  if (scan_maps(0, 0) != base_memfd_maps) fail("a memfd mapping leaked");
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  (void)run_one(data, size);
  return 0;
}

/* ------------------------------------------------------------ seeds */

#ifdef FUZZ_IMPORT_SEEDS
#include <sys/stat.h>

static const char *seed_dir;
static int nseeds, seeds_ok;

/* The genuine message of exporting `v` (over block `kind`), with every
 * value of this run replaced by its token. */
static void templated(const ipcref_view *v, int kind, unsigned char *out,
                      size_t *len) {
  ipcref_ctx *cons = NULL;
  ipcref_peer *pp = NULL, *cp = NULL;
  ipcref_msg m;
  unsigned char *t = out; /* the copy that gets the tokens */
  int sv[2];
  size_t at, i;
  memset(&m, 0, sizeof m);
  if (ipcref_ctx_new(NULL, &cons) != IPCREF_OK ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0 ||
      ipcref_peer_new(blocks[kind].ctx, sv[0], &pp) != IPCREF_OK ||
      ipcref_peer_new(cons, sv[1], &cp) != IPCREF_OK ||
      ipcref_export(pp, v, &m) != IPCREF_OK)
    fail("seed export");
  at = view_at(&m);
  memcpy(t, m.bytes, m.len);
  *len = m.len;
  for (i = 0; i < (size_t)le(m.bytes, 8, 2); i++) {
    size_t f = HEAD_BYTES + 30 * i;
    int led = m.bytes[f] == 2;
    put_le(t, f + 2, PID_TOKEN, 4);
    put_le(t, f + 6, TOKEN | T_NONCE, 8);
    put_le(t, f + 14, TOKEN | (led ? T_LEDGER_ID : T_SEG_ID), 8);
    put_le(t, f + 22, TOKEN | (led ? T_LEDGER_SIZE : T_SEG_SIZE), 8);
  }
  put_le(t, 12, PID_TOKEN, 4);
  put_le(t, 16, TOKEN | T_NONCE, 8);
  put_le(t, at, PID_TOKEN, 4);
  put_le(t, at + 4, TOKEN | T_NONCE, 8);
  put_le(t, at + 12, TOKEN | T_SEG_ID, 8);
  put_le(t, at + 20, TOKEN | T_SEG_SIZE, 8);
  put_le(t, at + 28, TOKEN | T_BLOCK_OFF, 8);
  put_le(t, at + 36, TOKEN | T_BLOCK_SIZE, 8);
  put_le(t, at + 44, TOKEN | T_LEDGER_ID, 8);
  put_le(t, at + 52, TOKEN | T_LEASE1, 8);
  ipcref_msg_free(&m); /* it cancels the lease its own bytes name */
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
}

static void seed(const char *name, const unsigned char *b, size_t n) {
  ipcref_result rc;
  write_seed(seed_dir, name, b, n);
  rc = run_one(b, n);
  nseeds++;
  seeds_ok += rc == IPCREF_OK;
  printf("%-28s %4zu bytes: %s\n", name, n, ipcref_strerror(rc));
}

/* A raw-mode seed: flags, fd selectors (pairs), the message. */
static void raw_seed(const char *name, unsigned flags, const unsigned char *sel,
                     unsigned nsel, const unsigned char *msg, size_t len) {
  unsigned char b[4096];
  size_t n = 0;
  b[n++] = (unsigned char)flags;
  b[n++] = (unsigned char)nsel;
  if (nsel) memcpy(b + n, sel, 2 * (size_t)nsel);
  n += 2 * (size_t)nsel;
  memcpy(b + n, msg, len);
  seed(name, b, n + len);
}

/* A patch-mode seed with the genuine fds: flags | 8 | 16, then patches. */
static void patch_seed(const char *name, unsigned flags, int delta,
                       const unsigned char *patches, size_t plen) {
  unsigned char b[256];
  size_t n = 0;
  b[n++] = (unsigned char)(flags | 8 | 16);
  b[n++] = 0;
  b[n++] = (unsigned char)(int8_t)delta;
  if (plen) memcpy(b + n, patches, plen);
  seed(name, b, n + plen);
}

/* Device seeds: the genuine message of block 0 (its segment record, then
 * its ledger's, then its view: a 2048-byte U8 vector) with the segment
 * record replaced by a device one, and the view moved into it. */
#define DEV_SEG_ID 0xd1
#define DEV_HUGE   ((uint64_t)1 << 40)

typedef struct dev_seed {
  const char *name;
  int kind; /* 3 (handle), 4 (fd), 5 (pool: fd and data), 6 (two chunks) */
  uint32_t type, id;    /* the record's device */
  int writable;         /* the record's (and the view's) */
  uint64_t size;        /* the record's */
  uint64_t alloc;       /* kinds 3, 5: the size the handle opens (0: one
                           without the mock's marker) */
  int skew;             /* kind 3: the driver gives an inner address */
  uint64_t off, bsize;  /* the view's block */
  int event;            /* the view carries an event */
  unsigned char fd_sel; /* kinds 4, 5: its fd (FD_NONE and no fd: fd_none) */
  unsigned char fd_c;
  int no_fd; /* kinds 4, 5: the message lacks that fd */
} dev_seed;

/* The bytes of `d` (raw mode) after block 0's templated message `t`. */
static void dev_seed_write(const dev_seed *d, const unsigned char *t,
                           size_t tlen) {
  unsigned char msg[4096], sel[8];
  size_t n = 0, view = HEAD_BYTES + 60, vlen = tlen - view;
  unsigned nsel = 0;
  memcpy(msg, t, HEAD_BYTES);
  n = HEAD_BYTES;
  msg[n++] = (unsigned char)d->kind;
  msg[n++] = (unsigned char)d->writable;
  put_le(msg, n, PID_TOKEN, 4);
  put_le(msg, n + 4, TOKEN | T_NONCE, 8);
  put_le(msg, n + 12, DEV_SEG_ID, 8);
  put_le(msg, n + 20, d->size, 8);
  put_le(msg, n + 28, d->type, 4);
  put_le(msg, n + 32, d->id, 4);
  n += 36;
  if (d->kind == 6) { /* two chunks, halves of the size */
    put_le(msg, n, 2, 4);
    put_le(msg, n + 4, d->size / 2, 8);
    put_le(msg, n + 12, d->size - d->size / 2, 8);
    n += 20;
  } else if (d->kind != 4) { /* 3: the handle; 5: the pool pointer's data */
    memset(msg + n, 0, IPCREF_HANDLE_BYTES);
    if (d->alloc) {
      memcpy(msg + n, MOCK_MARKER, 8);
      put_le(msg, n + 8, d->alloc, 8);
      msg[n + 16] = (unsigned char)d->skew;
    }
    n += IPCREF_HANDLE_BYTES;
  }
  memcpy(msg + n, t + HEAD_BYTES + 30, 30); /* the ledger's record */
  n += 30;
  memcpy(msg + n, t + view, vlen);
  put_le(msg, n + 12, DEV_SEG_ID, 8);
  put_le(msg, n + 20, d->size, 8);
  put_le(msg, n + 28, d->off, 8);
  put_le(msg, n + 36, d->bsize, 8);
  msg[n + 62] = (unsigned char)d->writable;
  msg[n + 63] = (unsigned char)d->event;
  n += vlen;
  if (d->event) {
    memset(msg + n, 0xe7, IPCREF_HANDLE_BYTES);
    n += IPCREF_HANDLE_BYTES;
  }
  if (d->kind != 3 && !d->no_fd) {
    sel[2 * nsel] = d->fd_sel;
    sel[2 * nsel++ + 1] = d->fd_c;
  }
  if (d->kind == 6 && !d->no_fd) { /* the second chunk's: the same kind */
    sel[2 * nsel] = d->fd_sel;
    sel[2 * nsel++ + 1] = d->fd_c;
  }
  sel[2 * nsel] = FD_LEDGER;
  sel[2 * nsel++ + 1] = 0;
  sel[2 * nsel] = FD_SOCKET;
  sel[2 * nsel++ + 1] = 1;
  raw_seed(d->name, 0, sel, nsel, msg, n);
}

static void dev_seeds(void) {
  enum { C = IPCREF_DEVICE_CUDA, R = IPCREF_DEVICE_ROCM };
  const uint64_t P = (uint64_t)PTRDIFF_MAX;
  const unsigned char S = FD_SEALED | 5 << 4; /* a 4096-byte memfd */
  static const dev_seed seeds[] = {
      /* name, kind, type, id, writable, size, alloc, skew, off, bsize,
       * event, fd, content, no fd */
      {"dev_handle_ok", 3, C, 0, 0, 4096, 4096, 0, 1024, 2048, 0, 0, 0, 0},
      {"dev_handle_dev3_writable", 3, C, 3, 1, 4096, 8192, 0, 0, 4096, 0, 0, 0,
       0},
      {"dev_handle_event", 3, C, 0, 0, 4096, 4096, 0, 2048, 2048, 1, 0, 0, 0},
      {"dev_handle_alloc_small", 3, C, 0, 0, 8192, 4096, 0, 4096, 2048, 0, 0, 0,
       0},
      {"dev_handle_inner_addr", 3, C, 0, 0, 4096, 4096, 1, 2048, 2048, 0, 0, 0,
       0},
      {"dev_handle_no_marker", 3, C, 0, 0, 4096, 0, 0, 0, 2048, 0, 0, 0, 0},
      {"dev_handle_block_past", 3, C, 0, 0, 4096, 4096, 0, 3072, 2048, 0, 0, 0,
       0},
      {"dev_handle_block_wraps", 3, C, 0, 0, 4096, 4096, 0, ~(uint64_t)1023,
       2048, 0, 0, 0, 0},
      {"dev_handle_size0", 3, C, 0, 0, 0, 4096, 0, 0, 2048, 0, 0, 0, 0},
      {"dev_handle_huge", 3, C, 0, 0, DEV_HUGE, 4096, 0, 0, 2048, 0, 0, 0, 0},
      {"dev_handle_over_ptrdiff", 3, C, 0, 0, P + 1, 4096, 0, 0, 2048, 0, 0, 0,
       0},
      {"dev_handle_negative_dev", 3, C, 0xffffffffu, 0, 4096, 4096, 0, 0, 2048,
       0, 0, 0, 0},
      {"dev_handle_rocm", 3, R, 0, 0, 4096, 4096, 0, 0, 2048, 0, 0, 0, 0},
      {"dev_handle_cpu", 3, IPCREF_DEVICE_CPU, 0, 0, 4096, 4096, 0, 0, 2048, 0,
       0, 0, 0},
      {"dev_fd_memfd_ok", 4, C, 0, 0, 4096, 0, 0, 1024, 2048, 0, S, 0, 0},
      {"dev_fd_unsealed_ok", 4, C, 1, 0, 8192, 0, 0, 0, 8192, 0,
       FD_UNSEALED | 6 << 4, 3, 0},
      {"dev_fd_writable", 4, C, 0, 1, 4096, 0, 0, 2048, 2048, 0, S, 0, 0},
      {"dev_fd_event", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 1, S, 0, 0},
      {"dev_fd_block_past", 4, C, 0, 0, 4096, 0, 0, 2049, 2048, 0, S, 0, 0},
      {"dev_fd_size0", 4, C, 0, 0, 0, 0, 0, 0, 2048, 0, S, 0, 0},
      {"dev_fd_size1", 4, C, 0, 0, 1, 0, 0, 0, 1, 0, S, 0, 0},
      {"dev_fd_over_mock_max", 4, C, 0, 0, MOCK_MAX + 1, 0, 0, 0, 2048, 0, S, 0,
       0},
      {"dev_fd_huge", 4, C, 0, 0, DEV_HUGE, 0, 0, 0, 2048, 0, S, 0, 0},
      {"dev_fd_ptrdiff_max", 4, C, 0, 0, P, 0, 0, 0, 2048, 0, S, 0, 0},
      {"dev_fd_over_ptrdiff", 4, C, 0, 0, P + 1, 0, 0, 0, 2048, 0, S, 0, 0},
      {"dev_fd_negative_dev", 4, C, 0x80000000u, 0, 4096, 0, 0, 0, 2048, 0, S,
       0, 0},
      {"dev_fd_rocm", 4, R, 0, 0, 4096, 0, 0, 0, 2048, 0, S, 0, 0},
      {"dev_fd_pipe", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0, FD_PIPE, 0, 0},
      {"dev_fd_regular", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0,
       FD_REGULAR | 5 << 4, 0, 0},
      {"dev_fd_socket", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0, FD_SOCKET, 1, 0},
      {"dev_fd_devnull", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0, FD_DEVNULL, 0, 0},
      {"dev_fd_eventfd", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0, FD_EVENTFD, 0, 0},
      {"dev_fd_segment", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0, FD_SEG, 0, 0},
      {"dev_fd_ledger", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0, FD_LEDGER, 0, 0},
      {"dev_fd_missing", 4, C, 0, 0, 4096, 0, 0, 0, 2048, 0, S, 0, 1},
      /* its fd slot -1: once taken for a kind 3 record */
      {"dev_fd_none", 4, C, 0, 0, 4096, 0, 0, 1024, 2048, 0, FD_NONE, 0, 0},
      /* pool memory: a pool's fd and a pointer's data (the marker) */
      {"dev_pool_ok", 5, C, 0, 0, 4096, 4096, 0, 1024, 2048, 0, S, 0, 0},
      {"dev_pool_writable", 5, C, 0, 1, 4096, 4096, 0, 0, 4096, 0, S, 0, 0},
      {"dev_pool_no_marker", 5, C, 0, 0, 4096, 0, 0, 0, 2048, 0, S, 0, 0},
      {"dev_pool_block_past", 5, C, 0, 0, 4096, 4096, 0, 3072, 2048, 0, S, 0,
       0},
      {"dev_pool_size0", 5, C, 0, 0, 0, 4096, 0, 0, 2048, 0, S, 0, 0},
      {"dev_pool_pipe", 5, C, 0, 0, 4096, 4096, 0, 0, 2048, 0, FD_PIPE, 0, 0},
      {"dev_pool_none", 5, C, 0, 0, 4096, 4096, 0, 0, 2048, 0, FD_NONE, 0, 0},
      {"dev_pool_missing", 5, C, 0, 0, 4096, 4096, 0, 0, 2048, 0, S, 0, 1},
      /* VMM chunks: two, an fd each (4096-byte memfds, 8192 in all) */
      {"dev_chunks_ok", 6, C, 0, 0, 8192, 0, 0, 3072, 2048, 0, S, 0, 0},
      {"dev_chunks_block_past", 6, C, 0, 0, 8192, 0, 0, 7168, 2048, 0, S, 0, 0},
      {"dev_chunks_pipe", 6, C, 0, 0, 8192, 0, 0, 0, 2048, 0, FD_PIPE, 0, 0},
      {"dev_chunks_missing", 6, C, 0, 0, 8192, 0, 0, 0, 2048, 0, S, 0, 1},
  };
  unsigned char t[4096];
  size_t len;
  unsigned i;
  templated(&blocks[0].v, 0, t, &len);
  for (i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
    dev_seed_write(&seeds[i], t, len);
  /* Both kinds in one batch: a segment by handle (lease 1's view) and one
   * by fd (lease 2's), the second record naming the first's id too. */
  {
    static const unsigned char sel[6] = {FD_SEALED | 6 << 4, 0, FD_LEDGER, 0,
                                         FD_SOCKET,          1};
    unsigned char msg[4096];
    size_t n = HEAD_BYTES, view = HEAD_BYTES + 60, vlen = len - view, k;
    memcpy(msg, t, HEAD_BYTES);
    put_le(msg, 6, 2, 2); /* nviews */
    put_le(msg, 8, 3, 2); /* nrecs */
    for (k = 0; k < 2; k++) {
      msg[n] = (unsigned char)(3 + k);
      msg[n + 1] = 0;
      put_le(msg, n + 2, PID_TOKEN, 4);
      put_le(msg, n + 6, TOKEN | T_NONCE, 8);
      put_le(msg, n + 14, DEV_SEG_ID + k, 8);
      put_le(msg, n + 22, 4096 * (k + 1), 8);
      put_le(msg, n + 30, IPCREF_DEVICE_CUDA, 4);
      put_le(msg, n + 34, (uint64_t)k, 4);
      n += 38;
      if (k == 0) {
        memset(msg + n, 0, IPCREF_HANDLE_BYTES);
        memcpy(msg + n, MOCK_MARKER, 8);
        put_le(msg, n + 8, 4096, 8);
        n += IPCREF_HANDLE_BYTES;
      }
    }
    memcpy(msg + n, t + HEAD_BYTES + 30, 30);
    n += 30;
    for (k = 0; k < 2; k++) {
      memcpy(msg + n, t + view, vlen);
      put_le(msg, n + 12, DEV_SEG_ID + k, 8);
      put_le(msg, n + 20, 4096 * (k + 1), 8);
      put_le(msg, n + 28, 2048 * k, 8);
      put_le(msg, n + 36, 2048 * (k + 1), 8);
      put_le(msg, n + 52, TOKEN | (k ? T_LEASE2 : T_LEASE1), 8);
      n += vlen;
    }
    raw_seed("dev_batch_handle_and_fd", 4, sel, 3, msg, n);
  }
}

int main(int argc, char **argv) {
  static const unsigned char genuine[6] = {FD_SEG, 0,         FD_LEDGER,
                                           0,      FD_SOCKET, 1};
  unsigned char msg[4096], two[8192];
  size_t len, len2;
  ipcref_view v, w;
  int64_t shape[4];
  int k;
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  seed_dir = argv[1];
  mkdir(seed_dir, 0755);
  setup();
  /* The genuine message of each block with the fds as exported; of the
   * pooled one with the fds named one by one, and patched (no patch). */
  for (k = 3; k >= 0; k--) {
    char name[64];
    templated(&blocks[k].v, k, msg, &len);
    snprintf(name, sizeof name, "valid_block%d", k);
    raw_seed(name, (unsigned)k | 16, NULL, 0, msg, len);
  }
  raw_seed("valid_block0_fds", 0, genuine, 3, msg, len);
  patch_seed("patch_none", 0, 0, NULL, 0);
  patch_seed("patch_capped_1", 32, 0, NULL, 0);
  patch_seed("patch_capped_2", 32 | 64, 0, NULL, 0);
  patch_seed("patch_capped_1_two_leases", 32 | 4, 0, NULL, 0);
  /* Geometries over the pooled block (2048 bytes). */
  shape[0] = 16;
  shape[1] = 32;
  if (ipcref_view_of(blocks[0].v.buf, IPCREF_F32, 2, shape, &v) != IPCREF_OK)
    fail("an f32 view");
  templated(&v, 0, msg, &len);
  raw_seed("geo_2d", 16, NULL, 0, msg, len);
  if (ipcref_view_transpose(&v, 0, 1, &w) != IPCREF_OK) fail("transpose");
  templated(&w, 0, msg, &len);
  raw_seed("geo_transposed", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  if (ipcref_view_slice(&v, 1, 3, 29, 3, &w) != IPCREF_OK) fail("slice");
  templated(&w, 0, msg, &len);
  raw_seed("geo_sliced", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  if (ipcref_view_flip(&v, 0, &w) != IPCREF_OK) fail("flip");
  templated(&w, 0, msg, &len);
  raw_seed("geo_flipped", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  if (ipcref_view_select(&v, 0, 7, &w) != IPCREF_OK) fail("select");
  templated(&w, 0, msg, &len);
  raw_seed("geo_row_offset", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  shape[0] = 4;
  shape[1] = 16;
  shape[2] = 32;
  {
    ipcref_view row;
    if (ipcref_view_select(&v, 0, 2, &row) != IPCREF_OK ||
        ipcref_view_expand(&row, 3, (int64_t[]){4, 1, 32}, &w) != IPCREF_OK)
      fail("expand");
    ipcref_view_release(&row);
  }
  templated(&w, 0, msg, &len);
  raw_seed("geo_broadcast", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  if (ipcref_view_narrow(&v, 1, 5, 0, &w) != IPCREF_OK) fail("narrow");
  templated(&w, 0, msg, &len);
  raw_seed("geo_empty", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  shape[0] = 2;
  shape[1] = 4;
  shape[2] = 8;
  shape[3] = 32;
  if (ipcref_view_reshape(&blocks[0].v, 4, shape, &w) != IPCREF_OK)
    fail("reshape 4");
  templated(&w, 0, msg, &len);
  raw_seed("geo_4d", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  if (ipcref_view_select(&v, 0, 3, &w) != IPCREF_OK ||
      ipcref_view_select(&w, 0, 5, &w) != IPCREF_OK)
    fail("scalar");
  templated(&w, 0, msg, &len);
  raw_seed("geo_scalar", 16, NULL, 0, msg, len);
  ipcref_view_release(&w);
  ipcref_view_release(&v);
  /* Two leases in one batch: the genuine message, then the second lease's
   * view record appended (with nviews 2). */
  templated(&blocks[0].v, 0, msg, &len);
  {
    size_t at = HEAD_BYTES + 2 * 30;
    memcpy(two, msg, len);
    memcpy(two + len, msg + at, len - at);
    put_le(two + len, 52, TOKEN | T_LEASE2, 8);
    len2 = len + (len - at);
    put_le(two, 6, 2, 2);
    raw_seed("batch_two_leases", 4 | 16, NULL, 0, two, len2);
    put_le(two + len, 52, TOKEN | T_LEASE1, 8);
    raw_seed("batch_same_lease_twice", 4 | 16, NULL, 0, two, len2);
  }
  /* Metadata: 16 bytes told truly, one byte more than there is, and the
   * most a message may carry with a byte over it. */
  templated(&blocks[0].v, 0, msg, &len);
  {
    static const size_t told[4] = {16, 17, IPCREF_META_MAX,
                                   IPCREF_META_MAX + 1};
    static const size_t given[4] = {16, 16, IPCREF_META_MAX,
                                    IPCREF_META_MAX + 1};
    static const char *names[4] = {"meta_16", "meta_len_lies", "meta_max",
                                   "meta_over_max"};
    for (k = 0; k < 4; k++) {
      memcpy(two, msg, len);
      memset(two + len, 0x5a, given[k]);
      put_le(two, 24, told[k], 2);
      raw_seed(names[k], 16, NULL, 0, two, len + given[k]);
    }
  }
  /* The genuine bytes with hostile fds. */
  {
    static const struct {
      const char *name;
      unsigned char sel[6];
      unsigned n;
    } fdseeds[] = {
        {"fd_unsealed_segment",
         {FD_UNSEALED | 7 << 4, 2, FD_LEDGER, 0, FD_SOCKET, 1},
         3},
        {"fd_sealed_small_segment",
         {FD_SEALED | 5 << 4, 2, FD_LEDGER, 0, FD_SOCKET, 1},
         3},
        {"fd_sealed_copy_segment",
         {FD_SEALED | 7 << 4, 2, FD_LEDGER, 0, FD_SOCKET, 1},
         3},
        {"fd_regular_segment",
         {FD_REGULAR | 7 << 4, 2, FD_LEDGER, 0, FD_SOCKET, 1},
         3},
        {"fd_pipe_segment", {FD_PIPE, 0, FD_LEDGER, 0, FD_SOCKET, 1}, 3},
        {"fd_socket_segment", {FD_SOCKET, 0, FD_LEDGER, 0, FD_SOCKET, 1}, 3},
        {"fd_wronly_segment",
         {FD_SEG_WRONLY, 0, FD_LEDGER, 0, FD_SOCKET, 1},
         3},
        {"fd_path_segment", {FD_SEG_PATH, 0, FD_LEDGER, 0, FD_SOCKET, 1}, 3},
        {"fd_eventfd_segment", {FD_EVENTFD, 0, FD_LEDGER, 0, FD_SOCKET, 1}, 3},
        {"fd_swapped", {FD_LEDGER, 0, FD_SEG, 0, FD_SOCKET, 1}, 3},
        {"fd_same_twice", {FD_SEG, 0, FD_SAME, 0, FD_SOCKET, 1}, 3},
        {"fd_missing", {FD_SEG, 0, 0, 0, 0, 0}, 1},
        {"fd_bell_missing", {FD_SEG, 0, FD_LEDGER, 0, 0, 0}, 2},
        {"fd_bell_stream", {FD_SEG, 0, FD_LEDGER, 0, FD_SOCKET, 0}, 3},
        {"fd_bell_pipe", {FD_SEG, 0, FD_LEDGER, 0, FD_PIPE, 0}, 3},
        {"fd_bell_devnull", {FD_SEG, 0, FD_LEDGER, 0, FD_DEVNULL, 0}, 3},
        {"fd_bell_ledger", {FD_SEG, 0, FD_LEDGER, 0, FD_SAME, 0}, 3},
        {"fd_ledger_copy_sealed",
         {FD_SEG, 0, FD_SEALED | 10 << 4, 1, FD_SOCKET, 1},
         3},
        {"fd_ledger_copy_flipped",
         {FD_SEG, 0, FD_SEALED | 10 << 4, 1 | 2 << 2, FD_SOCKET, 1},
         3},
        {"fd_ledger_copy_unsealed",
         {FD_SEG, 0, FD_UNSEALED | 10 << 4, 1, FD_SOCKET, 1},
         3},
        {"fd_ledger_copy_short",
         {FD_SEG, 0, FD_SEALED | 12 << 4, 1, FD_SOCKET, 1},
         3},
        {"fd_ledger_copy_ro_sealed",
         {FD_SEG, 0, FD_SEALED_RO | 10 << 4, 1, FD_SOCKET, 1},
         3},
        {"fd_ledger_readonly",
         {FD_SEG, 0, FD_LEDGER_RDONLY, 0, FD_SOCKET, 1},
         3},
        {"fd_ledger_none", {FD_SEG, 0, FD_NONE, 0, FD_SOCKET, 1}, 3},
    };
    unsigned i;
    templated(&blocks[0].v, 0, msg, &len);
    for (i = 0; i < sizeof fdseeds / sizeof fdseeds[0]; i++)
      raw_seed(fdseeds[i].name, 0, fdseeds[i].sel, fdseeds[i].n, msg, len);
  }
  /* The genuine message with one field patched (offsets of the first view
   * record: 26 + 2 * 30 = 86). */
  {
    static const unsigned char slot_past[] = {86 + 52, 0, 4, 0xff, 0xff, 0, 0};
    static const unsigned char gen_next[] = {86 + 56, 0, 1, 0x02};
    static const unsigned char block_past[] = {86 + 28, 0, 3, 0, 0, 0x10};
    static const unsigned char stride2[] = {86 + 80, 0, 1, 2};
    static const unsigned char offset_neg[] = {
        86 + 64, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char dtype_f64[] = {86 + 60, 0, 1, IPCREF_F64};
    static const unsigned char writable[] = {86 + 62, 0, 1, 1};
    patch_seed("patch_slot_past", 0, 0, slot_past, sizeof slot_past);
    patch_seed("patch_gen_next", 0, 0, gen_next, sizeof gen_next);
    patch_seed("patch_block_past", 0, 0, block_past, sizeof block_past);
    patch_seed("patch_stride2", 0, 0, stride2, sizeof stride2);
    patch_seed("patch_offset_negative", 0, 0, offset_neg, sizeof offset_neg);
    patch_seed("patch_dtype_f64", 0, 0, dtype_f64, sizeof dtype_f64);
    patch_seed("patch_writable_ro", 0, 0, writable, sizeof writable);
    patch_seed("patch_writable_rw", 1, 0, writable, sizeof writable);
    patch_seed("patch_truncated", 0, -9, NULL, 0);
  }
  dev_seeds();
  printf("%d seeds, %d import\n", nseeds, seeds_ok);
  return 0;
}
#endif
