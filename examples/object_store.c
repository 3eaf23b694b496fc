/* object_store: a distributed object store's reference counting with
 * ipcref_table, across processes, with zero-copy pulls.
 *
 * A store process (the parent) owns an ipcref_table and the objects' data:
 * each object is a shared buffer (ipcref_view_new_shared). Several worker
 * processes (forked) talk to it, each over two socketpairs of its own: a
 * control channel for requests and replies, and a data channel for an
 * ipcref_peer that carries the pulled views. Driven by a seeded PRNG, each
 * worker
 *   - puts arrays of blocks: the store allocates K blocks, fills each with
 *     a pattern derived from its id, creates their ids (ipcref_table_create)
 *     and an "array" object whose data lists them and which contains them
 *     (ipcref_table_put with the block ids): the worker gets a handle on
 *     every new id;
 *   - passes ids in messages to other workers through the store, which
 *     counts them while they are in flight (ipcref_table_msg_out), drops
 *     some of them (ipcref_table_msg_cancel), and lets go when the receiver
 *     acknowledges (ipcref_table_msg_in) after taking its own references
 *     (ipcref_table_incref) on the ids it wants;
 *   - pulls objects: the store sends the object's data with ipcref_send (a
 *     whole array and its blocks in one ipcref_send_batch), no copy, and
 *     pins the id with a table view (ipcref_table_view: the same memory,
 *     holding one table reference on the id); the worker often drops its
 *     handle on the id at once and keeps reading the view;
 *   - takes handles on blocks it finds in a pulled array (the pull keeps
 *     the array alive, the array keeps its blocks alive);
 *   - drops handles and pulled views in random order.
 * The store keeps each table view until the worker says it released its
 * copy: the worker's lease is back by then, so the table reference lives
 * exactly as long as some process may read the pulled bytes. (A table
 * view of a shared buffer can cross too, being an alias of the block, and
 * its table reference then lasts until the worker's lease comes back; this
 * store sends the block's own view instead, so that its hand-kept model
 * knows the exact call that frees each object.)
 *
 * The store recycles memory like a real one: the dealloc hook gives the
 * object's buffer back to a pool of free blocks (or releases it when the
 * pool is full), and the next object of that size reuses it. So an object
 * deallocated while somebody still reads it would show up as wrong bytes,
 * and the worker checks every byte of every pull twice: when it arrives
 * and just before it lets go.
 *
 * What is checked (any failure: exit 1):
 *   - every byte the workers read is right;
 *   - a model in the store counts every reference by hand (handles,
 *     messages, containers, pulls): each dealloc hook must find its object
 *     unreferenced (never early), and each object must be deallocated by
 *     the call that dropped its last reference (never late); after each
 *     request, ipcref_table_count of the ids it touched agrees;
 *   - the dealloc hook names the store the object was put in, once;
 *   - at the end: every worker exits 0, the table holds 0 ids, 0 objects
 *     and 0 messages, with 0 violations, every object was deallocated, and
 *     (after ipcref_collect) the sharing layer has nothing live.
 *
 * The second part, "the zero-copy pull case that used to return garbage",
 * runs first: one scripted worker pulls an object and drops its id, then
 * puts another object of the same size. Without the table's reference the
 * store deallocates the first object at once and would reuse its block for
 * the second, so that the worker's view (still mapped, still valid memory)
 * read the second object's bytes; ipcref refuses that reuse, since the
 * worker's lease makes the block not the store's alone (the store's
 * ipcref_view_data_mut says NULL), and the store takes a new block. With
 * ipcref_table_view the first object itself stays alive until the view
 * goes. Either way the worker reads the original.
 *
 *   cc -O2 -std=c11 -I. examples/object_store.c -o object_store -pthread
 *   ./object_store [--seed N] [--workers N] [--ops N] [all|store|pull-case]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define MAX_WORKERS 16
#define MAX_K       8     /* blocks per array */
#define MAX_MSG_IDS 4     /* ids per message between workers */
#define MAX_HELD    48    /* handles a worker holds at most */
#define MAX_PULLS   24    /* pulled views a worker keeps at most */
#define MAILBOX     64    /* messages waiting for one worker */
#define POOL_MAX    8     /* free blocks the store keeps per size */
#define STORE_ID    7     /* the store's number in the table */
#define TIMEOUT_MS  10000 /* a stuck process fails the run, never hangs it */

#define BLOCK_MAGIC 0xB10C0000B10C0000ull
#define ARRAY_MAGIC 0xA77A0000A77A0000ull

enum { KIND_BLOCK = 1, KIND_ARRAY = 2 };

/* ---- the data: what every object holds (both sides know it) ---- */

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint64_t rnd(uint64_t *s) {
  *s += 0x9E3779B97F4A7C15ull;
  return mix64(*s);
}

static uint32_t below(uint64_t *s, uint32_t n) {
  return (uint32_t)(rnd(s) % n);
}

/* A block of `size` bytes (a multiple of 8): word 0 names it, word 1 is its
 * size, the rest is a pattern of its id. So a block that holds another
 * object's bytes is caught by its first word already. */
static uint64_t block_word(ipcref_id id, uint64_t size, size_t j) {
  if (j == 0) return BLOCK_MAGIC ^ id;
  if (j == 1) return size;
  return mix64(id * 0x9E3779B97F4A7C15ull + j);
}

/* An array of k blocks: its name, k, and the k block ids. */
static size_t array_bytes(int k) {
  return (size_t)(2 + k) * 8;
}

static void fill_block(uint64_t *w, ipcref_id id, size_t size) {
  size_t j;
  for (j = 0; j < size / 8; j++) w[j] = block_word(id, size, j);
}

/* The number of bytes that differ between two words. */
static size_t bytes_differ(uint64_t got, uint64_t want) {
  uint64_t x = got ^ want;
  size_t n = 0;
  for (; x; x >>= 8) n += (x & 0xFF) != 0;
  return n;
}

static const uint64_t *view_words(const ipcref_view *v, size_t *size) {
  int64_t zero[1] = {0};
  if (!v->buf || v->dtype != IPCREF_U8 || v->ndim != 1 ||
      !ipcref_view_is_contiguous(v) || v->shape[0] < 16 || v->shape[0] % 8)
    return NULL;
  *size = (size_t)v->shape[0];
  return (const uint64_t *)ipcref_view_ptr(v, zero);
}

/* Wrong bytes in a pulled block view of `id`: every byte is compared (a
 * view of the wrong geometry counts as 1 wrong byte of 1 read). */
static size_t check_block(const ipcref_view *v, ipcref_id id, size_t *read) {
  size_t size, j, bad = 0;
  const uint64_t *w = view_words(v, &size);
  if (!w) return *read = 1;
  for (j = 0; j < size / 8; j++)
    bad += bytes_differ(w[j], block_word(id, size, j));
  *read = size;
  return bad;
}

/* Wrong bytes in a pulled array view of `id`: its name and count, and its
 * blocks' ids (made before it, increasing). The ids go to *ids. */
