/* The floor of the channel's protocol: W4's chan_spin hand-off (a 4 KiB
 * buffer the consumer reads two bytes of, the ack through shared memory)
 * with ipcref's shared-memory traffic and none of its code; and the floor
 * of a more compact protocol, to know what changing it would buy.
 *
 * Row ipcref_lines: what the library touches, in order, in the steady
 * state of bench/w4_handoff.c chan_spin (one reused buffer, a 4096-slot
 * ledger, the 64 KiB ring, a one-dimensional view whose message differs
 * from the last one's in its lease's slot: a patch record, 24 bytes in
 * one line of the ring; see src/share_channel.h):
 *
 *   producer  writes the buffer's first and last byte (the bench's
 *             "produce"); takes and drops a process-private mutex (the
 *             context's lock) around the lease, whose slot (16 bytes of
 *             the ledger, the next of 2048) was published 8 hand-offs
 *             before; copies the record into the ring, publishes its tail
 *             (release), then a seq-cst fence and a look at the
 *             receiver's sleep word (the doorbell's check); under the
 *             mutex again, publishes the slot 8 hand-offs ahead live (its
 *             generation word and holder); spins on the ack. Every 2048
 *             hand-offs, the sweep: it reads and clears the returned
 *             entries and frees their slots.
 *   consumer  spins on the tail (acquire), loading the due record's first
 *             word with it on each look (ipcref__chan_looks) and fetching
 *             the next lease's line (ipcref__chan_prefetch); copies the
 *             record out and stores its head (release); under its own
 *             mutex, reads the slot's word (the import's liveness check);
 *             reads the two bytes; returns the lease: a fetch_add on the
 *             ledger's ring position, the entry stored (release), a
 *             seq-cst fence and a look at the producer's `waiting`; stores
 *             the ack.
 *
 * Row ipcref_lines_compact: the same, but for a change to the protocol
 * that takes a cache line off the hand-off's path: the record carries its
 * own sequence word, written last, so the consumer spins on the record's
 * first line alone, no tail in a line of its own; and the lease returned
 * into a ring only this consumer writes (a store where a fetch_add was;
 * the fence and the look at `waiting` stay). Its slots are published 8
 * hand-offs ahead too, before the record rather than after it. (This row
 * first modelled publishing ahead as well, when the library published
 * each slot as its lease was taken, just before the record: that line
 * then crossed to the consumer again on the hand-off's path. The library
 * now publishes ahead, and ipcref_lines with it.)
 * Before patches, records were 136 bytes in three lines (ipcref_lines was
 * {136, 192}, and the compact row's records took two), and what follows
 * was measured so. Rows that take one change at a time (tried, not kept)
 * put nearly all of the gain in the first: the record's own sequence word
 * alone measured 0.15-0.17 us where ipcref_lines took 0.21-0.23. But that
 * change made in the library itself (the record's first word stored
 * last, the tail no longer written) was no faster in 6 alternating pairs
 * of chan_spin, and slower in 5.
 *
 * Taking one part of ipcref_lines away at a time (a copy of this program,
 * every variant in each round, c_shm_spin 0.12 us beside them, the fast
 * phase): all of it 0.22-0.23 us; without the prefetch of the next lease
 * 0.25-0.26 (it pays); without the look at the record's first word
 * 0.20-0.21; without the lease slot (neither written nor read) 0.20;
 * without the return 0.22; without the seq-cst fence 0.21-0.23; without
 * the slot, the return and the prefetch 0.16-0.19. In the slow phase
 * (c_shm_spin 0.47-0.48 us) ipcref_lines took 0.78-0.81, a one-line record
 * behind a tail 0.77-0.79, a one-line record with its own sequence word
 * 0.65. So the ring alone cost 1.4-1.9 times the bare spin, and the
 * library's code on top (send, receive and release: 0.17-0.18 us in
 * bench/maps.c) more than the bare spin's whole round trip.
 *
 * Where a chan_spin hand-off's time went, before patches, stamped with the
 * time-stamp counter at six points in a copy of the library and of
 * w4_handoff.c (the fast phase; the stamps add about 0.03 us to the
 * 0.37-0.39 us): the producer, from its start to the tail's store,
 * 0.12-0.13 us (the bench's two bytes and the send's checks 0.04, the
 * export under the context's lock 0.05, the copy into the ring 0.01); the
 * record reaching the spinning consumer 0.09-0.10 (one way of the bare
 * spin: 0.05-0.06); the consumer, from seeing the tail to its ack, 0.14
 * (the record copied out and checked 0.01, the import 0.07, the two bytes
 * read and the release 0.03); the ack back 0.04-0.05. Stamped with rdtscp
 * instead (which waits for the loads before it, and costs more here),
 * copying the record out took 0.04-0.05 us: its second and third lines
 * crossed only once its first line had said it was there, a round trip
 * the bare spin does not make. Hence patches: a message that differs
 * from the ring's last in a few bytes goes in one line, which crosses
 * with the tail. With patches chan_spin took 0.34-0.35 us where it took
 * 0.36-0.41 (18 alternating pairs in the fast phase; pair ratio 2.83-3.15
 * against 3.08-3.74), and 12-20% less in the slow phase (16 pairs of a
 * first version, whose pair ratio came to 1.98-2.20). Tried in the
 * library, not kept: taking lines 2 and 3 of the next record for writing
 * (prefetchw) once a record is out changed nothing in 6 alternating
 * pairs; the record's first word written last (its ring position in its
 * upper half, the rest of its first line stored just before it, the tail
 * still written after it), which a spinning receiver takes without
 * waiting for the tail, was 7% faster in the slow phase (14 pairs of 14)
 * and no faster in the fast one (8 pairs): with records of three lines,
 * it saved no round trip. The code (both sides together about 0.26 us of
 * each round trip, run at the speed of their own instructions) is now
 * most of what separates a hand-off from the bare spin's: a hand-off
 * within 2x of it needs a hot path of about half the instructions (2320
 * under callgrind, bench/maps.c).
 *
 * Then (alternating builds of the library in w4_2cpu chan_spin, the fast
 * phase): fewer instructions, the patch found by words and written into
 * its line in place and the context's lock a futex word (2304 a hand-off
 * under callgrind where 2519 were): 0.342 us where 0.371 (30 pairs; pair
 * ratio 2.90 against 3.13). Then the ledger's slots published 8 leases
 * ahead, once the record is out: 0.294 where 0.320 (19 pairs; 2.58
 * against 2.80), with 2369 instructions. From the first to the last of
 * these builds: 0.308 where 0.355, better in 24 pairs of 24 (pair ratio
 * 2.57 against 2.96). A copy of the library that neither wrote nor read a
 * lease's slot took 0.305 where 0.335: publishing ahead takes most of the
 * slot's line off the path. Published ahead but before the record (as
 * its lease is taken): 0.327 where 0.328, since that store holds the
 * record back until its line has crossed. In the model, publishing after
 * the record took 0.190 where publishing as the lease is taken took 0.200
 * (the slow phase: 0.66-0.68 against 0.75-0.77). Tried, not kept: the
 * producer taking the next slot's line for writing (prefetchw) at the
 * send's start: 0.333 against 0.327; loads instead of prefetches of the
 * lease's lines while spinning: no faster. Copies with no seq-cst fence
 * on either side, or with no lock at all, were no faster either: here
 * the atomic instructions cost no more than others; the lock's gain is
 * its instructions. What is left in the model: with the record's own
 * sequence word and no tail (the compact row's first change alone, its
 * slots published after the record) it took 0.140 us where ipcref_lines
 * took 0.180-0.190; with returns into the consumer's own ring alone,
 * 0.181-0.190, no faster. But in the library, a patch record's first
 * word written last with its ring position in it, taken by a spinning
 * receiver without the tail (which the sender still writes), was no
 * faster again: 0.304 us against 0.302 (18 pairs). The tail's line, the
 * sleep flag's protocol and the poll fd all read the tail; a ring
 * without one is a new layout, not a change to this one.
 * Three more looks at the hand-off's path, in copies (the fast phase):
 * the receiver prefetching the first and last line of each host view it
 * imports, once its record is checked, took 0.300 us where the library
 * took 0.309 (6 pairs, better in 1); a receiver that applied a patch to
 * the message it had decoded before (the lease's slot and generation
 * only), where the library decodes the patched message whole (about 200
 * instructions), 0.299 where 0.305 (14 pairs, better in 11): the
 * instructions on the receiver's side are not all on the path. And the
 * bare spin with a seq-cst fence between its producer's stores to the
 * buffer and its `posted` (the library's lock and counts drain the store
 * buffer so before its record) took 0.120-0.140 us where it took
 * 0.080-0.131 (6 pairs, about 0.01 more): that wait is no large part of
 * the gap either.
 * Then the code's part, cut from both sides at once in a copy (the fast
 * phase, 12 pairs): the send's checks (the views, the hello, the room,
 * the events) left out, its message not encoded but copied from the last
 * one with the lease's slot and generation written in, the receiver's
 * patched message not decoded again, and its spin's first clock read
 * put after 64 looks: 0.277 us where the library took 0.295 (pair ratio
 * 2.36 against 2.50, better in 12 of 12). Each alone was within the
 * noise (12 pairs each: 0.301 against 0.304 without the checks, 0.297
 * against 0.297 without the encoding as well, 0.305 against 0.307
 * without the clock read; and no `pause` between looks, 0.361 against
 * 0.358, though a `pause` takes 25 ns here). About 600 instructions
 * off the hand-off's path buy 6%: the rest of the gap is in what those
 * copies kept (the context's lock and the death check, the lease and
 * its return, the import's lookups and the view's allocation) and in
 * the protocol's lines.
 * Nor is the producer's work after its record on the path: stamped as
 * above (eight runs, 0.34-0.92 us a hand-off with the stamps), a send
 * returned before the consumer stored its ack in all but 0.007-0.036% of
 * hand-offs, by a median of 171-240 ns in the fast phase (436-466 in the
 * slow; a tenth of them by less than 146-210): the knock and the slots
 * published after the record finish long before the ack can come. What
 * separates a hand-off from the bare spin is the producer's work up to
 * its record (about 0.06 us beyond the bare spin's, whose stores wait for
 * the buffer's lines too) and the consumer's from the record to its ack
 * (about 0.11 us beyond: the record taken 0.03, the import 0.05, the
 * release 0.03).
 * And the consumer's import and release all but taken away: a copy whose
 * receiver, after the first record, decoded each record, gave its lease
 * straight back (the return ring's push, as a release makes it) and
 * handed out the first record's view again with one reference more (no
 * lookups, no checks, no allocation, no lock, no release callback) took
 * 0.250-0.260 us where the library took 0.281-0.310 (6 alternating pairs
 * of w4_2cpu chan_spin, faster in 6): pair ratio 2.17-2.27 against
 * 2.43-2.82. With the sender cut as well (after its first sends, no
 * views' checks, hello, room or events, and the record pushed into the
 * ring without the channel's other checks; the lease taken and the
 * message encoded as before), 0.221-0.230 us where the library took
 * 0.281-0.290 (3 pairs in the fast phase, faster in 3): pair ratio
 * 2.01-2.09 against 2.56-2.64. In the slow phase (bare spin 0.41-0.49 us)
 * the library's own pair ratio came to 1.63-1.89 there, that copy's to
 * 1.51-1.71 (9 pairs). So a hand-off within 2x of the bare spin in the
 * fast phase would take a send and a receive that do next to nothing but
 * what ipcref_lines models: with this protocol, the code has no room
 * left; a more compact one (ipcref_lines_compact) would give it about a
 * quarter of the bare spin's time more. Nor would a second, shorter
 * path through the import pay: a copy whose receiver, after the first
 * record, imported each single-view record by decoding it, checking only
 * its lease (in range, live at its generation, not imported before) and
 * making its buffer over the first record's segment and ledger (no lock,
 * no death check, no lookups, no other checks; the allocation, the
 * counts and the release as the library makes them) took 0.280-0.301 us
 * where the library took 0.290-0.320 (16 alternating pairs in the fast
 * phase: faster in 9, as fast in 6, slower in 1): pair ratio 2.32-2.53
 * against 2.43-2.80, about 3%.
 * Nor the release's two lines taken early: a copy whose receiver, once a
 * record's lease was found live, took the ledger's header line (the ring
 * position the release's fetch_add moves) and the return ring's next
 * entry for writing (prefetchw), so that the release would find both
 * its own, took 0.302 us where the library took 0.305 (12 alternating
 * pairs of w4_2cpu chan_spin in the fast phase: faster in 6, as fast in
 * 3, slower in 3; pair ratio 2.63 against 2.66 on average): whatever
 * the release waits for those lines is within this noise.
 *
 * So ipcref_lines is what a chan_spin hand-off would cost if the library's
 * own instructions took no time: compare it with the bare spin (c_shm_spin's
 * hand-off, one word each way) to see what the protocol's cache lines
 * cost, and ipcref_chan_spin's ratio to the same bare spin with its own to
 * see what the code adds; and ipcref_lines_compact with ipcref_lines, what
 * the changes above would save before any code. Both processes pinned to
 * two CPUs, as c_shm_spin and chan_spin are (skipped with one). Timed one
 * by one for SECONDS after 3 warm-ups, in blocks of PAIR_BLOCK hand-offs,
 * every other block the bare spin's (its own buffer and word, the same
 * ack), as w4_handoff.c pairs chan_spin: the row's median (n, mean, p99 as
 * extras), and a second line, metric=pair_ratio, the row's median over the
 * bare spin's (bare_us=), the two measured in the same second. Before the
 * pairing, a row and c_shm_spin were timed minutes apart, and a run that
 * caught this machine's slow phase in one and its fast phase in the other
 * said ipcref_lines took 5.2 times the bare spin and twice what chan_spin
 * took. Paired (10 runs of 1 s each, at this file's last change):
 * ipcref_lines 1.43-1.65 times its bare spin in the fast phase (bare
 * 0.11-0.12 us) and 1.37-1.59 in the slow one (0.44-0.48 us);
 * ipcref_lines_compact 1.25-1.37 and 1.27-1.34; chan_spin's own pair
 * ratio 2.4-2.6 in the fast phase of the same hour. Of the bare spin's
 * time again that the 2x goal allows on top of it, the protocol's lines
 * alone take 0.4-0.65, and the code adds 0.8-1.2 more. Printed for
 * workload ids w4 and w4_2cpu (each timed on its own: the two setups pin
 * the same way here).
 * Build: gcc -O2 -std=c11 -pthread lines.c -o lines
 * Run:   ./lines [SECONDS=1.0] */