static size_t check_array(const ipcref_view *v, ipcref_id id, ipcref_id *ids,
                          int *k, size_t *read) {
  size_t size, bad = 0;
  const uint64_t *w = view_words(v, &size);
  int i;
  *k = 0;
  if (!w) return *read = 1;
  *read = size;
  bad += bytes_differ(w[0], ARRAY_MAGIC ^ id);
  if (w[1] < 1 || w[1] > MAX_K || array_bytes((int)w[1]) != size)
    return bad + 8;
  *k = (int)w[1];
  for (i = 0; i < *k; i++) {
    ids[i] = w[2 + i];
    if (ids[i] == 0 || ids[i] >= id || (i > 0 && ids[i] <= ids[i - 1]))
      bad += 8;
  }
  return bad;
}

/* ---- the protocol on the control channel (request, then its reply) ---- */

enum {
  REQ_PUT,    /* n blocks of `size` bytes, and (array) an array of them */
  REQ_INCREF, /* arg: id */
  REQ_DECREF, /* arg: id */
  REQ_SEND,   /* refs[n] to worker `to` */
  REQ_FETCH,  /* the next message for me, if any */
  REQ_ACK,    /* arg: the token of a fetched message; my references taken */
  REQ_PULL,   /* arg: id; (array) with all its blocks, in one batch */
  REQ_UNPULL, /* arg: pull number; my view of it is released */
  REQ_DONE    /* report: my results; nothing held any more */
};

typedef struct obj_ref {
  uint64_t id;
  int32_t kind;
  int32_t pad;
} obj_ref;

typedef struct report {
  uint64_t pulls, bytes_read, bad_bytes, errors, received, taken;
} report;

typedef struct request {
  int32_t kind;
  int32_t n;
  int32_t to;
  int32_t array;
  uint64_t size;
  uint64_t arg;
  obj_ref refs[MAX_MSG_IDS];
  report rep;
} request;

typedef struct reply {
  int32_t status; /* the table's (or the store's) result */
  int32_t n;      /* PUT: ids; FETCH: refs; PULL: views sent */
  int32_t alive;  /* DECREF, UNPULL: the object still lives afterwards */
  int32_t reused; /* PUT: the blocks came from the store's pool */
  uint64_t token; /* FETCH: the message's token; PULL: the first pull no. */
  uint64_t ids[MAX_K + 1];   /* PUT: blocks, then the array; PULL: sent ids */
  obj_ref refs[MAX_MSG_IDS]; /* FETCH */
} reply;

static int send_all(int fd, const void *m, size_t n) {
  ssize_t w;
  do w = send(fd, m, n, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)n ? 0 : -1;
}

/* 0: got one message; -1: error, time-out or the other side is gone. */
static int recv_all(int fd, void *m, size_t n) {
  struct pollfd pfd;
  ssize_t r;
  int k;
  pfd.fd = fd;
  pfd.events = POLLIN;
  do k = poll(&pfd, 1, TIMEOUT_MS);
  while (k < 0 && errno == EINTR);
  if (k != 1) return -1;
  do r = recv(fd, m, n, 0);
  while (r < 0 && errno == EINTR);
  return r == (ssize_t)n ? 0 : -1;
}

/* ---- the store ---- */

typedef struct object {
  ipcref_id id;
  int kind, dead;
  ipcref_view data; /* the store's own reference to the object's bytes */
  /* The model: every reference on the id, counted by hand. */
  uint32_t handles;   /* workers' handles */
  uint32_t msgs;      /* messages in flight that carry it */
  uint32_t contained; /* arrays that hold it */
  uint32_t pulls;     /* table views (pulls not yet released) */
  ipcref_id container;
  int n;
  ipcref_id contains[MAX_K];
} object;

typedef struct pull {
  int owner, live;
  ipcref_id id;
  ipcref_view pin; /* the table view (zeroed when not pinned) */
} pull;

typedef struct letter {
  uint64_t token;
  int n;
  obj_ref refs[MAX_MSG_IDS];
} letter;

typedef struct worker_slot {
  pid_t pid;
  int ctl, data; /* the control channel; the peer's socket */
  ipcref_peer *peer;
  int done;
  report rep;
  letter box[MAILBOX]; /* messages waiting for it */
  int head, count;
  letter fetched; /* handed over, not yet acknowledged */
  int has_fetched;
} worker_slot;

typedef struct pool_class {
  size_t size;
  int n;
  ipcref_view free[POOL_MAX];
} pool_class;

typedef struct store {
  ipcref_ctx *ctx;
  ipcref_table *table;
  int pin; /* pulls take a table view (0 only in the pull case's bad run) */
  uint64_t rng;
  object **objs; /* by id (ids are small and never reused) */
  size_t nobjs;
  pull *pulls; /* by pull number, from 1 */
  size_t npulls, pulls_cap;
  pool_class pool[32];
  int nclasses;
  worker_slot w[MAX_WORKERS];
  int nworkers;
  object *doomed[4096]; /* lost their last reference in this request */
  int ndoomed;
  /* what happened, for the summary */
  uint64_t created, blocks, arrays, deallocs, reused, released, still_read;
  uint64_t msgs, dropped, lost, full, views_sent, batches, requests, violations;
  uint64_t last_id;
  int failures;
  ipcref_table_stats tstats; /* at the end */
  ipcref_stats sstats;
} store;

static void fail(store *st, const char *what, ipcref_id id) {
  if (st->failures++ < 10)
    printf("  STORE CHECK FAILED: %s (id %llu)\n", what,
           (unsigned long long)id);
}

static object *obj_get(store *st, ipcref_id id) {
  return id < st->nobjs ? st->objs[id] : NULL;
}

/* The model's count of references that keep `o` alive: its container's
 * hold counts only while the container lives in the model. */
static uint32_t model_refs(store *st, const object *o) {
  uint32_t n = o->handles + o->msgs + o->pulls;
  if (o->contained) {
    object *c = obj_get(st, o->container);
    if (c && !c->dead && model_refs(st, c) > 0) n += o->contained;
  }
  return n;
}

/* After a reference on `o` went: when it was the last, `o` (and, for an
 * array, each block only it kept) must be deallocated before the request
 * ends. */
static void model_drop(store *st, object *o) {
  int i;
  if (model_refs(st, o) > 0) return;
  if (st->ndoomed < (int)(sizeof st->doomed / sizeof st->doomed[0]))
    st->doomed[st->ndoomed++] = o;
  for (i = 0; i < o->n; i++) {
    object *b = obj_get(st, o->contains[i]);
    if (b && !b->dead && model_refs(st, b) == 0) model_drop(st, b);
  }
}

/* The pool: blocks of the same size are reused. A block taken from it
 * must be ours alone (no table view, no other reference, no worker still
 * reading it: ipcref says so by refusing to make it writable). */
static pool_class *pool_of(store *st, size_t size) {
  int i;
  for (i = 0; i < st->nclasses; i++)
    if (st->pool[i].size == size) return &st->pool[i];
  if (st->nclasses == (int)(sizeof st->pool / sizeof st->pool[0])) return NULL;
  st->pool[st->nclasses].size = size;
  st->pool[st->nclasses].n = 0;
  return &st->pool[st->nclasses++];
}