#define _GNU_SOURCE /* sched_setaffinity, CPU_* */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define SIZE       4096
#define WARMUPS    3
#define MAX_N      50000000
#define SLOTS      2048  /* the producer's half of a 4096-slot ledger */
#define RING       65536 /* the channel's default ring */
#define MAX_RECORD 136
#define PAIR_BLOCK 4096 /* hand-offs per block of each kind (w4_handoff.c) */

/* A protocol: the row it prints and how its hand-off differs. */
typedef struct proto {
  const char *peer;
  int record;      /* bytes per record, a multiple of 8 */
  int stride;      /* bytes from one record to the next (divides RING, or
                      the record may wrap) */
  int seq_in_rec;  /* 1: the record's first word says it is there */
  uint64_t ahead;  /* slots published this many hand-offs ahead */
  int after;       /* 1: published once the record is out, under the
                      mutex again (else before the record) */
  int own_returns; /* 1: returns into a ring only this consumer writes */
  int looks;       /* 1: each look at the tail loads the due record's first
                      word too (ipcref__chan_looks) */
} proto;

static const proto g_protos[] = {
    {"ipcref_lines", 24, 64, 0, 8, 1, 0, 1},
    {"ipcref_lines_compact", 24, 64, 1, 8, 0, 1, 0},
};
static const proto *P;