static ipcref_result data_new(store *st, size_t size, ipcref_view *out,
                              int *reused) {
  pool_class *pc = pool_of(st, size);
  int64_t shape[1];
  *reused = 0;
  if (pc && pc->n > 0) {
    *out = pc->free[--pc->n];
    if (ipcref_view_data_mut(out)) {
      st->reused++;
      *reused = 1;
      return IPCREF_OK;
    }
    /* A worker still reads it (a pull that took no table reference): it
     * goes, to the limbo until the worker lets go, and a new block comes. */
    st->still_read++;
    ipcref_view_release(out);
  }
  shape[0] = (int64_t)size;
  return ipcref_view_new_shared(st->ctx, IPCREF_U8, 1, shape, out);
}

static void data_free(store *st, ipcref_view *v) {
  pool_class *pc = pool_of(st, (size_t)v->shape[0]);
  if (pc && pc->n < POOL_MAX) {
    pc->free[pc->n++] = *v;
    memset(v, 0, sizeof *v);
  } else {
    ipcref_view_release(v); /* to the limbo while leased, else freed */
    st->released++;
  }
}

/* The table's hooks. The dealloc hook must find the object unreferenced in
 * the model, put in this store only, and alive; its data goes back to the
 * pool. */
static void on_dealloc(void *user, ipcref_id id, const uint32_t *stores,
                       size_t nstores) {
  store *st = (store *)user;
  object *o = obj_get(st, id);
  int i;
  if (!o || o->dead) {
    fail(st, "dealloc of an unknown or dead object", id);
    return;
  }
  if (nstores != 1 || stores[0] != STORE_ID)
    fail(st, "dealloc names the wrong stores", id);
  if (model_refs(st, o) != 0) fail(st, "dealloc while still referenced", id);
  o->dead = 1;
  st->deallocs++;
  for (i = 0; i < o->n; i++) { /* the blocks lose the array's hold */
    object *b = obj_get(st, o->contains[i]);
    if (b && b->contained) b->contained--;
  }
  data_free(st, &o->data);
}

static void on_violation(void *user, ipcref_id id, ipcref_result code,
                         const char *what) {
  store *st = (store *)user;
  st->violations++;
  if (st->violations <= 5)
    printf("  table violation on id %llu: %s (%s)\n", (unsigned long long)id,
           what, ipcref_strerror(code));
}

/* After each request: each object that lost its last reference is gone,
 * and the table's count of each id the request touched is the model's. */
static void check_after(store *st, const ipcref_id *ids, int n) {
  int i;
  for (i = 0; i < st->ndoomed; i++)
    if (!st->doomed[i]->dead)
      fail(st, "not deallocated after its last reference", st->doomed[i]->id);
  st->ndoomed = 0;
  for (i = 0; i < n; i++) {
    object *o = obj_get(st, ids[i]);
    uint64_t count = 0;
    ipcref_result r;
    if (!o) continue;
    r = ipcref_table_count(st->table, ids[i], &count);
    if (o->dead ? r != IPCREF_EDEAD
                : r != IPCREF_OK ||
                      count != o->handles + o->msgs + o->contained + o->pulls)
      fail(st, "ipcref_table_count differs from the model", ids[i]);
  }
}

static object *obj_new(store *st, int kind, size_t size, int *reused) {
  object *o = (object *)calloc(1, sizeof *o);
  ipcref_id id;
  if (!o) return NULL;
  if (ipcref_table_create(st->table, &id) != IPCREF_OK) {
    free(o);
    return NULL;
  }
  if (id <= st->last_id) fail(st, "ids must increase", id);
  st->last_id = id;
  if (id >= st->nobjs) {
    size_t cap = st->nobjs ? st->nobjs : 1024;
    object **grown;
    while (cap <= id) cap *= 2;
    grown = (object **)realloc(st->objs, cap * sizeof *grown);
    if (!grown) {
      free(o);
      return NULL;
    }
    memset(grown + st->nobjs, 0, (cap - st->nobjs) * sizeof *grown);
    st->objs = grown;
    st->nobjs = cap;
  }
  o->id = id;
  o->kind = kind;
  o->handles = 1; /* the creator's reference: handed to the worker */
  st->objs[id] = o;
  st->created++;
  if (data_new(st, size, &o->data, reused) != IPCREF_OK) {
    fail(st, "no shared memory for an object", id);
    return NULL;
  }
  return o;
}

/* PUT: n blocks, filled with their pattern and put in this store, and
 * (array) an array that contains them. The worker gets every new id. */
static void do_put(store *st, const request *q, reply *p) {
  object *blk[MAX_K], *arr;
  ipcref_id ids[MAX_K];
  int i, n = q->n, reused;
  if (n < 1 || n > MAX_K || q->size < 16 || q->size % 8 ||
      q->size > (1u << 20)) {
    p->status = IPCREF_EINVAL;
    return;
  }
  for (i = 0; i < n; i++) {
    if (!(blk[i] = obj_new(st, KIND_BLOCK, q->size, &reused))) {
      p->status = IPCREF_ENOMEM;
      return;
    }
    p->reused |= reused;
    fill_block((uint64_t *)ipcref_view_data_mut(&blk[i]->data), blk[i]->id,
               q->size);
    ids[i] = p->ids[i] = blk[i]->id;
    if (ipcref_table_put(st->table, ids[i], STORE_ID, NULL, 0) != IPCREF_OK)
      fail(st, "put of a block", ids[i]);
    st->blocks++;
  }
  p->n = n;
  if (q->array) {
    uint64_t *w;
    if (!(arr = obj_new(st, KIND_ARRAY, array_bytes(n), &reused))) {
      p->status = IPCREF_ENOMEM;
      return;
    }
    w = (uint64_t *)ipcref_view_data_mut(&arr->data);
    w[0] = ARRAY_MAGIC ^ arr->id;
    w[1] = (uint64_t)n;
    memcpy(w + 2, ids, (size_t)n * sizeof ids[0]);
    arr->n = n;
    memcpy(arr->contains, ids, sizeof ids);
    p->status = ipcref_table_put(st->table, arr->id, STORE_ID, ids, (size_t)n);
    if (p->status != IPCREF_OK) fail(st, "put of an array", arr->id);
    for (i = 0; i < n; i++) {
      blk[i]->contained++;
      blk[i]->container = arr->id;
    }
    p->ids[p->n++] = arr->id;
    st->arrays++;
  }
}

static void do_incref(store *st, const request *q, reply *p) {
  object *o = obj_get(st, q->arg);
  p->status = ipcref_table_incref(st->table, q->arg);
  if (p->status == IPCREF_OK && o) o->handles++;
  if (p->status != IPCREF_OK) fail(st, "incref refused", q->arg);
}

static void do_decref(store *st, const request *q, reply *p) {
  object *o = obj_get(st, q->arg);
  if (!o || o->dead || o->handles == 0) {
    fail(st, "decref of an id the workers hold no handle on", q->arg);
    p->status = IPCREF_EINVAL;
    return;
  }
  o->handles--;
  model_drop(st, o);
  p->status = ipcref_table_decref(st->table, q->arg);
  if (p->status != IPCREF_OK) fail(st, "decref refused", q->arg);
  p->alive = !o->dead;
}