/* The shared memory, in the library's files' proportions: the buffer, the
 * ring's header and ring, the receiver's control words, the ledger's
 * header, slots and return ring, and the ack. */
struct shared {
  _Alignas(64) unsigned char buf[SIZE];
  _Alignas(64) _Atomic uint64_t tail; /* the ring's header */
  _Alignas(64) unsigned char ring[RING];
  _Alignas(64) _Atomic uint64_t head; /* the receiver's control page */
  _Alignas(64) _Atomic uint32_t asleep;
  _Alignas(4096) _Atomic uint64_t ledger_head; /* the ledger's header */
  _Atomic uint64_t waiting;
  _Alignas(64) _Atomic uint64_t slots[2 * 2 * SLOTS];
  _Atomic uint64_t returns[2 * 2 * SLOTS];
  _Alignas(64) _Atomic uint64_t taken;   /* the ack */
  _Alignas(64) _Atomic uint64_t posted;  /* the bare spin's hand-offs */
  _Alignas(64) unsigned char bare[SIZE]; /* the bare spin's buffer */
};

static volatile unsigned g_sink;
static uint64_t g_pid; /* the holder a slot names */

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ __volatile__("pause");
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int g_cpu[2];

/* 1 when two CPUs are allowed (g_cpu: the first two). */
static int two_cpus(void) {
  cpu_set_t set;
  int i, k = 0;
  if (sched_getaffinity(0, sizeof set, &set)) return 0;
  for (i = 0; i < CPU_SETSIZE && k < 2; i++)
    if (CPU_ISSET(i, &set)) g_cpu[k++] = i;
  return k == 2;
}

static void pin(int which) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(g_cpu[which], &set);
  (void)sched_setaffinity(0, sizeof set, &set);
}

/* Copies bytes [from, P->record) of a record between `rec` and the ring
 * at byte `at`, where it may wrap: into the ring (`put`) or out of it. */
static void ring_copy(unsigned char *ring, uint64_t at, unsigned char *rec,
                      int from, int put) {
  size_t off = (size_t)((at + (uint64_t)from) % RING), first = RING - off;
  size_t n = (size_t)(P->record - from);
  if (first > n) first = n;
  if (put) {
    memcpy(ring + off, rec + from, first);
    memcpy(ring, rec + from + first, n - first);
  } else {
    memcpy(rec + from, ring + off, first);
    memcpy(rec + from + first, ring, n - first);
  }
}

/* The record's first word, where it says it is there (seq_in_rec). */
static _Atomic uint64_t *rec_seq(struct shared *s, uint64_t at) {
  return (_Atomic uint64_t *)(void *)(s->ring + at % RING);
}

/* A slot's word when live at hand-off k's generation. */
static uint64_t live_word(uint64_t k) {
  return (k + 1) << 2 | 1;
}

/* Hand-off number k (from 0) is the pair's, a bare spin's (c_shm_spin's
 * hand-off): every other block after the warm-ups. */