/* Lets go of a message's ids: msg_in (delivered) or msg_cancel (dropped). */
static void letter_end(store *st, const letter *l, int delivered) {
  int i;
  ipcref_result r;
  for (i = 0; i < l->n; i++) {
    object *o = obj_get(st, l->refs[i].id);
    if (o) o->msgs--;
  }
  for (i = 0; i < l->n; i++) {
    object *o = obj_get(st, l->refs[i].id);
    if (o) model_drop(st, o);
  }
  r = delivered ? ipcref_table_msg_in(st->table, l->token)
                : ipcref_table_msg_cancel(st->table, l->token);
  if (r != IPCREF_OK) fail(st, "msg_in / msg_cancel refused", l->token);
  if (!delivered) st->dropped++;
}

static void do_send(store *st, const request *q, reply *p) {
  worker_slot *to;
  letter l;
  ipcref_id ids[MAX_MSG_IDS];
  int i;
  if (q->n < 1 || q->n > MAX_MSG_IDS || q->to < 0 || q->to >= st->nworkers) {
    p->status = IPCREF_EINVAL;
    return;
  }
  l.n = q->n;
  for (i = 0; i < q->n; i++) {
    l.refs[i] = q->refs[i];
    ids[i] = q->refs[i].id;
  }
  p->status = ipcref_table_msg_out(st->table, ids, (size_t)q->n, &l.token);
  if (p->status != IPCREF_OK) {
    fail(st, "msg_out refused", ids[0]);
    return;
  }
  for (i = 0; i < q->n; i++) {
    object *o = obj_get(st, ids[i]);
    if (o) o->msgs++;
  }
  st->msgs++;
  to = &st->w[q->to];
  if (to->done || to->count == MAILBOX) { /* nobody to take it: dropped */
    letter_end(st, &l, 0);
    st->full += !to->done;
  } else
    to->box[(to->head + to->count++) % MAILBOX] = l;
}

/* FETCH: the next message in my mailbox; the store drops one in six on
 * the way (a lost message: cancelled). */
static void do_fetch(store *st, worker_slot *me, reply *p) {
  if (me->has_fetched) {
    fail(st, "fetch before the last message was acknowledged", 0);
    p->status = IPCREF_EINVAL;
    return;
  }
  while (me->count > 0) {
    letter l = me->box[me->head];
    me->head = (me->head + 1) % MAILBOX;
    me->count--;
    if (below(&st->rng, 6) == 0) {
      letter_end(st, &l, 0);
      st->lost++;
      continue;
    }
    p->token = l.token;
    p->n = l.n;
    memcpy(p->refs, l.refs, sizeof l.refs);
    me->fetched = l;
    me->has_fetched = 1;
    return;
  }
  p->n = 0;
}

/* ACK: the receiver took its own references on the ids it wants from the
 * message it fetched: the message's hold goes (msg_in). */
static void do_ack(store *st, worker_slot *me, const request *q, reply *p,
                   ipcref_id *touched, int *ntouched) {
  int i;
  if (!me->has_fetched || me->fetched.token != q->arg) {
    fail(st, "ack of a message not fetched", q->arg);
    p->status = IPCREF_EINVAL;
    return;
  }
  me->has_fetched = 0;
  for (i = 0; i < me->fetched.n; i++)
    touched[(*ntouched)++] = me->fetched.refs[i].id;
  letter_end(st, &me->fetched, 1);
}

static ipcref_result pull_new(store *st, int owner, object *o, ipcref_view *out,
                              uint64_t *no) {
  pull *pl;
  ipcref_result r = IPCREF_OK;
  if (st->npulls + 1 >= st->pulls_cap) {
    size_t cap = st->pulls_cap ? st->pulls_cap * 2 : 4096;
    pull *grown = (pull *)realloc(st->pulls, cap * sizeof *grown);
    if (!grown) return IPCREF_ENOMEM;
    memset(grown + st->pulls_cap, 0, (cap - st->pulls_cap) * sizeof *grown);
    st->pulls = grown;
    st->pulls_cap = cap;
  }
  *no = ++st->npulls;
  pl = &st->pulls[*no];
  pl->owner = owner;
  pl->id = o->id;
  pl->live = 1;
  if (st->pin) {
    /* The table view: the block's bytes, holding a table reference on the
     * id for as long as the store keeps it, which is until the worker's
     * UNPULL: it pins the id on the worker's behalf while the block's own
     * view crosses. */
    r = ipcref_table_view(st->table, o->id, &o->data, &pl->pin);
    if (r == IPCREF_OK) o->pulls++;
  } /* else the bug: nothing tells the table about this pull */
  *out = o->data;
  return r;
}

/* PULL: the object's data (with an array: the array and all its blocks, in
 * one batch) goes to the worker's peer with no copy. */
static void do_pull(store *st, worker_slot *me, int owner, const request *q,
                    reply *p) {
  object *o = obj_get(st, q->arg), *list[MAX_K + 1];
  ipcref_view views[MAX_K + 1];
  int i, n = 1;
  uint64_t no;
  if (!o || o->dead || model_refs(st, o) == 0) {
    fail(st, "pull of an id nobody holds", q->arg);
    p->status = IPCREF_EINVAL;
    return;
  }
  list[0] = o;
  if (q->array && o->kind == KIND_ARRAY)
    for (i = 0; i < o->n; i++) list[n++] = obj_get(st, o->contains[i]);
  for (i = 0; i < n; i++) {
    p->status = pull_new(st, owner, list[i], &views[i], &no);
    if (p->status != IPCREF_OK) {
      fail(st, "ipcref_table_view refused", list[i]->id);
      return;
    }
    if (i == 0) p->token = no;
    p->ids[i] = list[i]->id;
  }
  p->n = n;
  p->status = n == 1 ? ipcref_send(me->peer, &views[0])
                     : ipcref_send_batch(me->peer, views, n);
  if (p->status != IPCREF_OK) fail(st, "ipcref_send of a pull", o->id);
  st->views_sent += (uint64_t)n;
  if (n > 1) st->batches++;
}

/* UNPULL: the worker released its view (its lease is back): the store
 * lets go of the table view, and with it of the table's reference. */
static void do_unpull(store *st, int owner, const request *q, reply *p) {
  pull *pl = q->arg <= st->npulls ? &st->pulls[q->arg] : NULL;
  object *o;
  if (!pl || !pl->live || pl->owner != owner) {
    fail(st, "unpull of an unknown pull", q->arg);
    p->status = IPCREF_EINVAL;
    return;
  }
  o = obj_get(st, pl->id);
  pl->live = 0;
  if (pl->pin.buf) {
    o->pulls--;
    model_drop(st, o);
    ipcref_view_release(&pl->pin); /* the table reference goes with it */
  }
  p->alive = !o->dead;
}