static int is_bare(uint64_t k) {
  return k >= WARMUPS && (k - WARMUPS) / PAIR_BLOCK % 2 == 1;
}

/* The bare spin's hand-off k, the consumer's side. */
static void bare_take(struct shared *s, uint64_t k) {
  while (atomic_load_explicit(&s->posted, memory_order_acquire) != k + 1)
    relax();
  if (s->bare[0] != (unsigned char)k || s->bare[SIZE - 1] != (unsigned char)k)
    _exit(3);
  atomic_store_explicit(&s->taken, k + 1, memory_order_release);
}

/* Until the producer's SIGKILL. Hand-off k is the protocol's j-th, or the
 * bare spin's. */
static _Noreturn void consumer(struct shared *s) {
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  unsigned char rec[MAX_RECORD];
  uint64_t at = 0, k, j = 0;
  for (k = 0;; k++) {
    uint64_t slot, word;
    /* Spinning, it fetches the coming lease's line, as the library does
     * (ipcref__chan_prefetch). */
    const void *next_lease = (const void *)&s->slots[2 * (j % SLOTS)];
    if (is_bare(k)) {
      bare_take(s, k);
      continue;
    }
    if (P->seq_in_rec) {
      while (atomic_load_explicit(rec_seq(s, at), memory_order_acquire) !=
             j + 1) {
        __builtin_prefetch(next_lease);
        relax();
      }
      ring_copy(s->ring, at, rec, 8, 0);
    } else {
      for (;;) {
        uint64_t tail = atomic_load_explicit(&s->tail, memory_order_acquire);
        if (P->looks) { /* loaded, whatever it says */
          uint64_t first;
          memcpy(&first, s->ring + at % RING, sizeof first);
          __asm__ __volatile__("" : : "r"(first));
        }
        if (tail != at) break;
        __builtin_prefetch(next_lease);
        relax();
      }
      ring_copy(s->ring, at, rec, 0, 0);
    }
    at += (uint64_t)P->stride;
    atomic_store_explicit(&s->head, at, memory_order_release);
    memcpy(&slot, rec + 8, sizeof slot);
    pthread_mutex_lock(&lock);
    word = atomic_load_explicit(&s->slots[2 * slot], memory_order_acquire);
    pthread_mutex_unlock(&lock);
    if (word != live_word(j)) _exit(3); /* live at its generation */
    g_sink += s->buf[0] + s->buf[SIZE - 1];
    {
      uint64_t e = (j + 1) << 32 | (slot + 1), pos = j;
      if (P->own_returns)
        atomic_store_explicit(&s->ledger_head, j + 1, memory_order_release);
      else
        pos =
            atomic_fetch_add_explicit(&s->ledger_head, 1, memory_order_release);
      atomic_store_explicit(&s->returns[pos % (2 * SLOTS)], e,
                            memory_order_release);
      atomic_thread_fence(memory_order_seq_cst);
      g_sink +=
          (unsigned)atomic_load_explicit(&s->waiting, memory_order_relaxed);
    }
    atomic_store_explicit(&s->taken, k + 1, memory_order_release);
    j++;
  }
}

/* The producer's sweep: what came back frees its slot, when the slot is
 * still at that lease's generation (not published ahead again). */
static void sweep(struct shared *s, uint64_t *drained) {
  uint64_t head = atomic_load_explicit(&s->ledger_head, memory_order_acquire);
  for (; *drained < head; (*drained)++) {
    _Atomic uint64_t *cell = &s->returns[*drained % (2 * SLOTS)];
    uint64_t e = atomic_load_explicit(cell, memory_order_acquire), slot;
    atomic_store_explicit(cell, 0, memory_order_relaxed);
    if (!e) continue;
    slot = (e & 0xffffffffu) - 1;
    if (atomic_load_explicit(&s->slots[2 * slot], memory_order_relaxed) ==
        live_word((e >> 32) - 1))
      atomic_store_explicit(&s->slots[2 * slot], (e >> 32) << 2,
                            memory_order_relaxed);
  }
}

/* Publishes hand-off k's lease live in its slot (k mod SLOTS). */
static void publish_lease(struct shared *s, uint64_t k) {
  uint64_t slot = k % SLOTS;
  atomic_store_explicit(&s->slots[2 * slot + 1], g_pid, memory_order_relaxed);
  atomic_store_explicit(&s->slots[2 * slot], live_word(k),
                        memory_order_release);
}

/* Hand-off number k (from 0), the protocol's i-th; its time in ns. */
static double handoff(struct shared *s, pthread_mutex_t *lock, uint64_t i,
                      uint64_t k, uint64_t *drained) {
  unsigned char rec[MAX_RECORD];
  uint64_t slot = i % SLOTS, at = i * (uint64_t)P->stride, j;
  double t0;
  s->buf[0] = s->buf[SIZE - 1] = (unsigned char)i; /* "produce" */
  t0 = now_ns();
  pthread_mutex_lock(lock);
  if (slot == 0 && i) sweep(s, drained); /* the free slots ran out */
  if (i == 0)
    for (j = 0; j < P->ahead; j++) publish_lease(s, j);
  if (!P->after) publish_lease(s, i + P->ahead);
  pthread_mutex_unlock(lock);
  memset(rec, 0x5a, sizeof rec);
  memcpy(rec + 8, &slot, sizeof slot);
  if (P->seq_in_rec) {
    ring_copy(s->ring, at, rec, 8, 1);
    atomic_store_explicit(rec_seq(s, at), i + 1, memory_order_release);
  } else {
    ring_copy(s->ring, at, rec, 0, 1);
    atomic_store_explicit(&s->tail, at + (uint64_t)P->stride,
                          memory_order_release);
  }
  atomic_thread_fence(memory_order_seq_cst);
  g_sink += atomic_load_explicit(&s->asleep, memory_order_relaxed);
  if (P->after) {
    pthread_mutex_lock(lock);
    publish_lease(s, i + P->ahead);
    pthread_mutex_unlock(lock);
  }
  while (atomic_load_explicit(&s->taken, memory_order_acquire) != k + 1)
    relax();
  return now_ns() - t0;
}