/* One request from worker `k`; returns 0 when the worker is finished. */
static int handle(store *st, int k) {
  worker_slot *me = &st->w[k];
  request q;
  reply p;
  ipcref_id touched[MAX_K + 1 + MAX_MSG_IDS];
  int i, nt = 0;
  if (recv_all(me->ctl, &q, sizeof q)) {
    printf("  worker %d went away without saying DONE\n", k);
    st->failures++;
    return 0;
  }
  memset(&p, 0, sizeof p);
  st->requests++;
  switch (q.kind) {
  case REQ_PUT: do_put(st, &q, &p); break;
  case REQ_INCREF: do_incref(st, &q, &p); break;
  case REQ_DECREF: do_decref(st, &q, &p); break;
  case REQ_SEND: do_send(st, &q, &p); break;
  case REQ_FETCH: do_fetch(st, me, &p); break;
  case REQ_ACK: do_ack(st, me, &q, &p, touched, &nt); break;
  case REQ_PULL: do_pull(st, me, k, &q, &p); break;
  case REQ_UNPULL: do_unpull(st, k, &q, &p); break;
  case REQ_DONE:
    me->done = 1;
    me->rep = q.rep;
    if (me->has_fetched) { /* fetched, never acknowledged: dropped */
      fail(st, "a fetched message was never acknowledged", me->fetched.token);
      letter_end(st, &me->fetched, 0);
      me->has_fetched = 0;
    }
    while (me->count > 0) { /* what still waits for it is dropped */
      letter_end(st, &me->box[me->head], 0);
      me->head = (me->head + 1) % MAILBOX;
      me->count--;
    }
    break;
  default: p.status = IPCREF_EINVAL; fail(st, "unknown request", 0);
  }
  /* The ids this request touched: their counts must match the model. */
  if (q.kind == REQ_PUT || q.kind == REQ_PULL)
    for (i = 0; i < p.n; i++) touched[nt++] = p.ids[i];
  if (q.kind == REQ_INCREF || q.kind == REQ_DECREF) touched[nt++] = q.arg;
  if (q.kind == REQ_SEND)
    for (i = 0; i < q.n && i < MAX_MSG_IDS; i++) touched[nt++] = q.refs[i].id;
  if (q.kind == REQ_UNPULL && q.arg <= st->npulls)
    touched[nt++] = st->pulls[q.arg].id;
  check_after(st, touched, nt);
  if (send_all(me->ctl, &p, sizeof p)) {
    printf("  could not reply to worker %d\n", k);
    st->failures++;
    return 0;
  }
  return !me->done;
}

/* The store's loop: requests from any worker, one at a time, until all
 * are done. */
static void serve(store *st) {
  struct pollfd pfd[MAX_WORKERS];
  int idx[MAX_WORKERS], i, n, live = st->nworkers;
  while (live > 0 && st->failures < 10) {
    for (i = n = 0; i < st->nworkers; i++)
      if (!st->w[i].done) {
        pfd[n].fd = st->w[i].ctl;
        pfd[n].events = POLLIN;
        idx[n++] = i;
      }
    i = poll(pfd, (nfds_t)n, TIMEOUT_MS);
    if (i < 0 && errno == EINTR) continue;
    if (i <= 0) {
      printf("  the workers went quiet\n");
      st->failures++;
      return;
    }
    for (i = 0; i < n; i++)
      if (pfd[i].revents && !handle(st, idx[i])) {
        st->w[idx[i]].done = 1;
        live--;
      }
  }
}

/* ---- a worker ---- */

typedef struct pulled {
  uint64_t no;
  obj_ref ref;
  ipcref_view v;
} pulled;

typedef struct worker {
  int me, nworkers, ctl;
  ipcref_ctx *ctx;
  ipcref_peer *peer;
  uint64_t rng;
  obj_ref held[MAX_HELD];
  int nheld;
  pulled pulls[MAX_PULLS];
  int npulls;
  report rep;
  int verbose; /* the pull case narrates */
} worker;

static int rpc(worker *w, request *q, reply *p) {
  if (send_all(w->ctl, q, sizeof *q) || recv_all(w->ctl, p, sizeof *p)) {
    fprintf(stderr, "worker %d: the store is gone\n", w->me);
    exit(1);
  }
  if (p->status != IPCREF_OK) {
    fprintf(stderr, "worker %d: request %d: %s\n", w->me, q->kind,
            ipcref_strerror((ipcref_result)p->status));
    w->rep.errors++;
  }
  return p->status;
}

static void hold(worker *w, uint64_t id, int kind) {
  w->held[w->nheld].id = id;
  w->held[w->nheld].kind = kind;
  w->held[w->nheld++].pad = 0;
}

/* Checks every byte of a pulled view: a wrong one is counted. */
static void verify(worker *w, const pulled *pl, const char *when) {
  size_t read, bad;
  ipcref_id ids[MAX_K];
  int k;
  if (pl->ref.kind == KIND_ARRAY)
    bad = check_array(&pl->v, pl->ref.id, ids, &k, &read);
  else
    bad = check_block(&pl->v, pl->ref.id, &read);
  w->rep.bytes_read += read;
  w->rep.bad_bytes += bad;
  if (bad && !w->verbose)
    fprintf(stderr, "worker %d: %zu of %zu bytes of id %llu wrong (%s)\n",
            w->me, bad, read, (unsigned long long)pl->ref.id, when);
}

static void op_put(worker *w, int n, size_t size, int array, reply *p) {
  request q;
  int i;
  memset(&q, 0, sizeof q);
  q.kind = REQ_PUT;
  q.n = n;
  q.size = size;
  q.array = array;
  if (rpc(w, &q, p)) return;
  for (i = 0; i < p->n; i++)
    hold(w, p->ids[i], array && i == p->n - 1 ? KIND_ARRAY : KIND_BLOCK);
}

/* INCREF, DECREF (arg: an id) or UNPULL (arg: a pull number). */
static reply op_ref(worker *w, int kind, uint64_t arg) {
  request q;
  reply p;
  memset(&q, 0, sizeof q);
  q.kind = kind;
  q.arg = arg;
  rpc(w, &q, &p);
  return p;
}

/* A handle on `id` (the caller knows it is alive). */
static void take(worker *w, uint64_t id, int kind) {
  if (op_ref(w, REQ_INCREF, id).status == IPCREF_OK) hold(w, id, kind);
}

/* Drops handle i (swapped with the last). */
static void drop(worker *w, int i) {
  uint64_t id = w->held[i].id;
  w->held[i] = w->held[--w->nheld];
  op_ref(w, REQ_DECREF, id);
}

/* Pulls held id i (with array: and its blocks); the views arrive on the
 * peer and are checked at once. */
static void op_pull(worker *w, obj_ref ref, int array) {
  request q;
  reply p;
  int i;
  memset(&q, 0, sizeof q);
  q.kind = REQ_PULL;
  q.arg = ref.id;
  q.array = array;
  if (rpc(w, &q, &p)) return;
  if (p.n < 1 || p.ids[0] != ref.id) w->rep.errors++;
  for (i = 0; i < p.n; i++) {
    pulled *pl = &w->pulls[w->npulls];
    ipcref_result r;
    memset(pl, 0, sizeof *pl);
    r = ipcref_recv(w->peer, &pl->v, TIMEOUT_MS);
    if (r != IPCREF_OK) {
      fprintf(stderr, "worker %d: ipcref_recv: %s\n", w->me,
              ipcref_strerror(r));
      exit(1);
    }
    pl->no = p.token + (uint64_t)i;
    pl->ref.id = p.ids[i];
    pl->ref.kind = i == 0 ? ref.kind : KIND_BLOCK;
    w->npulls++;
    w->rep.pulls++;
    verify(w, pl, "on arrival");
  }
  if (p.n > 1) { /* the batch's blocks are the array's */
    ipcref_id ids[MAX_K];
    size_t read;
    int k;
    pulled *a = &w->pulls[w->npulls - p.n];
    check_array(&a->v, a->ref.id, ids, &k, &read);
    if (k != p.n - 1 || memcmp(ids, p.ids + 1, (size_t)k * sizeof ids[0]))
      w->rep.bad_bytes++;
  }
}