/* Hand-off number k as c_shm_spin makes it; its time in ns. */
static double bare_handoff(struct shared *s, uint64_t k) {
  double t0;
  s->bare[0] = s->bare[SIZE - 1] = (unsigned char)k; /* "produce" */
  t0 = now_ns();
  atomic_store_explicit(&s->posted, k + 1, memory_order_release);
  while (atomic_load_explicit(&s->taken, memory_order_acquire) != k + 1)
    relax();
  return now_ns() - t0;
}

/* Appends x to the n values at *v (capacity *cap): 0 when out of memory. */
static int push(double **v, uint64_t *n, uint64_t *cap, double x) {
  if (*n == *cap) {
    double *w = realloc(*v, 2 * *cap * sizeof *w);
    if (!w) return 0;
    *v = w;
    *cap *= 2;
  }
  (*v)[(*n)++] = x;
  return 1;
}

/* Times one row: SECONDS of hand-offs after the warm-ups, in blocks of
 * the protocol's and of the bare spin's in turn. */
static int row(const char *id, double secs) {
  struct shared *s;
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  uint64_t i, j, n = 0, nb = 0, cap = 1 << 16, capb = 1 << 16, drained = 0;
  double *v, *vb, total = 0, start, med, bare;
  pid_t child;
  int st, ok = 1;
  s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
           -1, 0);
  v = malloc(cap * sizeof *v);
  vb = malloc(capb * sizeof *vb);
  if (s == MAP_FAILED || !v || !vb) return 1;
  memset(s->buf, 1, SIZE);
  memset(s->bare, 1, SIZE);
  fflush(stdout);
  child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    pin(1);
    consumer(s);
  }
  pin(0);
  for (i = j = 0; i < WARMUPS; i++, j++)
    (void)handoff(s, &lock, j, i, &drained);
  start = now_ns();
  do {
    if (is_bare(i)) {
      ok = push(&vb, &nb, &capb, bare_handoff(s, i++));
    } else {
      double dt = handoff(s, &lock, j++, i++, &drained);
      ok = push(&v, &n, &cap, dt);
      total += dt;
    }
  } while (ok && (n < 5 || nb < 5 || now_ns() - start < secs * 1e9) &&
           i < MAX_N);
  kill(child, SIGKILL);
  waitpid(child, &st, 0);
  if (!ok) return 1;
  if (!WIFSIGNALED(st)) { /* it found a slot not live: exit 3 */
    printf("peer=%s workload=%s size=%d status=failed "
           "reason=consumer-exit-%d\n",
           P->peer, id, SIZE, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 1;
  }
  med = median(v, (int)n);
  bare = median(vb, (int)nb);
  printf("peer=%s workload=%s size=%d metric=us_per_handoff "
         "value=%.3f n=%llu mean=%.3f p99=%.3f pin=split\n",
         P->peer, id, SIZE, med / 1e3, (unsigned long long)n,
         total / (double)n / 1e3, v[(size_t)(0.99 * (double)(n - 1))] / 1e3);
  printf("peer=%s workload=%s size=%d metric=pair_ratio value=%.3f "
         "bare_us=%.3f n_bare=%llu\n",
         P->peer, id, SIZE, med / bare, bare / 1e3, (unsigned long long)nb);
  free(v);
  free(vb);
  munmap(s, sizeof *s);
  return 0;
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1.0;
  size_t k;
  int bad = 0, two = two_cpus(); /* before a row pins this process */
  g_pid = (uint64_t)getpid();
  for (k = 0; k < sizeof g_protos / sizeof *g_protos; k++) {
    P = &g_protos[k];
    if (!two) {
      printf("peer=%s workload=w4_2cpu size=%d status=skipped "
             "reason=needs-2-cpus\n",
             P->peer, SIZE);
      continue;
    }
    bad |= row("w4", secs);
    bad |= row("w4_2cpu", secs);
  }
  (void)g_sink;
  return bad;
}