/* Releases pulled view i (checked once more first), then tells the store.
 * Returns 1 when the object is still alive afterwards. */
static int unpull(worker *w, int i) {
  pulled pl = w->pulls[i];
  w->pulls[i] = w->pulls[--w->npulls];
  verify(w, &pl, "before release");
  ipcref_view_release(&pl.v); /* the lease goes back here */
  return op_ref(w, REQ_UNPULL, pl.no).alive;
}

static void op_send(worker *w) {
  request q;
  reply p;
  int i, n = 1 + (int)below(&w->rng, MAX_MSG_IDS);
  if (n > w->nheld) n = w->nheld;
  memset(&q, 0, sizeof q);
  q.kind = REQ_SEND;
  q.n = n;
  q.to = w->me; /* to another worker, if there is one */
  if (w->nworkers > 1)
    q.to = (w->me + 1 + (int)below(&w->rng, (uint32_t)w->nworkers - 1)) %
           w->nworkers;
  for (i = 0; i < n; i++) /* an id may travel twice in one message */
    q.refs[i] = w->held[below(&w->rng, (uint32_t)w->nheld)];
  if (rpc(w, &q, &p)) return;
  /* Half the time the sender lets go of what it sent at once: the message
   * keeps the ids alive on its way. */
  for (i = 0; i < n; i++)
    if (below(&w->rng, 2) == 0) {
      int j;
      for (j = 0; j < w->nheld; j++)
        if (w->held[j].id == q.refs[i].id) {
          drop(w, j);
          break;
        }
    }
}

/* Takes the next message (if any): a handle on each id it wants (three in
 * four), then the acknowledgement that lets the message's hold go. */
static void op_fetch(worker *w) {
  request q;
  reply p;
  int i;
  memset(&q, 0, sizeof q);
  q.kind = REQ_FETCH;
  if (rpc(w, &q, &p) || p.n == 0) return;
  w->rep.received++;
  for (i = 0; i < p.n; i++)
    if (w->nheld < MAX_HELD && below(&w->rng, 4) != 0) {
      take(w, p.refs[i].id, p.refs[i].kind); /* alive: the message holds it */
      w->rep.taken++;
    }
  memset(&q, 0, sizeof q);
  q.kind = REQ_ACK;
  q.arg = p.token;
  rpc(w, &q, &p);
}

/* A handle on a block found in a pulled array (alive: the pull holds the
 * array, the array holds its blocks). */
static void op_navigate(worker *w) {
  int i, k, start = (int)below(&w->rng, (uint32_t)w->npulls);
  ipcref_id ids[MAX_K];
  size_t read;
  for (i = 0; i < w->npulls; i++) {
    pulled *pl = &w->pulls[(start + i) % w->npulls];
    if (pl->ref.kind != KIND_ARRAY) continue;
    if (check_array(&pl->v, pl->ref.id, ids, &k, &read) || k == 0) return;
    take(w, ids[below(&w->rng, (uint32_t)k)], KIND_BLOCK);
    return;
  }
}

static const size_t g_sizes[] = {64, 512, 4096, 16384, 65536};

static int random_worker(worker *w, int ops) {
  request q;
  reply p;
  int op;
  for (op = 0; op < ops; op++) {
    uint32_t r = below(&w->rng, 100);
    if (r < 10 && w->nheld + MAX_K + 1 <= MAX_HELD) {
      op_put(w, 1 + (int)below(&w->rng, MAX_K),
             g_sizes[below(&w->rng, sizeof g_sizes / sizeof g_sizes[0])],
             below(&w->rng, 8) != 0, &p);
    } else if (r < 22 && w->nheld) {
      op_send(w);
    } else if (r < 38) {
      op_fetch(w);
    } else if (r < 55 && w->nheld && w->npulls + MAX_K + 1 <= MAX_PULLS) {
      int i = (int)below(&w->rng, (uint32_t)w->nheld);
      op_pull(w, w->held[i], below(&w->rng, 3) == 0);
      /* Half the time the id goes at once: the pulled view stays. */
      if (below(&w->rng, 2) == 0) drop(w, i);
    } else if (r < 62 && w->npulls && w->nheld < MAX_HELD) {
      op_navigate(w);
    } else if (r < 80 && w->nheld) {
      drop(w, (int)below(&w->rng, (uint32_t)w->nheld));
    } else if (w->npulls) {
      unpull(w, (int)below(&w->rng, (uint32_t)w->npulls));
    }
    if (op % 256 == 255) ipcref_collect(w->ctx);
  }
  /* Let go of everything, handles and views mixed, in random order. */
  while (w->nheld + w->npulls > 0) {
    if (below(&w->rng, (uint32_t)(w->nheld + w->npulls)) < (uint32_t)w->nheld)
      drop(w, (int)below(&w->rng, (uint32_t)w->nheld));
    else
      unpull(w, (int)below(&w->rng, (uint32_t)w->npulls));
  }
  ipcref_collect(w->ctx);
  {
    ipcref_stats ss;
    ipcref_ctx_stats(w->ctx, &ss);
    if (ss.imported_bufs) {
      fprintf(stderr, "worker %d: %zu imported buffers left\n", w->me,
              ss.imported_bufs);
      w->rep.errors++;
    }
  }
  memset(&q, 0, sizeof q);
  q.kind = REQ_DONE;
  q.rep = w->rep;
  rpc(w, &q, &p);
  return w->rep.bad_bytes || w->rep.errors ? 1 : 0;
}

/* ---- the zero-copy pull case that used to return garbage ---- */

#define CASE_SIZE 4096

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

/* The first word of a pulled block: the name of the object whose bytes it
 * holds (0 when it is not a block's name). */
static uint64_t block_name(const ipcref_view *v) {
  size_t size;
  const uint64_t *w = view_words(v, &size);
  return w && (w[0] & ~0xFFFFFFFFull) == (BLOCK_MAGIC & ~0xFFFFFFFFull)
             ? w[0] ^ BLOCK_MAGIC
             : 0;
}

/* One worker's script: pull X, drop the id, put Y of the same size, read
 * X's view again. X's bytes must still be there either way. With the pin,
 * X goes only when the view does. Without it X goes at once and its block
 * back to the pool, whose next put would write Y over what the worker
 * reads (the bug being shown); but the worker's lease keeps the block
 * from being the store's alone, so ipcref refuses to make it writable and
 * the store takes a new one. */
static int pull_case_worker(worker *w, int pin) {
  request q;
  reply p;
  ipcref_id x, y;
  size_t read, bad;
  int ok = 1, alive, garbage;

  op_put(w, 1, CASE_SIZE, 0, &p);
  x = p.ids[0];
  op_pull(w, w->held[0], 0);
  say("    worker pulls X (id %llu, %d bytes) and reads it: %s\n",
      (unsigned long long)x, CASE_SIZE, w->rep.bad_bytes ? "WRONG" : "correct");
  ok &= w->npulls == 1 && w->rep.bad_bytes == 0;

  alive = op_ref(w, REQ_DECREF, x).alive;
  w->nheld = 0;
  say("    worker drops its id on X, keeps the view: X is %s\n",
      alive ? "still alive (the pull holds a table reference)"
            : "deallocated, its block back in the store's pool");
  ok &= alive == pin;

  op_put(w, 1, CASE_SIZE, 0, &p);
  y = p.ids[0];
  say("    worker puts Y (id %llu, %d bytes): the store %s\n",
      (unsigned long long)y, CASE_SIZE,
      p.reused ? "reuses X's block for it"
      : pin    ? "allocates a new block"
               : "allocates a new block (ipcref will not let it write "
                 "X's:\n      the worker still reads it)");
  ok &= !p.reused;

  /* The view is still mapped (the worker's lease keeps the segment), so
   * reading it is safe either way: the question is whose bytes it holds. */
  bad = w->npulls ? check_block(&w->pulls[0].v, x, &read) : (read = 0, 1);
  garbage = bad && read && check_block(&w->pulls[0].v, y, &read) == 0;
  if (bad)
    say("    worker reads its view of X again: %zu of %zu bytes wrong; it "
        "names object %llu:\n      %s\n",
        bad, read, (unsigned long long)block_name(&w->pulls[0].v),
        garbage ? "every byte is Y's (garbage for X)" : "unknown data");
  else
    say("    worker reads its view of X again: all %zu bytes are X's\n", read);
  ok &= bad == 0;
  w->rep.bytes_read += read;

  if (w->npulls) alive = unpull(w, 0);
  if (pin) {
    say("    worker releases the view: %s\n",
        alive ? "X STILL ALIVE" : "only now is X deallocated");
    ok &= !alive;
    op_put(w, 1, CASE_SIZE, 0, &p);
    say("    the next put of that size: the store %s\n",
        p.reused ? "reuses X's block (nobody reads it any more)"
                 : "allocates a new block");
    ok &= p.reused;
    op_ref(w, REQ_DECREF, p.ids[0]);
  }
  op_ref(w, REQ_DECREF, y);
  memset(&q, 0, sizeof q);
  q.kind = REQ_DONE;
  rpc(w, &q, &p);
  return ok ? 0 : 1;
}

/* ---- running it: fork the workers, serve them, check the end ---- */

typedef struct run_cfg {
  int workers, ops, pin, pull_case;
  uint64_t seed;
} run_cfg;

static int worker_main(const run_cfg *cfg, int me, int ctl, int data) {
  worker w;
  ipcref_result r;
  int rc;
  memset(&w, 0, sizeof w);
  w.me = me;
  w.nworkers = cfg->workers;
  w.ctl = ctl;
  w.rng = cfg->seed * 1000003u + (uint64_t)me;
  w.verbose = cfg->pull_case;
  if ((r = ipcref_ctx_new(NULL, &w.ctx)) != IPCREF_OK ||
      (r = ipcref_peer_new(w.ctx, data, &w.peer)) != IPCREF_OK) {
    fprintf(stderr, "worker %d: setup: %s\n", me, ipcref_strerror(r));
    return 1;
  }
  rc = cfg->pull_case ? pull_case_worker(&w, cfg->pin)
                      : random_worker(&w, cfg->ops);
  ipcref_peer_free(w.peer);
  ipcref_ctx_free(w.ctx);
  return rc;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* When the store cannot go on: the first n workers are stopped. */
static int stop_workers(store *st, int n) {
  int i;
  for (i = 0; i < n; i++) {
    kill(st->w[i].pid, SIGKILL);
    waitpid(st->w[i].pid, NULL, 0);
  }
  return 1;
}

/* Forks the workers, runs the store until they are done, then checks that
 * nothing is left anywhere. Returns the number of failures. */
static int run(const run_cfg *cfg, store *st) {
  ipcref_table_hooks hooks;
  int i, k, status, failures = 0;
  ipcref_result r;

  memset(st, 0, sizeof *st);
  st->nworkers = cfg->workers;
  st->pin = cfg->pin;
  st->rng = cfg->seed ^ 0x5EED5EED5EEDull;
  fflush(stdout);
  for (i = 0; i < cfg->workers; i++) {
    int cv[2], dv[2];
    pid_t pid;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, cv) ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, dv)) {
      perror("socketpair");
      return stop_workers(st, i);
    }
    pid = fork();
    if (pid < 0) {
      perror("fork");
      return stop_workers(st, i);
    }
    if (pid == 0) {             /* a worker: its own ctx, made after the fork */
      for (k = 0; k < i; k++) { /* the store's ends for earlier workers */
        close(st->w[k].ctl);
        close(st->w[k].data);
      }
      close(cv[0]);
      close(dv[0]);
      _exit(worker_main(cfg, i, cv[1], dv[1]));
    }
    close(cv[1]);
    close(dv[1]);
    st->w[i].pid = pid;
    st->w[i].ctl = cv[0];
    st->w[i].data = dv[0];
  }

  hooks.dealloc = on_dealloc;
  hooks.violation = on_violation;
  hooks.user = st;
  if ((r = ipcref_ctx_new(NULL, &st->ctx)) != IPCREF_OK ||
      (r = ipcref_table_new(&hooks, &st->table)) != IPCREF_OK) {
    printf("  store: setup: %s\n", ipcref_strerror(r));
    return stop_workers(st, cfg->workers);
  }
  for (i = 0; i < cfg->workers; i++)
    if ((r = ipcref_peer_new(st->ctx, st->w[i].data, &st->w[i].peer)) !=
        IPCREF_OK) {
      printf("  store: ipcref_peer_new: %s\n", ipcref_strerror(r));
      return stop_workers(st, cfg->workers);
    }

  serve(st);

  /* The workers exit; the store must hold nothing any more. */
  for (i = 0; i < cfg->workers; i++) {
    if (st->failures) kill(st->w[i].pid, SIGKILL);
    ipcref_peer_free(st->w[i].peer);
    close(st->w[i].ctl);
    if (waitpid(st->w[i].pid, &status, 0) != st->w[i].pid ||
        !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      printf("  worker %d failed (status %d)\n", i, status);
      failures++;
    }
  }
  ipcref_table_get_stats(st->table, &st->tstats);
  if (st->tstats.ids || st->tstats.objects || st->tstats.messages ||
      st->tstats.violations || st->tstats.deallocs != st->created ||
      st->deallocs != st->created) {
    printf("  the table is not empty: %zu ids, %zu objects, %zu messages, "
           "%llu violations, %llu of %llu objects deallocated\n",
           st->tstats.ids, st->tstats.objects, st->tstats.messages,
           (unsigned long long)st->tstats.violations,
           (unsigned long long)st->tstats.deallocs,
           (unsigned long long)st->created);
    failures++;
  }
  for (i = 1; i < (int)st->nobjs; i++)
    if (st->objs[i] && !st->objs[i]->dead) {
      fail(st, "never deallocated", (ipcref_id)i);
      break;
    }
  for (i = 1; i <= (int)st->npulls; i++)
    if (st->pulls[i].live) {
      fail(st, "a pull never released", st->pulls[i].id);
      ipcref_view_release(&st->pulls[i].pin);
    }
  for (i = 0; i < st->nclasses; i++) /* the pool's free blocks go */
    while (st->pool[i].n > 0)
      ipcref_view_release(&st->pool[i].free[--st->pool[i].n]);
  ipcref_collect(st->ctx);
  ipcref_ctx_stats(st->ctx, &st->sstats);
  if (st->sstats.live_bufs || st->sstats.live_bytes ||
      st->sstats.limbo_blocks || st->sstats.live_slots) {
    printf("  the sharing layer still holds %zu buffers, %zu limbo blocks, "
           "%zu leases\n",
           st->sstats.live_bufs, st->sstats.limbo_blocks,
           st->sstats.live_slots);
    failures++;
  }
  ipcref_table_free(st->table);
  ipcref_ctx_free(st->ctx);
  for (i = 0; i < (int)st->nobjs; i++) free(st->objs[i]);
  free(st->objs);
  free(st->pulls);
  return failures + st->failures;
}

/* The zero-copy pull case, twice: without the table's reference, then with
 * ipcref_table_view. */
static int pull_case(uint64_t seed) {
  static store st; /* large: not on the stack */
  run_cfg cfg;
  int failures = 0, pin;
  printf("== the zero-copy pull case that used to return garbage ==\n"
         "The store recycles a deallocated object's block for the next "
         "object of its\nsize, once it is writable. A worker pulls X (zero "
         "copy), drops its id, and keeps\nreading.\n");
  for (pin = 0; pin <= 1; pin++) {
    int f;
    memset(&cfg, 0, sizeof cfg);
    cfg.workers = 1;
    cfg.pin = pin;
    cfg.pull_case = 1;
    cfg.seed = seed;
    printf("  %s\n", pin ? "with ipcref_table_view (the pull holds a table "
                           "reference on X):"
                         : "without it (the store sends its own view; the "
                           "table never hears of the pull):");
    f = run(&cfg, &st);
    if (f) printf("    FAILED (%d)\n", f);
    failures += f;
  }
  return failures;
}

static int store_run(const run_cfg *cfg) {
  static store st;
  uint64_t bytes = 0, bad = 0, pulls = 0, errors = 0, got = 0, taken = 0;
  double t0 = now_s();
  int i, failures;
  printf("== the store: %d workers x %d operations (seed %llu) ==\n",
         cfg->workers, cfg->ops, (unsigned long long)cfg->seed);
  failures = run(cfg, &st);
  for (i = 0; i < cfg->workers; i++) {
    bytes += st.w[i].rep.bytes_read;
    bad += st.w[i].rep.bad_bytes;
    pulls += st.w[i].rep.pulls;
    errors += st.w[i].rep.errors;
    got += st.w[i].rep.received;
    taken += st.w[i].rep.taken;
  }
  printf("  %llu requests; %llu objects put (%llu blocks, %llu arrays); of "
         "the deallocated\n  ones' buffers, %llu were reused from the pool, "
         "%llu released (pool full), %llu still read by a worker\n",
         (unsigned long long)st.requests, (unsigned long long)st.created,
         (unsigned long long)st.blocks, (unsigned long long)st.arrays,
         (unsigned long long)st.reused, (unsigned long long)st.released,
         (unsigned long long)st.still_read);
  printf("  %llu messages between workers: %llu delivered (%llu ids taken "
         "with incref, then msg_in),\n  %llu dropped with msg_cancel (%llu "
         "lost on the way, %llu to a full mailbox, %llu left\n  when their "
         "receiver finished)\n",
         (unsigned long long)st.msgs, (unsigned long long)got,
         (unsigned long long)taken, (unsigned long long)st.dropped,
         (unsigned long long)st.lost, (unsigned long long)st.full,
         (unsigned long long)(st.dropped - st.lost - st.full));
  printf("  %llu views pulled (%llu batches), every byte checked twice: "
         "%llu bytes read, %llu wrong\n",
         (unsigned long long)st.views_sent, (unsigned long long)st.batches,
         (unsigned long long)bytes, (unsigned long long)bad);
  printf("  table at the end: %zu ids, %zu objects, %zu messages, %llu "
         "violations, %llu deallocs\n",
         st.tstats.ids, st.tstats.objects, st.tstats.messages,
         (unsigned long long)st.tstats.violations,
         (unsigned long long)st.tstats.deallocs);
  printf("  sharing at the end: %zu buffers, %zu bytes, %zu limbo blocks, "
         "%zu leases\n",
         st.sstats.live_bufs, st.sstats.live_bytes, st.sstats.limbo_blocks,
         st.sstats.live_slots);
  if (pulls != st.views_sent || bad || errors) failures++;
  if (got + st.dropped != st.msgs) {
    printf("  messages: %llu delivered + %llu dropped != %llu sent\n",
           (unsigned long long)got, (unsigned long long)st.dropped,
           (unsigned long long)st.msgs);
    failures++;
  }
  printf("  %.2f s\n", now_s() - t0);
  return failures;
}

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--seed N] [--workers N] [--ops N] "
          "[all|store|pull-case]\n",
          argv0);
  return 2;
}

int main(int argc, char **argv) {
  run_cfg cfg;
  const char *mode = "all";
  int i, failures = 0;
  double t0 = now_s();
  memset(&cfg, 0, sizeof cfg);
  cfg.workers = 4;
  cfg.ops = 3000;
  cfg.pin = 1;
  cfg.seed = 1;
  for (i = 1; i < argc; i++) {
    char *end = NULL;
    if (i + 1 < argc && !strcmp(argv[i], "--seed"))
      cfg.seed = strtoull(argv[++i], &end, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--workers"))
      cfg.workers = (int)strtol(argv[++i], &end, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--ops"))
      cfg.ops = (int)strtol(argv[++i], &end, 10);
    else if (!strcmp(argv[i], "all") || !strcmp(argv[i], "store") ||
             !strcmp(argv[i], "pull-case"))
      mode = argv[i];
    else
      return usage(argv[0]);
    if (end && *end) return usage(argv[0]);
  }
  if (cfg.workers < 1 || cfg.workers > MAX_WORKERS || cfg.ops < 0)
    return usage(argv[0]);
  signal(SIGPIPE, SIG_IGN);
  if (strcmp(mode, "store")) failures += pull_case(cfg.seed);
  if (strcmp(mode, "pull-case")) failures += store_run(&cfg);
  if (failures) {
    printf("\nFAILED (%d)\n", failures);
    return 1;
  }
  printf("\nall checks passed (%.2f s)\n", now_s() - t0);
  return 0;
}
