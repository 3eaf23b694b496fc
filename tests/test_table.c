/* The object table (src/table.h, src/table_ops.h), against its documentation.
 *
 *   test_model      a randomized model test: every call's result, and after
 *                   EVERY operation the table against a naive model (per id
 *                   a count, alias groups as explicit sets, contained lists,
 *                   stores, messages): the same objects deallocated at the
 *                   same moments, named by their first id with the union of
 *                   their stores; counts, stats and violations equal; at the
 *                   end everything dropped and every object freed once.
 *                   Misuse of every kind is among the operations (ids dead,
 *                   at zero or never handed out; references taken twice,
 *                   met later by a container's deallocation, a message's
 *                   end or a pull's end): the model names each breach the
 *                   hook must hear and stats.violations must count;
 *   test_chain      a 10^6-long containment chain freed by one decref in a
 *                   thread with a 256 KiB stack (no recursion);
 *   test_view_pull  ipcref_table_view: the zero-copy pull outlives the
 *                   worker's handle, is read-only, frees the object when it
 *                   goes, and survives ipcref_table_free;
 *   test_view_pull_in_place  ipcref_table_view(t, id, &v, &v): the
 *                   caller's reference to the source goes, nothing leaks;
 *   test_threads    8 threads on shared ids (incref/decref, messages passed
 *                   between threads, puts, aliases, pulls): no lost update,
 *                   every object freed once, never while held;
 *   test_args       wrong arguments to every function: the documented code,
 *                   nothing changed;
 *   test_semantics  small cases, one rule each (aliases, first id, stores,
 *                   spent messages, counts that would go below zero through
 *                   a container or a message, hooks calling back in);
 *   test_misuse_contained  a container deallocated while an id it holds is
 *                   dead or at zero (dropped too often elsewhere): reported
 *                   as decref reports it, once per reference, the rest
 *                   consistent;
 *   test_misuse_no_alloc  every path that meets a breach, with every
 *                   allocation failing: each told, nothing allocated;
 *   test_oom        every allocation made to fail in turn: an error changes
 *                   nothing, a success did everything (hooks told);
 *   test_free_alive ipcref_table_free with aliases, containers, messages and
 *                   a pull alive: no hook, nothing left.
 *
 * Environment: IPCREF_TEST_SEED (one seed instead of the fixed ones; the
 * seed is printed), IPCREF_TEST_OPS (model operations in all, 10^6 when
 * unset: a quarter per seed; a tenth per thread in
 * test_threads), IPCREF_UNDER_VALGRIND=1 (2*10^4 per seed, 10^4 per
 * thread; under TSan at most 10^5 per seed). Arguments: the names of the
 * tests to run (all when none). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The library's allocator: counts live blocks (atomically: the threads test
 * allocates from 8 threads) and can be told to fail the k-th allocation. */
static long ta_live;    /* blocks not yet freed */
static long ta_fail_in; /* > 0: the allocation that brings it to 0 fails */
static int ta_fail_all; /* every allocation fails (single-threaded tests) */
static long ta_failed;  /* ... and how many were tried */

static int ta_should_fail(void) {
  if (ta_fail_all) return (int)++ta_failed;
  if (__atomic_load_n(&ta_fail_in, __ATOMIC_RELAXED) <= 0) return 0;
  return __atomic_sub_fetch(&ta_fail_in, 1, __ATOMIC_RELAXED) == 0;
}
static void *ta_malloc(size_t n) {
  void *p;
  if (ta_should_fail()) return NULL;
  p = malloc(n);
  if (p) __atomic_add_fetch(&ta_live, 1, __ATOMIC_RELAXED);
  return p;
}
static void *ta_realloc(void *p, size_t n) {
  void *q;
  if (ta_should_fail()) return NULL;
  q = realloc(p, n);
  if (!p && q) __atomic_add_fetch(&ta_live, 1, __ATOMIC_RELAXED);
  return q;
}
static void ta_free(void *p) {
  if (p) __atomic_sub_fetch(&ta_live, 1, __ATOMIC_RELAXED);
  free(p);
}
void ipcref_quarantine_flush(void); /* ipcref.h, below */
static long ta_live_now(void) {
  ipcref_quarantine_flush(); /* freed contexts wait there a while */
  return __atomic_load_n(&ta_live, __ATOMIC_RELAXED);
}
#define IPCREF_MALLOC(n)     ta_malloc(n)
#define IPCREF_REALLOC(p, n) ta_realloc(p, n)
#define IPCREF_FREE(p)       ta_free(p)

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#include "harness.h"

static int under_valgrind;
static long opt_ops;
static long opt_seed = -1; /* -1: the fixed seeds */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64 */
typedef struct rng {
  uint64_t s;
} rng;
static uint64_t rng_next(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static size_t rng_below(rng *r, size_t n) {
  return n ? (size_t)(rng_next(r) % n) : 0;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}
static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}
/* Sorts and removes duplicates; the new length. */
static size_t set_u32(uint32_t *a, size_t n) {
  size_t i, k = 0;
  qsort(a, n, sizeof *a, cmp_u32);
  for (i = 0; i < n; i++)
    if (k == 0 || a[k - 1] != a[i]) a[k++] = a[i];
  return k;
}

/* A growable array of ids. */
typedef struct idvec {
  ipcref_id *v;
  size_t n, cap;
} idvec;
static void iv_push(idvec *a, ipcref_id x) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 4;
    a->v = (ipcref_id *)realloc(a->v, a->cap * sizeof *a->v);
    if (!a->v) abort();
  }
  a->v[a->n++] = x;
}
static void iv_free(idvec *a) {
  free(a->v);
  memset(a, 0, sizeof *a);
}

/* ======================================================================== */
/* What the hooks heard (single-threaded tests). */

#define MAX_STORES 64
typedef struct ev_dealloc {
  ipcref_id id;
  uint32_t stores[MAX_STORES];
  size_t nstores; /* as told (before removing duplicates) */
} ev_dealloc;
typedef struct ev_violation {
  ipcref_id id;
  ipcref_result code;
} ev_violation;

typedef struct recorder {
  ipcref_table *t; /* for the hooks' calls back into the table */
  ev_dealloc *d;
  size_t nd, capd;
  ev_violation *v;
  size_t nv, capv;
  int check_dead_in_hook; /* the dealloc hook asks count(id): EDEAD */
  long hook_count_wrong;  /* ... and it was not */
  int freed;              /* the table was freed: no hook may run */
  long late_calls;        /* hooks run after ipcref_table_free */
  /* optional: the dealloc hook also does this */
  void (*on_dealloc)(struct recorder *r, ipcref_id id);
  void *extra;
} recorder;

static void rec_dealloc(void *user, ipcref_id id, const uint32_t *stores,
                        size_t nstores) {
  recorder *r = (recorder *)user;
  ev_dealloc *e;
  if (r->freed) {
    r->late_calls++;
    return;
  }
  if (r->nd == r->capd) {
    r->capd = r->capd ? r->capd * 2 : 64;
    r->d = (ev_dealloc *)realloc(r->d, r->capd * sizeof *r->d);
    if (!r->d) abort();
  }
  e = &r->d[r->nd++];
  e->id = id;
  e->nstores = nstores;
  if (nstores > MAX_STORES) nstores = MAX_STORES;
  if (nstores) memcpy(e->stores, stores, nstores * sizeof *stores);
  if (r->check_dead_in_hook && r->t) {
    /* Hooks run outside the lock and may call back in; the object is
     * gone by now. */
    uint64_t c = 12345;
    ipcref_table_stats st;
    if (ipcref_table_count(r->t, id, &c) != IPCREF_EDEAD) r->hook_count_wrong++;
    if (ipcref_table_get_stats(r->t, &st) != IPCREF_OK) r->hook_count_wrong++;
  }
  if (r->on_dealloc) r->on_dealloc(r, id);
}

static void rec_violation(void *user, ipcref_id id, ipcref_result code,
                          const char *what) {
  recorder *r = (recorder *)user;
  (void)what;
  if (r->freed) {
    r->late_calls++;
    return;
  }
  if (r->nv == r->capv) {
    r->capv = r->capv ? r->capv * 2 : 64;
    r->v = (ev_violation *)realloc(r->v, r->capv * sizeof *r->v);
    if (!r->v) abort();
  }
  r->v[r->nv].id = id;
  r->v[r->nv].code = code;
  r->nv++;
}

static void rec_clear(recorder *r) {
  r->nd = r->nv = 0;
}
static void rec_fini(recorder *r) {
  free(r->d);
  free(r->v);
  memset(r, 0, sizeof *r);
}

static ipcref_table *new_table(recorder *r) {
  ipcref_table_hooks h;
  ipcref_table *t = NULL;
  memset(&h, 0, sizeof h);
  h.dealloc = rec_dealloc;
  h.violation = rec_violation;
  h.user = r;
  if (ipcref_table_new(&h, &t) != IPCREF_OK) return NULL;
  r->t = t;
  return t;
}

static ipcref_table_stats stats_of(ipcref_table *t) {
  ipcref_table_stats s;
  memset(&s, 0xff, sizeof s);
  if (ipcref_table_get_stats(t, &s) != IPCREF_OK) memset(&s, 0xee, sizeof s);
  return s;
}

static uint64_t count_of(ipcref_table *t, ipcref_id id) {
  uint64_t c = UINT64_MAX;
  if (ipcref_table_count(t, id, &c) != IPCREF_OK) return UINT64_MAX - 1;
  return c;
}

/* The dealloc told for `id` (the last one), or NULL. */
static const ev_dealloc *find_dealloc(const recorder *r, ipcref_id id) {
  size_t i;
  for (i = r->nd; i-- > 0;)
    if (r->d[i].id == id) return &r->d[i];
  return NULL;
}

/* 1 when the dealloc of `id` named exactly the stores in `want` (as sets). */
static int stores_are(const recorder *r, ipcref_id id, const uint32_t *want,
                      size_t nwant) {
  uint32_t a[MAX_STORES], b[MAX_STORES];
  size_t na, nb, i;
  const ev_dealloc *e = find_dealloc(r, id);
  if (!e || e->nstores > MAX_STORES || nwant > MAX_STORES) return 0;
  memcpy(a, e->stores, e->nstores * sizeof *a);
  if (nwant) memcpy(b, want, nwant * sizeof *b);
  na = set_u32(a, e->nstores);
  nb = set_u32(b, nwant);
  if (na != nb) return 0;
  for (i = 0; i < na; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

/* ======================================================================== */
/* 1. The model test. */

/* The model of one id. Groups are numbered by the id that created them. */
typedef struct m_id {
  uint64_t count;   /* the table's count for it */
  uint64_t handles; /* how many of those are the test's own handles (never
                       more than count: a reference taken twice, through
                       op_steal, can leave the test fewer) */
  ipcref_id group;  /* the group it is in (a group number) */
  int put;          /* put at least once */
  idvec contained;  /* from its first put */
  uint32_t stores[MAX_STORES];
  size_t nstores; /* a set */
} m_id;

typedef struct m_group {
  int alive;  /* neither deallocated nor merged into another */
  int dead;   /* deallocated */
  int queued; /* on the dealloc worklist */
  idvec ids;  /* its members, an explicit set */
  int epoch;  /* reachability search */
  long freed; /* dealloc hook calls seen naming it */
  ipcref_id first_at_death;
} m_group;

typedef struct m_msg {
  uint64_t token;
  idvec ids;
} m_msg;

typedef struct m_pull {
  ipcref_view v;
  ipcref_id id;
} m_pull;

#define M_MAX_PULLS  8
#define M_MAX_SPENT  64
#define M_LIVE_CAP   72
#define M_MAX_FLIGHT 24

typedef struct model {
  ipcref_table *t;
  recorder rec;
  rng r;
  long seed, op;
  const char *opname;
  long fails;    /* checks failed */
  long diverged; /* of which the table and the model parted ways */
  int stop;      /* the model cannot follow any more */
  int kind;      /* the operation's index in m_ops */
  long kind_fails[32];
  /* ids 1..next-1 were handed out */
  ipcref_id next;
  m_id *id;
  m_group *g;
  size_t cap;
  idvec live; /* ids of live groups (rebuilt after each op) */
  size_t nlive_ids, nlive_groups;
  uint64_t deallocs;
  /* messages */
  m_msg flight[M_MAX_FLIGHT];
  size_t nflight;
  uint64_t spent[M_MAX_SPENT];
  size_t nspent;
  idvec tokens; /* every token ever issued */
  /* pulled views */
  m_pull pulls[M_MAX_PULLS];
  size_t npulls;
  ipcref_view src; /* the data the pulls view */
  /* the nesting chain: its head, 0 when none */
  ipcref_id chain;
  ipcref_id alias_tail; /* the end of an alias chain being built */
  /* what this operation must do */
  ev_dealloc *xd;
  size_t nxd, capxd;
  ev_violation *xv; /* id 0 or code OK: any */
  size_t nxv, capxv;
  uint64_t prev_violations;
  int epoch;
  /* totals, for the report */
  long n_ops[32];
  long n_viol, n_viol_contained, n_viol_held; /* breaches expected */
  size_t max_depth_freed, max_group;
} model;

static void mfail(model *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void mfail(model *m, const char *fmt, ...) {
  va_list ap;
  harness_failures_in_test++;
  m->fails++;
  m->kind_fails[m->kind]++;
  if (m->fails > 12) return;
  printf("    seed %ld op %ld (%s): ", m->seed, m->op, m->opname);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

/* `call` must return `want`. */
#define M_RC(m, call, want)                                                    \
  do {                                                                         \
    ipcref_result m_rc_ = (call);                                              \
    if (m_rc_ != (want)) {                                                     \
      mfail((m), "%s returned %d, want %d", #call, (int)m_rc_, (int)(want));   \
      (m)->diverged++;                                                         \
    }                                                                          \
  } while (0)

static void m_grow(model *m, ipcref_id id) {
  if ((size_t)id < m->cap) return;
  {
    size_t nc = m->cap ? m->cap : 1024;
    while (nc <= (size_t)id) nc *= 2;
    m->id = (m_id *)realloc(m->id, nc * sizeof *m->id);
    m->g = (m_group *)realloc(m->g, nc * sizeof *m->g);
    if (!m->id || !m->g) abort();
    memset(m->id + m->cap, 0, (nc - m->cap) * sizeof *m->id);
    memset(m->g + m->cap, 0, (nc - m->cap) * sizeof *m->g);
    m->cap = nc;
  }
}

static int m_handed(const model *m, ipcref_id id) {
  return id >= 1 && id < m->next;
}
static int m_alive(const model *m, ipcref_id id) {
  return m_handed(m, id) && m->g[m->id[id].group].alive;
}
static uint64_t m_total(const model *m, ipcref_id g) {
  uint64_t s = 0;
  size_t i;
  for (i = 0; i < m->g[g].ids.n; i++) s += m->id[m->g[g].ids.v[i]].count;
  return s;
}

static void m_expect_violation(model *m, ipcref_id id, ipcref_result code) {
  if (m->nxv == m->capxv) {
    m->capxv = m->capxv ? m->capxv * 2 : 16;
    m->xv = (ev_violation *)realloc(m->xv, m->capxv * sizeof *m->xv);
    if (!m->xv) abort();
  }
  m->xv[m->nxv].id = id;
  m->xv[m->nxv].code = code;
  m->nxv++;
  m->n_viol++;
}

/* One reference less on `id` (its count is above zero); the test's
 * handles on it are never more than its count. */
static void m_lose(model *m, ipcref_id id) {
  m_id *x = &m->id[id];
  x->count--;
  if (x->handles > x->count) x->handles = x->count;
}

/* Deallocates group `g0` and what only it kept alive, as the doc says: the
 * hook names the group's first id and every store its ids were put in;
 * each contained id loses one reference, and one already at zero or gone
 * (its reference was taken twice: op_steal) is a breach, reported as
 * decref reports it (EDEAD, the id), once per reference. */
static void m_dealloc(model *m, ipcref_id g0) {
  idvec work = {0, 0, 0};
  size_t depth = 0;
  iv_push(&work, g0);
  m->g[g0].queued = 1;
  while (work.n) {
    ipcref_id g = work.v[--work.n];
    m_group *G = &m->g[g];
    ev_dealloc *e;
    ipcref_id first = UINT64_MAX;
    size_t i, k;
    depth++;
    G->alive = 0;
    G->dead = 1;
    m->nlive_groups--;
    m->nlive_ids -= G->ids.n;
    m->deallocs++;
    if (m->nxd == m->capxd) {
      m->capxd = m->capxd ? m->capxd * 2 : 16;
      m->xd = (ev_dealloc *)realloc(m->xd, m->capxd * sizeof *m->xd);
      if (!m->xd) abort();
    }
    e = &m->xd[m->nxd++];
    e->nstores = 0;
    for (i = 0; i < G->ids.n; i++) {
      m_id *x = &m->id[G->ids.v[i]];
      if (G->ids.v[i] < first) first = G->ids.v[i];
      for (k = 0; k < x->nstores; k++)
        if (e->nstores < MAX_STORES) e->stores[e->nstores++] = x->stores[k];
    }
    e->nstores = set_u32(e->stores, e->nstores);
    e->id = first;
    G->first_at_death = first;
    for (i = 0; i < G->ids.n; i++) {
      m_id *x = &m->id[G->ids.v[i]];
      for (k = 0; k < x->contained.n; k++) {
        ipcref_id c = x->contained.v[k];
        ipcref_id cg = m->id[c].group;
        if (m->id[c].count == 0 || !m->g[cg].alive) {
          m_expect_violation(m, c, IPCREF_EDEAD);
          m->n_viol_contained++;
          continue;
        }
        m_lose(m, c);
        if (!m->g[cg].queued && m_total(m, cg) == 0) {
          m->g[cg].queued = 1;
          iv_push(&work, cg);
        }
      }
      iv_free(&x->contained);
    }
  }
  if (depth > m->max_depth_freed) m->max_depth_freed = depth;
  iv_free(&work);
}

/* A holder (the test, a message, a pull) lets go of its reference on
 * `id`; at zero or gone (its reference was taken twice) it is a breach,
 * which changes nothing. */
static void m_drop(model *m, ipcref_id id) {
  ipcref_id g = m->id[id].group;
  if (m->id[id].count == 0 || !m->g[g].alive) {
    m_expect_violation(m, id, IPCREF_EDEAD);
    m->n_viol_held++;
    return;
  }
  m_lose(m, id);
  if (m_total(m, g) == 0) m_dealloc(m, g);
}

/* 1 when group `from` holds (through contained ids, transitively) group
 * `to`. */
static int m_reaches(model *m, ipcref_id from, ipcref_id to) {
  idvec st = {0, 0, 0};
  int found = 0;
  m->epoch++;
  iv_push(&st, from);
  m->g[from].epoch = m->epoch;
  while (st.n && !found) {
    ipcref_id g = st.v[--st.n];
    size_t i, k;
    for (i = 0; i < m->g[g].ids.n && !found; i++) {
      m_id *x = &m->id[m->g[g].ids.v[i]];
      for (k = 0; k < x->contained.n; k++) {
        ipcref_id cg = m->id[x->contained.v[k]].group;
        if (cg == to) {
          found = 1;
          break;
        }
        if (m->g[cg].epoch != m->epoch) {
          m->g[cg].epoch = m->epoch;
          iv_push(&st, cg);
        }
      }
    }
  }
  iv_free(&st);
  return found;
}

/* A random live id (0 when none). */
static ipcref_id m_any_live(model *m) {
  return m->live.n ? m->live.v[rng_below(&m->r, m->live.n)] : 0;
}
/* A random live id the test holds a handle on (0 when none found). */
static ipcref_id m_any_held(model *m) {
  int i;
  for (i = 0; i < 16; i++) {
    ipcref_id id = m_any_live(m);
    if (id && m->id[id].handles) return id;
  }
  return 0;
}
/* A random dead id (0 when none found). */
static ipcref_id m_any_dead(model *m) {
  int i;
  for (i = 0; i < 16 && m->next > 1; i++) {
    ipcref_id id = 1 + rng_below(&m->r, (size_t)(m->next - 1));
    if (!m_alive(m, id)) return id;
  }
  return 0;
}
/* A random live id whose own count is zero (its group lives through
 * another id), or 0. */
static ipcref_id m_any_zero(model *m) {
  size_t i, start = rng_below(&m->r, m->live.n);
  for (i = 0; i < m->live.n; i++) {
    ipcref_id id = m->live.v[(start + i) % m->live.n];
    if (m->id[id].count == 0) return id;
  }
  return 0;
}
/* An id never handed out. */
static ipcref_id m_never(model *m) {
  switch (rng_below(&m->r, 4)) {
  case 0: return 0;
  case 1: return m->next;
  case 2: return m->next + 1 + rng_below(&m->r, 1000);
  default: return UINT64_MAX;
  }
}

static void m_add_store(m_id *x, uint32_t s) {
  size_t k;
  for (k = 0; k < x->nstores; k++)
    if (x->stores[k] == s) return;
  if (x->nstores < MAX_STORES) x->stores[x->nstores++] = s;
}

/* ---- operations --------------------------------------------------------- */

static void op_create(model *m) {
  ipcref_id id = 0;
  M_RC(m, ipcref_table_create(m->t, &id), IPCREF_OK);
  /* "1, 2, 3, ...: never 0, never reused" */
  if (id != m->next) {
    mfail(m, "create gave id %llu, want %llu", (unsigned long long)id,
          (unsigned long long)m->next);
    m->stop = 1; /* the model cannot follow */
    return;
  }
  m->next++;
  m_grow(m, id);
  memset(&m->id[id], 0, sizeof m->id[id]);
  m->id[id].count = 1;
  m->id[id].handles = 1;
  m->id[id].group = id;
  memset(&m->g[id], 0, sizeof m->g[id]);
  m->g[id].alive = 1;
  iv_push(&m->g[id].ids, id);
  m->nlive_ids++;
  m->nlive_groups++;
  iv_push(&m->live, id);
}

static void op_incref(model *m) {
  ipcref_id id = m_any_live(m);
  if (!id) return;
  M_RC(m, ipcref_table_incref(m->t, id), IPCREF_OK);
  m->id[id].count++;
  m->id[id].handles++;
}

static void op_decref(model *m) {
  ipcref_id id = m_any_held(m);
  if (!id) return;
  M_RC(m, ipcref_table_decref(m->t, id), IPCREF_OK);
  m->id[id].handles--;
  m_drop(m, id);
}

/* Up to `max` contained ids for `id`'s first put: live ids whose group
 * does not hold id's (no cycles: every object must go in the end); some
 * repeated, some held by several containers. */
static size_t m_pick_contained(model *m, ipcref_id id, ipcref_id *out,
                               size_t max) {
  size_t n = 0, want = rng_below(&m->r, max + 1), tries;
  ipcref_id gid = m->id[id].group;
  for (tries = 0; n < want && tries < 4 * max; tries++) {
    ipcref_id c;
    if (n && rng_below(&m->r, 6) == 0) {
      out[n] = out[rng_below(&m->r, n)]; /* the same id twice */
      n++;
      continue;
    }
    c = m_any_live(m);
    if (!c || m->id[c].group == gid || m_reaches(m, m->id[c].group, gid))
      continue;
    out[n++] = c;
  }
  return n;
}

static void m_put_apply(model *m, ipcref_id id, uint32_t store,
                        const ipcref_id *c, size_t n) {
  m_id *x = &m->id[id];
  size_t i;
  m_add_store(x, store);
  if (!x->put) {
    x->put = 1;
    for (i = 0; i < n; i++) {
      iv_push(&x->contained, c[i]);
      m->id[c[i]].count++;
    }
  }
}

static void op_put(model *m) {
  ipcref_id id = m_any_live(m), c[6];
  size_t n = 0;
  uint32_t store = (uint32_t)rng_below(&m->r, 8);
  if (!id) return;
  if (!m->id[id].put) n = m_pick_contained(m, id, c, 5);
  M_RC(m, ipcref_table_put(m->t, id, store, n ? c : NULL, n), IPCREF_OK);
  m_put_apply(m, id, store, c, n);
}

/* A new object holding the chain's head (and maybe more): the chain grows
 * one deeper; the head's handle goes, so only the new object holds it. */
static void op_nest(model *m) {
  ipcref_id head = m->chain, id, c[4];
  size_t n = 0;
  uint32_t store;
  if (head && !m_alive(m, head)) head = m->chain = 0;
  op_create(m);
  if (m->stop) return;
  id = m->next - 1;
  if (head) c[n++] = head;
  if (rng_below(&m->r, 2)) {
    ipcref_id o = m_any_live(m);
    if (o && o != id && !m_reaches(m, m->id[o].group, id)) c[n++] = o;
  }
  store = (uint32_t)rng_below(&m->r, 8);
  M_RC(m, ipcref_table_put(m->t, id, store, c, n), IPCREF_OK);
  m_put_apply(m, id, store, c, n);
  m->chain = id;
  if (head && m->id[head].handles) {
    M_RC(m, ipcref_table_decref(m->t, head), IPCREF_OK);
    m->id[head].handles--;
    m_drop(m, head);
  }
}

static void op_put_again_with_contents(model *m) {
  ipcref_id id = m_any_live(m), c;
  if (!id || !m->id[id].put) return;
  c = m_any_live(m);
  /* "A later put of the same id adds a store; its contained list must
   * then be empty (else EINVAL). Nothing changes on error." */
  M_RC(m, ipcref_table_put(m->t, id, 99, &c, 1), IPCREF_EINVAL);
}

static void op_msg_out(model *m) {
  ipcref_id ids[5];
  size_t n = rng_below(&m->r, 5), i;
  uint64_t token = 0;
  m_msg *msg;
  if (m->nflight == M_MAX_FLIGHT) return;
  for (i = 0; i < n; i++) {
    ids[i] = (i && rng_below(&m->r, 5) == 0) ? ids[i - 1] : m_any_live(m);
    if (!ids[i]) return;
  }
  M_RC(m, ipcref_table_msg_out(m->t, n ? ids : NULL, n, &token), IPCREF_OK);
  msg = &m->flight[m->nflight++];
  memset(msg, 0, sizeof *msg);
  msg->token = token;
  for (i = 0; i < n; i++) {
    iv_push(&msg->ids, ids[i]);
    m->id[ids[i]].count++;
  }
  iv_push(&m->tokens, token);
}

static void op_msg_end(model *m, int cancel) {
  size_t k;
  m_msg msg;
  if (!m->nflight) return;
  k = rng_below(&m->r, m->nflight);
  msg = m->flight[k];
  m->flight[k] = m->flight[--m->nflight];
  if (cancel)
    M_RC(m, ipcref_table_msg_cancel(m->t, msg.token), IPCREF_OK);
  else
    M_RC(m, ipcref_table_msg_in(m->t, msg.token), IPCREF_OK);
  for (k = 0; k < msg.ids.n; k++) m_drop(m, msg.ids.v[k]);
  iv_free(&msg.ids);
  if (m->nspent == M_MAX_SPENT) m->nspent = 0;
  m->spent[m->nspent++] = msg.token;
}

/* "msg_in ... or msg_cancel ... lets go, exactly once: a second call with
 * the token is EINVAL", and the rules: "a count never goes below zero
 * (decref, msg_in of a spent message)" is a breach "reported to the
 * violation hook". Which code the hook hears is not said. */
static void op_msg_spent(model *m) {
  uint64_t tok;
  if (!m->nspent) return;
  tok = m->spent[rng_below(&m->r, m->nspent)];
  if (rng_below(&m->r, 2))
    M_RC(m, ipcref_table_msg_in(m->t, tok), IPCREF_EINVAL);
  else
    M_RC(m, ipcref_table_msg_cancel(m->t, tok), IPCREF_EINVAL);
  m_expect_violation(m, 0, IPCREF_OK); /* any id, any code */
}

static void m_merge(model *m, ipcref_id a, ipcref_id b) {
  ipcref_id ga = m->id[a].group, gb = m->id[b].group;
  size_t i;
  if (ga == gb) return;
  for (i = 0; i < m->g[gb].ids.n; i++) {
    ipcref_id x = m->g[gb].ids.v[i];
    m->id[x].group = ga;
    iv_push(&m->g[ga].ids, x);
  }
  iv_free(&m->g[gb].ids);
  m->g[gb].alive = 0;
  m->nlive_groups--;
  if (m->g[ga].ids.n > m->max_group) m->max_group = m->g[ga].ids.n;
}

static void op_alias(model *m) {
  ipcref_id a, b;
  int kind = (int)rng_below(&m->r, 4);
  a = m_any_live(m);
  if (kind == 0 && m->alias_tail && m_alive(m, m->alias_tail))
    b = m->alias_tail; /* a chain: each new alias onto the last */
  else if (kind == 1 && a && m->g[m->id[a].group].ids.n > 1) {
    idvec *gi = &m->g[m->id[a].group].ids; /* already one group */
    b = gi->v[rng_below(&m->r, gi->n)];
  } else
    b = m_any_live(m);
  if (!a || !b) return;
  if (m->id[a].group != m->id[b].group &&
      (m_reaches(m, m->id[a].group, m->id[b].group) ||
       m_reaches(m, m->id[b].group, m->id[a].group)))
    return; /* the merged object would hold itself: never freed */
  if (rng_below(&m->r, 2)) {
    ipcref_id s = a;
    a = b;
    b = s;
  }
  M_RC(m, ipcref_table_alias(m->t, a, b), IPCREF_OK);
  m_merge(m, a, b);
  m->alias_tail = rng_below(&m->r, 2) ? a : b;
}

/* An alias that finds one side deallocated: EDEAD, a violation. */
static void op_alias_dead(model *m) {
  ipcref_id live = m_any_live(m), dead = m_any_dead(m);
  if (!live || !dead) return;
  if (rng_below(&m->r, 2))
    M_RC(m, ipcref_table_alias(m->t, live, dead), IPCREF_EDEAD);
  else
    M_RC(m, ipcref_table_alias(m->t, dead, live), IPCREF_EDEAD);
  m_expect_violation(m, dead, IPCREF_EDEAD);
}

/* Decref of a live id whose own count is zero: EDEAD, a violation. */
static void op_decref_zero(model *m) {
  ipcref_id id = m_any_zero(m);
  if (!id) return;
  M_RC(m, ipcref_table_decref(m->t, id), IPCREF_EDEAD);
  m_expect_violation(m, id, IPCREF_EDEAD);
}

static void op_dead(model *m) {
  ipcref_id d = m_any_dead(m), live = m_any_live(m), c[3];
  uint64_t tok = 0, cnt = 777;
  ipcref_view out;
  if (!d) return;
  memset(&out, 0, sizeof out);
  switch (rng_below(&m->r, 8)) {
  case 0:
    M_RC(m, ipcref_table_incref(m->t, d), IPCREF_EDEAD);
    m_expect_violation(m, d, IPCREF_EDEAD);
    break;
  case 1: /* a dead id's count is zero: below zero, or a dead id used */
    M_RC(m, ipcref_table_decref(m->t, d), IPCREF_EDEAD);
    m_expect_violation(m, d, IPCREF_EDEAD);
    break;
  case 2:
    M_RC(m, ipcref_table_put(m->t, d, 1, NULL, 0), IPCREF_EDEAD);
    m_expect_violation(m, d, IPCREF_EDEAD);
    break;
  case 3: /* a contained id gone: nothing changes (not even the store) */
    if (!live || m->id[live].put) return;
    c[0] = m_any_live(m);
    if (c[0] == live) return;
    c[1] = d;
    M_RC(m, ipcref_table_put(m->t, live, 5, c, 2), IPCREF_EDEAD);
    m_expect_violation(m, d, IPCREF_EDEAD);
    break;
  case 4: /* a message with one id gone: nothing counted */
    if (!live) return;
    c[0] = live;
    c[1] = d;
    c[2] = live;
    M_RC(m, ipcref_table_msg_out(m->t, c, 3, &tok), IPCREF_EDEAD);
    m_expect_violation(m, d, IPCREF_EDEAD);
    break;
  case 5: /* a query: EDEAD, not a breach */
    M_RC(m, ipcref_table_count(m->t, d, &cnt), IPCREF_EDEAD);
    break;
  case 6:
    M_RC(m, ipcref_table_view(m->t, d, &m->src, &out), IPCREF_EDEAD);
    m_expect_violation(m, d, IPCREF_EDEAD);
    break;
  default:
    M_RC(m, ipcref_table_decref(m->t, d), IPCREF_EDEAD);
    m_expect_violation(m, d, IPCREF_EDEAD);
    break;
  }
}

/* Ids never handed out: EINVAL; the hook hears "EINVAL: an id never handed
 * out" for the calls that use an id (a query is not a breach). */
static void op_never(model *m) {
  ipcref_id n = m_never(m), live = m_any_live(m), c[2];
  uint64_t tok = 0, cnt = 0;
  switch (rng_below(&m->r, 7)) {
  case 0:
    M_RC(m, ipcref_table_incref(m->t, n), IPCREF_EINVAL);
    m_expect_violation(m, n, IPCREF_EINVAL);
    break;
  case 1:
    M_RC(m, ipcref_table_decref(m->t, n), IPCREF_EINVAL);
    m_expect_violation(m, n, IPCREF_EINVAL);
    break;
  case 2:
    if (!live) return;
    c[0] = live;
    c[1] = n;
    M_RC(m, ipcref_table_msg_out(m->t, c, 2, &tok), IPCREF_EINVAL);
    m_expect_violation(m, n, IPCREF_EINVAL);
    break;
  case 3:
    if (!live) return;
    M_RC(m, ipcref_table_alias(m->t, live, n), IPCREF_EINVAL);
    m_expect_violation(m, n, IPCREF_EINVAL);
    break;
  case 4: M_RC(m, ipcref_table_count(m->t, n, &cnt), IPCREF_EINVAL); break;
  case 5: /* a contained id never handed out: nothing changes */
    if (!live || m->id[live].put) return;
    c[0] = n;
    M_RC(m, ipcref_table_put(m->t, live, 4, c, 1), IPCREF_EINVAL);
    m_expect_violation(m, n, IPCREF_EINVAL);
    break;
  default:
    M_RC(m, ipcref_table_put(m->t, n, 3, NULL, 0), IPCREF_EINVAL);
    m_expect_violation(m, n, IPCREF_EINVAL);
    break;
  }
}

static void op_pull(model *m) {
  ipcref_id id = m_any_live(m);
  m_pull *p;
  if (!id || m->npulls == M_MAX_PULLS) return;
  p = &m->pulls[m->npulls];
  memset(&p->v, 0, sizeof p->v);
  M_RC(m, ipcref_table_view(m->t, id, &m->src, &p->v), IPCREF_OK);
  if (!p->v.buf) return;
  p->id = id;
  m->npulls++;
  m->id[id].count++;
}

/* The pulled view (or a view derived from it) goes: its table reference
 * with it, maybe the object. */
static void op_unpull(model *m) {
  size_t k;
  m_pull p;
  if (!m->npulls) return;
  k = rng_below(&m->r, m->npulls);
  p = m->pulls[k];
  m->pulls[k] = m->pulls[--m->npulls];
  if (rng_below(&m->r, 2)) { /* through a derived view */
    ipcref_view s;
    memset(&s, 0, sizeof s);
    M_RC(m, ipcref_view_slice(&p.v, 0, 1, 3, 1, &s), IPCREF_OK);
    ipcref_view_release(&p.v);
    /* nothing may happen yet: checked below, before the slice goes */
    if (m->rec.nd)
      mfail(m, "a dealloc while a view derived from the pull lives (id %llu)",
            (unsigned long long)m->rec.d[0].id);
    ipcref_view_release(&s);
  } else {
    ipcref_view_release(&p.v);
  }
  m_drop(m, p.id);
}

/* Misuse the table cannot see yet: a decref of a reference someone else
 * holds (the id's count is above the test's handles: a container, a
 * message or a pull holds the rest). It succeeds, and may free the object
 * at once (counts are per id: the table cannot tell whose reference a
 * decref takes); the holder's own release later finds the id at zero or
 * gone: a breach, reported as decref reports one (EDEAD, the id), whether
 * a container's deallocation, a message's end or a pull's end meets it. */
static void op_steal(model *m) {
  size_t i, start;
  if (!m->live.n) return;
  start = rng_below(&m->r, m->live.n);
  for (i = 0; i < m->live.n; i++) {
    ipcref_id id = m->live.v[(start + i) % m->live.n];
    if (m_alive(m, id) && m->id[id].count > m->id[id].handles) {
      M_RC(m, ipcref_table_decref(m->t, id), IPCREF_OK);
      m_drop(m, id);
      return;
    }
  }
}

/* An object p that holds an id q of its own alias group, or of a group
 * that holds p's (a cycle, never freed as it is), and then a decref of q
 * that takes p's reference (misuse: the cycle can go). When the object
 * goes, q is at zero or already gone (which, depends on the order the
 * table lets go of a group's ids in): a breach, reported either way. */
static void op_self_hold(model *m) {
  ipcref_id p = m_any_live(m), q = 0;
  uint32_t store = (uint32_t)rng_below(&m->r, 8);
  int i;
  if (!p || m->id[p].put) return;
  if (rng_below(&m->r, 2)) {
    idvec *gi = &m->g[m->id[p].group].ids;
    q = gi->v[rng_below(&m->r, gi->n)];
  } else {
    for (i = 0; i < 8 && !q; i++) {
      q = m_any_live(m);
      if (m->id[q].group != m->id[p].group &&
          !m_reaches(m, m->id[q].group, m->id[p].group))
        q = 0;
    }
  }
  if (!q || q == p) return;
  M_RC(m, ipcref_table_put(m->t, p, store, &q, 1), IPCREF_OK);
  m_put_apply(m, p, store, &q, 1);
  M_RC(m, ipcref_table_decref(m->t, q), IPCREF_OK);
  m_drop(m, q);
}

/* ---- the check after every operation ------------------------------------ */

static int cmp_ev_id(const void *a, const void *b) {
  ipcref_id x = ((const ev_dealloc *)a)->id, y = ((const ev_dealloc *)b)->id;
  return x < y ? -1 : x > y;
}

static int cmp_ev_violation(const void *a, const void *b) {
  const ev_violation *x = (const ev_violation *)a, *y = (const ev_violation *)b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return (x->code > y->code) - (x->code < y->code);
}

/* The violations told against the model's, as multisets (a cascade's
 * order is the table's business): each told once per breach, naming the
 * id with the code. An expectation with id 0 or code OK matches any id or
 * code. */
static void m_match_violations(model *m) {
  ev_violation *told = m->rec.v, *want = m->xv;
  size_t nt = m->rec.nv, nexact = 0, i, j, k, left = 0;
  for (i = 0; i < m->nxv; i++) { /* the exact ones first */
    if (want[i].id && want[i].code) {
      ev_violation e = want[i];
      want[i] = want[nexact];
      want[nexact++] = e;
    }
  }
  qsort(told, nt, sizeof *told, cmp_ev_violation);
  qsort(want, nexact, sizeof *want, cmp_ev_violation);
  for (i = j = 0; i < nt; i++) { /* unmatched told ones to the front */
    int c = 1;
    while (j < nexact && (c = cmp_ev_violation(&want[j], &told[i])) < 0) {
      mfail(m, "no violation told for id %llu (code %d)",
            (unsigned long long)want[j].id, (int)want[j].code);
      j++;
    }
    if (c == 0)
      j++;
    else
      told[left++] = told[i];
  }
  for (; j < nexact; j++)
    mfail(m, "no violation told for id %llu (code %d)",
          (unsigned long long)want[j].id, (int)want[j].code);
  for (i = nexact; i < m->nxv; i++) { /* the loose ones take what is left */
    for (k = 0; k < left; k++)
      if ((!want[i].id || want[i].id == told[k].id) &&
          (!want[i].code || want[i].code == told[k].code))
        break;
    if (k == left) {
      mfail(m, "no violation told for id %llu (code %d)",
            (unsigned long long)want[i].id, (int)want[i].code);
      continue;
    }
    told[k] = told[--left];
  }
  for (k = 0; k < left; k++)
    mfail(m, "violation told for id %llu (code %d), not expected",
          (unsigned long long)told[k].id, (int)told[k].code);
}

static void m_verify(model *m) {
  ipcref_table_stats st = stats_of(m->t);
  size_t i, k;
  long f0 = m->fails, f1, f2;
  /* the deallocations: the same objects, now */
  if (m->rec.nd != m->nxd) {
    mfail(m,
          "%zu deallocs told, the model made %zu (first told %llu, "
          "first expected %llu)",
          m->rec.nd, m->nxd,
          (unsigned long long)(m->rec.nd ? m->rec.d[0].id : 0),
          (unsigned long long)(m->nxd ? m->xd[0].id : 0));
  } else if (m->nxd) {
    qsort(m->rec.d, m->rec.nd, sizeof *m->rec.d, cmp_ev_id);
    qsort(m->xd, m->nxd, sizeof *m->xd, cmp_ev_id);
    for (i = 0; i < m->nxd; i++) {
      ev_dealloc *got = &m->rec.d[i], *want = &m->xd[i];
      size_t ng;
      if (got->id != want->id) {
        mfail(m, "dealloc named %llu, the model %llu",
              (unsigned long long)got->id, (unsigned long long)want->id);
        continue;
      }
      if (got->nstores > MAX_STORES) {
        mfail(m, "dealloc of %llu told %zu stores", (unsigned long long)got->id,
              got->nstores);
        continue;
      }
      ng = set_u32(got->stores, got->nstores);
      if (ng != want->nstores ||
          memcmp(got->stores, want->stores, ng * sizeof *got->stores) != 0)
        mfail(m, "dealloc of %llu: %zu stores told, %zu expected (as sets)",
              (unsigned long long)got->id, ng, want->nstores);
    }
  }
  for (i = 0; i < m->rec.nd; i++) /* as told */
    if (m_handed(m, m->rec.d[i].id)) m->g[m->id[m->rec.d[i].id].group].freed++;
  if (m->rec.hook_count_wrong) {
    mfail(m, "in the dealloc hook, count(id) was not EDEAD or stats failed");
    m->rec.hook_count_wrong = 0;
  }
  /* the violations (a difference here does not part the model from the
   * table) */
  f1 = m->fails;
  if (st.violations - m->prev_violations != m->nxv || m->rec.nv != m->nxv) {
    mfail(m, "violations: %llu counted, %zu told, %zu expected",
          (unsigned long long)(st.violations - m->prev_violations), m->rec.nv,
          m->nxv);
  } else if (m->nxv) {
    m_match_violations(m);
  }
  m->prev_violations = st.violations;
  f2 = m->fails;
  /* the stats */
  if (st.ids != m->nlive_ids || st.objects != m->nlive_groups ||
      st.messages != m->nflight || st.deallocs != m->deallocs)
    mfail(m,
          "stats ids %zu objects %zu messages %zu deallocs %llu; model %zu "
          "%zu %zu %llu",
          st.ids, st.objects, st.messages, (unsigned long long)st.deallocs,
          m->nlive_ids, m->nlive_groups, m->nflight,
          (unsigned long long)m->deallocs);
  /* the live set, and every live id's count */
  for (i = k = 0; i < m->live.n; i++)
    if (m_alive(m, m->live.v[i])) m->live.v[k++] = m->live.v[i];
  m->live.n = k;
  if (k != m->nlive_ids)
    mfail(m, "model: live list %zu != %zu", k, m->nlive_ids);
  for (i = 0; i < m->live.n; i++) {
    ipcref_id id = m->live.v[i];
    uint64_t c = 4242;
    ipcref_result rc = ipcref_table_count(m->t, id, &c);
    if (rc != IPCREF_OK || c != m->id[id].count) {
      mfail(m, "count(%llu): rc %d, %llu; model %llu", (unsigned long long)id,
            (int)rc, (unsigned long long)c,
            (unsigned long long)m->id[id].count);
      break;
    }
  }
  /* a few dead ids stay dead */
  for (i = 0; i < 2; i++) {
    ipcref_id d = m_any_dead(m);
    uint64_t c = 0;
    if (d && ipcref_table_count(m->t, d, &c) != IPCREF_EDEAD)
      mfail(m, "count(%llu) of a dead id is not EDEAD", (unsigned long long)d);
  }
  if (f1 - f0 + m->fails - f2 > 0) m->diverged++;
}

typedef struct m_opdef {
  const char *name;
  void (*fn)(model *m);
  int weight;
} m_opdef;

static void op_msg_in(model *m) {
  op_msg_end(m, 0);
}
static void op_msg_cancel(model *m) {
  op_msg_end(m, 1);
}

static const m_opdef m_ops[] = {
    {"create", op_create, 12},
    {"incref", op_incref, 10},
    {"decref", op_decref, 17},
    {"put", op_put, 10},
    {"nest", op_nest, 5},
    {"put again with contents", op_put_again_with_contents, 1},
    {"msg_out", op_msg_out, 8},
    {"msg_in", op_msg_in, 6},
    {"msg_cancel", op_msg_cancel, 3},
    {"msg_in/cancel of a spent message", op_msg_spent, 1},
    {"alias", op_alias, 7},
    {"alias with a dead id", op_alias_dead, 1},
    {"decref at zero", op_decref_zero, 2},
    {"use of a dead id", op_dead, 2},
    {"use of an id never handed out", op_never, 1},
    {"pull", op_pull, 2},
    {"unpull", op_unpull, 2},
    {"decref of a reference someone else holds", op_steal, 3},
    {"object holding itself, its reference taken", op_self_hold, 1},
};
#define M_NOPS (sizeof m_ops / sizeof m_ops[0])

static void m_cleanup(model *m) {
  size_t i;
  for (i = 0; i < m->cap; i++) {
    iv_free(&m->id[i].contained);
    iv_free(&m->g[i].ids);
  }
  for (i = 0; i < m->nflight; i++) iv_free(&m->flight[i].ids);
  free(m->id);
  free(m->g);
  free(m->xd);
  free(m->xv);
  iv_free(&m->live);
  iv_free(&m->tokens);
  rec_fini(&m->rec);
}

static void model_run(long seed, long nops) {
  model *m = (model *)calloc(1, sizeof *m);
  ipcref_buf *b = NULL;
  int64_t shape[1] = {64};
  long base_live = ta_live_now(), op;
  int total_w = 0;
  size_t i;
  double t0 = now_s();
  if (!m) abort();
  m->seed = seed;
  m->r.s = (uint64_t)seed * 0x2545f4914f6cdd1dull + 1;
  m->next = 1;
  m->rec.check_dead_in_hook = 1;
  m->t = new_table(&m->rec);
  CHECK(m->t != NULL);
  if (!m->t) return;
  CHECK_EQ(ipcref_buf_new(64, &b), IPCREF_OK);
  memset(ipcref_buf_data(b), 0x5a, 64);
  CHECK_EQ(ipcref_view_of(b, IPCREF_U8, 1, shape, &m->src), IPCREF_OK);
  ipcref_buf_release(b);
  for (i = 0; i < M_NOPS; i++) total_w += m_ops[i].weight;
  for (op = 0; op < nops && !m->stop && m->diverged < 20; op++) {
    int w;
    size_t k = 0;
    m->op = op;
    rec_clear(&m->rec);
    m->nxd = m->nxv = 0;
    /* keep the population small (the check reads every live id), or
     * regrow it */
    if (m->nlive_ids > M_LIVE_CAP && rng_below(&m->r, 3)) {
      k = rng_below(&m->r, 4) ? 2 /* decref */ : 7 /* msg_in */;
    } else if (m->nlive_ids < 8 && rng_below(&m->r, 2)) {
      k = 0;
    } else {
      w = (int)rng_below(&m->r, (size_t)total_w);
      for (k = 0; k < M_NOPS; k++) {
        if (w < m_ops[k].weight) break;
        w -= m_ops[k].weight;
      }
    }
    if (m->nlive_ids > M_LIVE_CAP && (k == 0 || k == 4)) k = 2;
    m->opname = m_ops[k].name;
    m->kind = (int)k;
    m_ops[k].fn(m);
    m->n_ops[k]++;
    m_verify(m);
  }
  /* the end: every pull, message and handle goes; everything is freed,
   * once */
  m->opname = "the final drop";
  rec_clear(&m->rec);
  m->nxd = m->nxv = 0;
  while (m->npulls) {
    m->npulls--;
    ipcref_view_release(&m->pulls[m->npulls].v);
    m_drop(m, m->pulls[m->npulls].id);
  }
  while (m->nflight) op_msg_end(m, (int)rng_below(&m->r, 2));
  m->kind = M_NOPS;
  for (i = 1; i < m->next && !m->stop; i++) {
    while (m_alive(m, i) && m->id[i].handles) {
      M_RC(m, ipcref_table_decref(m->t, i), IPCREF_OK);
      m->id[i].handles--;
      m_drop(m, i);
    }
  }
  m_verify(m);
  {
    ipcref_table_stats st = stats_of(m->t);
    size_t groups = 0;
    CHECK_EQ(st.ids, 0);
    CHECK_EQ(st.objects, 0);
    CHECK_EQ(st.messages, 0);
    CHECK_EQ(m->nlive_groups, 0);
    for (i = 1; i < m->next; i++) {
      m_group *g = &m->g[i];
      if (!g->dead) continue; /* merged into another */
      groups++;
      if (g->freed != 1) {
        mfail(m, "object %llu (group %zu) freed %ld times",
              (unsigned long long)g->first_at_death, i, g->freed);
        break;
      }
    }
    CHECK_EQ(st.deallocs, groups);
  }
  /* tokens never reused */
  qsort(m->tokens.v, m->tokens.n, sizeof *m->tokens.v, cmp_u64);
  for (i = 1; i < m->tokens.n; i++)
    if (m->tokens.v[i] == m->tokens.v[i - 1]) {
      mfail(m, "token %llu issued twice", (unsigned long long)m->tokens.v[i]);
      break;
    }
  ipcref_view_release(&m->src);
  ipcref_table_free(m->t);
  CHECK_EQ(ta_live_now(), base_live);
  printf("    seed %ld: %ld ops, %llu ids, %llu objects freed (deepest cascade "
         "%zu, largest alias group %zu), %ld breaches reported (%ld by a "
         "container's dealloc, %ld by a message's or a pull's end), %.2f s\n",
         seed, nops, (unsigned long long)(m->next - 1),
         (unsigned long long)m->deallocs, m->max_depth_freed, m->max_group,
         m->n_viol, m->n_viol_contained, m->n_viol_held, now_s() - t0);
  if (m->fails) {
    printf("    seed %ld: %ld failed checks in all%s; by operation:\n", seed,
           m->fails,
           m->diverged >= 20 || m->stop ? " (stopped: the model cannot follow)"
                                        : "");
    for (i = 0; i <= M_NOPS; i++)
      if (m->kind_fails[i])
        printf("      %-34s %ld of %ld\n",
               i < M_NOPS ? m_ops[i].name : "the final drop", m->kind_fails[i],
               i < M_NOPS ? m->n_ops[i] : 1L);
  }
  m_cleanup(m);
  free(m);
}

static void test_model(void) {
  static const long seeds[] = {1, 2, 0x7ab1e, 20261122};
  long per_seed = opt_ops / 4;
  size_t i;
  if (per_seed < 1000) per_seed = 1000;
  if (under_valgrind) per_seed = opt_ops < 20000 ? opt_ops : 20000;
#ifdef IPCREF__TSAN /* one thread here: TSan's time is for test_threads */
  if (per_seed > 100000) per_seed = 100000;
#endif
  if (opt_seed >= 0) {
    printf("    IPCREF_TEST_SEED=%ld\n", opt_seed);
    model_run(opt_seed, per_seed);
    return;
  }
  for (i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
    printf("    seed %ld (IPCREF_TEST_SEED=%ld reruns it)\n", seeds[i],
           seeds[i]);
    model_run(seeds[i], per_seed);
  }
}

/* ======================================================================== */
/* 2. A 10^6-long containment chain, freed without recursion. */

#define CHAIN_N 1000000

typedef struct chain_ctx {
  ipcref_table *t;
  ipcref_id first, head;
  unsigned char *freed; /* per id: dealloc calls */
  long calls, bad_store, bad_id;
  double build_s, free_s;
  int ok;
} chain_ctx;

static void chain_dealloc(void *user, ipcref_id id, const uint32_t *stores,
                          size_t nstores) {
  chain_ctx *c = (chain_ctx *)user;
  c->calls++;
  if (id < c->first || id >= c->first + CHAIN_N) {
    c->bad_id++;
    return;
  }
  if (c->freed[id - c->first] < 255) c->freed[id - c->first]++;
  if (nstores != 1 || stores[0] != (uint32_t)(id % 7)) c->bad_store++;
}

static void *chain_thread(void *arg) {
  chain_ctx *c = (chain_ctx *)arg;
  ipcref_id prev = 0, id = 0;
  ipcref_table_stats st;
  long i;
  double t0 = now_s();
  c->ok = 1;
  /* the tail first: object i holds object i+1 */
  for (i = 0; i < CHAIN_N; i++) {
    if (ipcref_table_create(c->t, &id) != IPCREF_OK) {
      c->ok = 0;
      return NULL;
    }
    if (i == 0) c->first = id;
    if (ipcref_table_put(c->t, id, (uint32_t)(id % 7), prev ? &prev : NULL,
                         prev ? 1 : 0) != IPCREF_OK) {
      c->ok = 0;
      return NULL;
    }
    if (prev && ipcref_table_decref(c->t, prev) != IPCREF_OK) {
      c->ok = 0;
      return NULL;
    }
    prev = id;
  }
  c->head = id;
  c->build_s = now_s() - t0;
  if (ipcref_table_get_stats(c->t, &st) != IPCREF_OK || st.ids != CHAIN_N ||
      st.deallocs != 0 || c->calls != 0)
    c->ok = 0;
  t0 = now_s();
  if (ipcref_table_decref(c->t, c->head) != IPCREF_OK) c->ok = 0;
  c->free_s = now_s() - t0;
  return NULL;
}

static void test_chain(void) {
  chain_ctx c;
  ipcref_table_hooks h;
  pthread_attr_t attr;
  pthread_t th;
  ipcref_table_stats st;
  long i, wrong = 0;
  memset(&c, 0, sizeof c);
  memset(&h, 0, sizeof h);
  h.dealloc = chain_dealloc;
  h.user = &c;
  c.freed = (unsigned char *)calloc(CHAIN_N, 1);
  CHECK(c.freed != NULL);
  CHECK_EQ(ipcref_table_new(&h, &c.t), IPCREF_OK);
  if (!c.t || !c.freed) return;
  pthread_attr_init(&attr);
  CHECK_EQ(pthread_attr_setstacksize(&attr, 256 * 1024), 0);
  CHECK_EQ(pthread_create(&th, &attr, chain_thread, &c), 0);
  pthread_join(th, NULL);
  pthread_attr_destroy(&attr);
  CHECK(c.ok);
  CHECK_EQ(c.calls, CHAIN_N);
  CHECK_EQ(c.bad_id, 0);
  CHECK_EQ(c.bad_store, 0);
  for (i = 0; i < CHAIN_N; i++)
    if (c.freed[i] != 1) wrong++;
  CHECK_EQ(wrong, 0);
  st = stats_of(c.t);
  CHECK_EQ(st.ids, 0);
  CHECK_EQ(st.objects, 0);
  CHECK_EQ(st.deallocs, CHAIN_N);
  CHECK_EQ(st.violations, 0);
  printf("    %d-long chain: built in %.2f s, freed by one decref in %.2f s "
         "(256 KiB stack)\n",
         CHAIN_N, c.build_s, c.free_s);
  ipcref_table_free(c.t);
  free(c.freed);
}

/* ======================================================================== */
/* 3. The zero-copy pull. */

/* A store: object id -> the buffer holding its data. The dealloc hook
 * releases the store's reference. */
#define STORE_MAX 8
typedef struct store {
  ipcref_id id[STORE_MAX];
  ipcref_buf *buf[STORE_MAX];
  long deallocs, late, unknown;
  int table_freed;
} store;

static void store_dealloc(void *user, ipcref_id id, const uint32_t *stores,
                          size_t nstores) {
  store *s = (store *)user;
  int i;
  (void)stores;
  (void)nstores;
  if (s->table_freed) { /* "forgotten without dealloc calls" */
    s->late++;
    return;
  }
  s->deallocs++;
  for (i = 0; i < STORE_MAX; i++)
    if (s->id[i] == id && s->buf[i]) {
      ipcref_buf_release(s->buf[i]);
      s->buf[i] = NULL;
      return;
    }
  s->unknown++;
}

/* A store object of `n` uint32 elements 0xC0DE0000 + i; the store holds its
 * buffer, the caller one handle on the id. */
static ipcref_id store_object(store *s, ipcref_table *t, int slot, int64_t n) {
  ipcref_buf *b = NULL;
  ipcref_id id = 0;
  int64_t i;
  if (ipcref_buf_new((size_t)n * 4, &b) != IPCREF_OK) return 0;
  for (i = 0; i < n; i++)
    ((uint32_t *)ipcref_buf_data(b))[i] = 0xC0DE0000u + (uint32_t)i;
  if (ipcref_table_create(t, &id) != IPCREF_OK ||
      ipcref_table_put(t, id, 1, NULL, 0) != IPCREF_OK) {
    ipcref_buf_release(b);
    return 0;
  }
  s->id[slot] = id;
  s->buf[slot] = b;
  return id;
}

/* 1 when the 1-d uint32 view `v` reads first, first+step, ... (n of
 * them) of the object's data. */
static int reads_right(const ipcref_view *v, int64_t first, int64_t step,
                       int64_t n) {
  int64_t i;
  if (v->ndim != 1 || v->shape[0] != n) return 0;
  for (i = 0; i < n; i++) {
    const uint32_t *p = (const uint32_t *)ipcref_view_ptr(v, &i);
    if (!p || *p != 0xC0DE0000u + (uint32_t)(first + i * step)) return 0;
  }
  return 1;
}

static void test_view_pull(void) {
  store s;
  ipcref_table_hooks h;
  ipcref_table *t = NULL;
  ipcref_view src, mine, pulled, sl, again, cp;
  ipcref_id id;
  int64_t shape[1] = {1024}, zero = 0;
  long base = ta_live_now();
  ipcref_table_stats st;
  memset(&s, 0, sizeof s);
  memset(&h, 0, sizeof h);
  memset(&src, 0, sizeof src);
  memset(&mine, 0, sizeof mine);
  memset(&pulled, 0, sizeof pulled);
  memset(&sl, 0, sizeof sl);
  memset(&again, 0, sizeof again);
  memset(&cp, 0, sizeof cp);
  h.dealloc = store_dealloc;
  h.user = &s;
  CHECK_EQ(ipcref_table_new(&h, &t), IPCREF_OK);
  if (!t) return;

  /* --- the worker pulls, then drops its handle: the data stays ---------- */
  id = store_object(&s, t, 0, 1024);
  CHECK(id != 0);
  /* the worker's view of the store's data (what the transport gave it) */
  CHECK_EQ(ipcref_view_of(s.buf[0], IPCREF_U32, 1, shape, &src), IPCREF_OK);
  CHECK_EQ(ipcref_table_view(t, id, &src, &pulled), IPCREF_OK);
  CHECK_EQ(count_of(t, id), 2); /* the handle, and the pull */
  /* zero-copy: the same memory */
  CHECK(ipcref_view_ptr(&pulled, &zero) == ipcref_view_ptr(&src, &zero));
  CHECK(pulled.buf != src.buf);
  ipcref_view_release(&src); /* the worker keeps only the pull */
  /* read-only: other processes and the store see the same memory */
  CHECK(ipcref_view_data_mut(&pulled) == NULL);
  CHECK(ipcref_buf_get_mut(pulled.buf) == NULL);
  CHECK_EQ(ipcref_view_copy(&pulled, &pulled), IPCREF_EBUSY);
  /* the worker's handle goes out of scope */
  CHECK_EQ(ipcref_table_decref(t, id), IPCREF_OK);
  CHECK_EQ(s.deallocs, 0);
  CHECK_EQ(count_of(t, id), 1);
  CHECK(s.buf[0] != NULL);
  CHECK(reads_right(&pulled, 0, 1, 1024));
  /* a view derived from the pull keeps it too */
  CHECK_EQ(ipcref_view_slice(&pulled, 0, 1000, 10, -3, &sl), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&sl) == NULL);
  /* make_mut copies (the store's bytes stay as they are) */
  CHECK_EQ(ipcref_view_clone(&sl, &cp), IPCREF_OK);
  CHECK_EQ(ipcref_view_make_mut(&cp), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&cp) != NULL);
  if (ipcref_view_data_mut(&cp)) *(uint32_t *)ipcref_view_data_mut(&cp) = 7;
  ipcref_view_release(&cp);
  ipcref_view_release(&pulled);
  CHECK_EQ(s.deallocs, 0);
  CHECK_EQ(count_of(t, id), 1);
  CHECK(reads_right(&sl, 1000, -3, 330));
  /* the last view goes: the object goes, the store frees its buffer */
  ipcref_view_release(&sl);
  CHECK_EQ(s.deallocs, 1);
  CHECK(s.buf[0] == NULL);
  CHECK_EQ(s.unknown, 0);
  {
    uint64_t c = 0;
    CHECK_EQ(ipcref_table_count(t, id, &c), IPCREF_EDEAD);
  }

  /* --- several pulls of one id; the handle goes first ------------------- */
  id = store_object(&s, t, 1, 256);
  shape[0] = 256;
  CHECK_EQ(ipcref_view_of(s.buf[1], IPCREF_U32, 1, shape, &src), IPCREF_OK);
  CHECK_EQ(ipcref_view_slice(&src, 0, 16, 48, 2, &mine), IPCREF_OK);
  CHECK_EQ(ipcref_table_view(t, id, &mine, &pulled), IPCREF_OK);
  CHECK_EQ(ipcref_table_view(t, id, &src, &again), IPCREF_OK);
  CHECK_EQ(count_of(t, id), 3);
  ipcref_view_release(&src);
  ipcref_view_release(&mine);
  CHECK_EQ(ipcref_table_decref(t, id), IPCREF_OK);
  CHECK(reads_right(&pulled, 16, 2, 16));
  ipcref_view_release(&again);
  CHECK_EQ(s.deallocs, 1);
  CHECK(reads_right(&pulled, 16, 2, 16));
  /* a pull of a dead id: EDEAD, a violation */
  st = stats_of(t);
  {
    ipcref_view none;
    ipcref_id dead = s.id[0];
    memset(&none, 0, sizeof none);
    CHECK_EQ(ipcref_table_view(t, dead, &pulled, &none), IPCREF_EDEAD);
    CHECK(none.buf == NULL);
    CHECK_EQ(stats_of(t).violations, st.violations + 1);
  }
  ipcref_view_release(&pulled);
  CHECK_EQ(s.deallocs, 2);
  CHECK(s.buf[1] == NULL);

#ifdef IPCREF_HAVE_SHARING
  /* --- the same from a shared buffer made here: the pull is an alias of
   * it, "itself shared"; the dealloc hook releases the store's shared
   * buffer (the context's lock must not be held then) ------------------- */
  {
    ipcref_ctx *ctx = NULL;
    ipcref_buf *sb = NULL;
    int64_t i;
    CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
    if (ctx) {
      CHECK_EQ(ipcref_shared_new(ctx, 300 * 4, &sb), IPCREF_OK);
    }
    if (sb) {
      for (i = 0; i < 300; i++)
        ((uint32_t *)ipcref_buf_data(sb))[i] = 0xC0DE0000u + (uint32_t)i;
      CHECK_EQ(ipcref_table_create(t, &id), IPCREF_OK);
      CHECK_EQ(ipcref_table_put(t, id, 2, NULL, 0), IPCREF_OK);
      s.id[3] = id;
      s.buf[3] = sb;
      shape[0] = 300;
      CHECK_EQ(ipcref_view_of(sb, IPCREF_U32, 1, shape, &src), IPCREF_OK);
      CHECK_EQ(ipcref_table_view(t, id, &src, &pulled), IPCREF_OK);
      ipcref_view_release(&src);
      CHECK(ipcref_buf_is_shared(pulled.buf));
      CHECK(ipcref_view_data_mut(&pulled) == NULL);
      CHECK(ipcref_view_ptr(&pulled, &zero) == ipcref_buf_data(sb));
      CHECK_EQ(count_of(t, id), 2);
      CHECK_EQ(ipcref_table_decref(t, id), IPCREF_OK);
      CHECK_EQ(s.deallocs, 2);
      CHECK(reads_right(&pulled, 0, 1, 300));
      CHECK_EQ(ipcref_view_slice(&pulled, 0, 7, 300, 7, &sl), IPCREF_OK);
      ipcref_view_release(&pulled);
      CHECK_EQ(s.deallocs, 2);
      CHECK(reads_right(&sl, 7, 7, 42));
      ipcref_view_release(&sl);
      CHECK_EQ(s.deallocs, 3);
      CHECK(s.buf[3] == NULL);
      CHECK_EQ(count_of(t, id), UINT64_MAX - 1); /* EDEAD */
    }
    ipcref_ctx_free(ctx);
  }
#endif

  /* --- ipcref_table_free while a pull lives ------------------------------ */
  {
    long before = s.deallocs;
    id = store_object(&s, t, 2, 512);
    shape[0] = 512;
    CHECK_EQ(ipcref_view_of(s.buf[2], IPCREF_U32, 1, shape, &src), IPCREF_OK);
    CHECK_EQ(ipcref_table_view(t, id, &src, &pulled), IPCREF_OK);
    ipcref_view_release(&src);
    CHECK_EQ(ipcref_table_decref(t, id), IPCREF_OK);
    CHECK_EQ(s.deallocs, before);
  }
  /* "Frees the table; objects still alive are forgotten without dealloc
   * calls." ... "The table stays allocated while such views live
   * (ipcref_table_free included; no hook is called after it)." */
  s.table_freed = 1;
  ipcref_table_free(t);
  CHECK(reads_right(&pulled, 0, 1, 512));
  CHECK_EQ(ipcref_view_slice(&pulled, 0, 100, 200, 1, &sl), IPCREF_OK);
  ipcref_view_release(&pulled);
  CHECK(reads_right(&sl, 100, 1, 100));
  ipcref_view_release(&sl); /* the table's memory goes now */
  CHECK_EQ(s.late, 0);      /* no hook after ipcref_table_free */
  if (s.buf[2]) {           /* the store frees what the table forgot */
    ipcref_buf_release(s.buf[2]);
    s.buf[2] = NULL;
  }
  CHECK_EQ(ta_live_now(), base);
}

/* ======================================================================== */
/* 4. Threads. */

#define TH_N    8
#define TH_BASE 16
#define TH_HOT  64
#define TH_FAM  4 /* hot objects alias only within families of 4 */

typedef struct th_shared {
  ipcref_table *t;
  ipcref_id base[TH_BASE], hot[TH_HOT];
  ipcref_id hot0;       /* hot[i] == hot0 + i */
  long holders[TH_HOT]; /* the test's own holds (atomic) */
  pthread_mutex_t mu;   /* the alias union-find, the token queue, events */
  int uf[TH_HOT];
  uint64_t queue[4096];
  ipcref_id queue_ids[4096][2];
  size_t nqueue;
  /* what the hooks heard */
  long hot_freed[TH_HOT];
  uint32_t hot_stores[TH_HOT][MAX_STORES];
  size_t hot_nstores[TH_HOT];
  long early;    /* a dealloc while the test held the object */
  long misnamed; /* a dealloc not naming the group's first id */
  long others;   /* deallocs of the threads' own objects */
  long base_freed, violations;
  /* what the threads put */
  unsigned char put_in[TH_HOT][TH_N + 4];
  ipcref_view src;
  long ops;
  long errors;
} th_shared;

static int uf_find(th_shared *s, int i) {
  while (s->uf[i] != i) i = s->uf[i];
  return i;
}

static int hot_index(th_shared *s, ipcref_id id) {
  return id >= s->hot0 && id < s->hot0 + TH_HOT ? (int)(id - s->hot0) : -1;
}

static void th_dealloc(void *user, ipcref_id id, const uint32_t *stores,
                       size_t nstores) {
  th_shared *s = (th_shared *)user;
  int h = hot_index(s, id), i;
  size_t k;
  pthread_mutex_lock(&s->mu);
  if (h >= 0) {
    int root = uf_find(s, h);
    s->hot_freed[h]++;
    for (i = 0; i < TH_HOT; i++)
      if (uf_find(s, i) == root) {
        if (__atomic_load_n(&s->holders[i], __ATOMIC_ACQUIRE) != 0) s->early++;
        if (i < h) s->misnamed++; /* not the group's first id */
      }
    s->hot_nstores[h] = nstores < MAX_STORES ? nstores : MAX_STORES;
    for (k = 0; k < s->hot_nstores[h]; k++) s->hot_stores[h][k] = stores[k];
  } else {
    for (i = 0; i < TH_BASE; i++)
      if (s->base[i] == id) break;
    if (i < TH_BASE)
      s->base_freed++;
    else
      s->others++;
  }
  pthread_mutex_unlock(&s->mu);
}

static void th_violation(void *user, ipcref_id id, ipcref_result code,
                         const char *what) {
  th_shared *s = (th_shared *)user;
  (void)id;
  (void)code;
  (void)what;
  __atomic_add_fetch(&s->violations, 1, __ATOMIC_RELAXED);
}

typedef struct th_arg {
  th_shared *s;
  int tid;
  long ops;
  long created;
} th_arg;

#define TH_ERR(s, cond)                                                        \
  do {                                                                         \
    if (!(cond)) {                                                             \
      __atomic_add_fetch(&(s)->errors, 1, __ATOMIC_RELAXED);                   \
      fprintf(stdout, "    thread check failed at line %d: %s\n", __LINE__,    \
              #cond);                                                          \
    }                                                                          \
  } while (0)

static void hold(th_shared *s, int h, long d) {
  __atomic_add_fetch(&s->holders[h], d, __ATOMIC_RELEASE);
}

static void *th_main(void *p) {
  th_arg *a = (th_arg *)p;
  th_shared *s = a->s;
  rng r;
  int extra[64], nextra = 0, i;
  ipcref_view pulls[4];
  int pull_h[4], npulls = 0;
  long op;
  r.s = 0x1234567ull * (uint64_t)(a->tid + 1);
  for (op = 0; op < a->ops; op++) {
    int h = (int)rng_below(&r, TH_HOT);
    switch (rng_below(&r, 10)) {
    case 0:
    case 1: /* a handle more, or one less */
      if (nextra < 64 && (nextra == 0 || rng_below(&r, 2))) {
        hold(s, h, 1);
        TH_ERR(s, ipcref_table_incref(s->t, s->hot[h]) == IPCREF_OK);
        extra[nextra++] = h;
      } else {
        int k = (int)rng_below(&r, (size_t)nextra);
        h = extra[k];
        extra[k] = extra[--nextra];
        hold(s, h, -1);
        TH_ERR(s, ipcref_table_decref(s->t, s->hot[h]) == IPCREF_OK);
      }
      break;
    case 2:
    case 3: { /* a message out; another thread's (maybe) comes in */
      ipcref_id ids[2];
      uint64_t tok = 0, in = 0;
      ipcref_id in_ids[2] = {0, 0};
      int have = 0;
      ids[0] = s->hot[h];
      ids[1] = s->base[rng_below(&r, TH_BASE)];
      hold(s, h, 1);
      TH_ERR(s, ipcref_table_msg_out(s->t, ids, 2, &tok) == IPCREF_OK);
      pthread_mutex_lock(&s->mu);
      if (s->nqueue < 4096) {
        s->queue[s->nqueue] = tok;
        s->queue_ids[s->nqueue][0] = ids[0];
        s->queue_ids[s->nqueue][1] = ids[1];
        s->nqueue++;
        tok = 0;
      }
      if (s->nqueue && rng_below(&r, 8) != 0) {
        size_t k = rng_below(&r, s->nqueue);
        in = s->queue[k];
        in_ids[0] = s->queue_ids[k][0];
        s->nqueue--;
        s->queue[k] = s->queue[s->nqueue];
        s->queue_ids[k][0] = s->queue_ids[s->nqueue][0];
        s->queue_ids[k][1] = s->queue_ids[s->nqueue][1];
        have = 1;
      }
      pthread_mutex_unlock(&s->mu);
      if (tok) { /* the queue was full: drop our own */
        hold(s, h, -1);
        TH_ERR(s, ipcref_table_msg_cancel(s->t, tok) == IPCREF_OK);
      }
      if (have) {
        hold(s, hot_index(s, in_ids[0]), -1);
        if (rng_below(&r, 4))
          TH_ERR(s, ipcref_table_msg_in(s->t, in) == IPCREF_OK);
        else
          TH_ERR(s, ipcref_table_msg_cancel(s->t, in) == IPCREF_OK);
      }
      break;
    }
    case 4:                         /* another store holds a hot object */
      s->put_in[h][a->tid + 4] = 1; /* this thread's own cell */
      TH_ERR(s, ipcref_table_put(s->t, s->hot[h], (uint32_t)(a->tid + 4), NULL,
                                 0) == IPCREF_OK);
      break;
    case 5: /* two hot objects of a family are one (both held by us) */
      if (rng_below(&r, 4000) == 0) {
        int o = (h / TH_FAM) * TH_FAM + (int)rng_below(&r, TH_FAM);
        pthread_mutex_lock(&s->mu);
        {
          int ra = uf_find(s, h), rb = uf_find(s, o);
          if (ra != rb) s->uf[ra > rb ? ra : rb] = ra < rb ? ra : rb;
        }
        pthread_mutex_unlock(&s->mu);
        TH_ERR(s, ipcref_table_alias(s->t, s->hot[h], s->hot[o]) == IPCREF_OK);
      }
      break;
    case 6:
    case 7: { /* a container of our own, holding shared ids, and gone */
      ipcref_id l = 0, l2 = 0, c[3];
      uint64_t tok = 0;
      c[0] = s->hot[h];
      c[1] = s->base[rng_below(&r, TH_BASE)];
      c[2] = s->base[rng_below(&r, TH_BASE)];
      TH_ERR(s, ipcref_table_create(s->t, &l) == IPCREF_OK);
      TH_ERR(s, ipcref_table_put(s->t, l, (uint32_t)a->tid, c, 3) == IPCREF_OK);
      a->created++;
      if (rng_below(&r, 2)) { /* aliased to another of ours */
        TH_ERR(s, ipcref_table_create(s->t, &l2) == IPCREF_OK);
        TH_ERR(s, ipcref_table_alias(s->t, l2, l) == IPCREF_OK);
        TH_ERR(s, ipcref_table_msg_out(s->t, &l2, 1, &tok) == IPCREF_OK);
        TH_ERR(s, ipcref_table_decref(s->t, l2) == IPCREF_OK);
      }
      TH_ERR(s, ipcref_table_decref(s->t, l) == IPCREF_OK);
      if (tok) TH_ERR(s, ipcref_table_msg_in(s->t, tok) == IPCREF_OK);
      break;
    }
    case 8: /* a pull */
      if (npulls < 4) {
        memset(&pulls[npulls], 0, sizeof pulls[npulls]);
        hold(s, h, 1);
        TH_ERR(s, ipcref_table_view(s->t, s->hot[h], &s->src, &pulls[npulls]) ==
                      IPCREF_OK);
        pull_h[npulls++] = h;
      } else {
        int k = (int)rng_below(&r, 4);
        hold(s, pull_h[k], -1);
        ipcref_view_release(&pulls[k]);
        pulls[k] = pulls[--npulls];
        pull_h[k] = pull_h[npulls];
      }
      break;
    default: { /* reads */
      uint64_t c = 0;
      ipcref_table_stats st;
      TH_ERR(s, ipcref_table_count(s->t, s->hot[h], &c) == IPCREF_OK && c >= 1);
      TH_ERR(s, ipcref_table_get_stats(s->t, &st) == IPCREF_OK);
      break;
    }
    }
  }
  while (npulls) {
    npulls--;
    hold(s, pull_h[npulls], -1);
    ipcref_view_release(&pulls[npulls]);
  }
  while (nextra) {
    nextra--;
    hold(s, extra[nextra], -1);
    TH_ERR(s, ipcref_table_decref(s->t, s->hot[extra[nextra]]) == IPCREF_OK);
  }
  /* this thread's own handle on every hot object: the last one frees */
  for (i = 0; i < TH_HOT; i++) {
    hold(s, i, -1);
    TH_ERR(s, ipcref_table_decref(s->t, s->hot[i]) == IPCREF_OK);
  }
  return NULL;
}

static void test_threads(void) {
  th_shared *s = (th_shared *)calloc(1, sizeof *s);
  ipcref_table_hooks hk;
  pthread_t th[TH_N];
  th_arg args[TH_N];
  ipcref_buf *b = NULL;
  int64_t shape[1] = {16};
  long per_thread = opt_ops / 10, created = 0, groups = 0;
  int i, j;
  double t0 = now_s();
  ipcref_table_stats st;
  if (!s) abort();
  if (per_thread < 2000) per_thread = 2000;
  if (under_valgrind) per_thread = 10000;
  memset(&hk, 0, sizeof hk);
  hk.dealloc = th_dealloc;
  hk.violation = th_violation;
  hk.user = s;
  pthread_mutex_init(&s->mu, NULL);
  CHECK_EQ(ipcref_table_new(&hk, &s->t), IPCREF_OK);
  if (!s->t) return;
  CHECK_EQ(ipcref_buf_new(64, &b), IPCREF_OK);
  CHECK_EQ(ipcref_view_of(b, IPCREF_U32, 1, shape, &s->src), IPCREF_OK);
  ipcref_buf_release(b);
  for (i = 0; i < TH_BASE; i++)
    CHECK_EQ(ipcref_table_create(s->t, &s->base[i]), IPCREF_OK);
  for (i = 0; i < TH_HOT; i++) {
    ipcref_id c[2];
    CHECK_EQ(ipcref_table_create(s->t, &s->hot[i]), IPCREF_OK);
    if (i == 0) s->hot0 = s->hot[0];
    CHECK_EQ(s->hot[i], s->hot0 + (ipcref_id)i);
    for (j = 1; j < TH_N; j++)
      CHECK_EQ(ipcref_table_incref(s->t, s->hot[i]), IPCREF_OK);
    s->holders[i] = TH_N;
    s->uf[i] = i;
    c[0] = s->base[i % TH_BASE];
    c[1] = s->base[(i + 1) % TH_BASE];
    CHECK_EQ(ipcref_table_put(s->t, s->hot[i], (uint32_t)(i % 4), c, 2),
             IPCREF_OK);
    s->put_in[i][i % 4] = 1;
  }
  for (i = 0; i < TH_N; i++) {
    args[i].s = s;
    args[i].tid = i;
    args[i].ops = per_thread;
    args[i].created = 0;
    CHECK_EQ(pthread_create(&th[i], NULL, th_main, &args[i]), 0);
  }
  for (i = 0; i < TH_N; i++) {
    pthread_join(th[i], NULL);
    created += args[i].created;
  }
  /* the messages still queued */
  for (i = 0; i < (int)s->nqueue; i++) {
    hold(s, hot_index(s, s->queue_ids[i][0]), -1);
    CHECK_EQ(ipcref_table_msg_in(s->t, s->queue[i]), IPCREF_OK);
  }
  CHECK_EQ(s->errors, 0);
  CHECK_EQ(s->early, 0);
  CHECK_EQ(s->misnamed, 0);
  CHECK_EQ(s->violations, 0);
  CHECK_EQ(s->others, created);
  /* every hot group freed once, named by its first id, with every store */
  for (i = 0; i < TH_HOT; i++) {
    int root = uf_find(s, i);
    if (root == i) {
      uint32_t want[MAX_STORES], got[MAX_STORES];
      size_t nw = 0, ng, k;
      groups++;
      CHECK_EQ(s->hot_freed[i], 1);
      for (j = 0; j < TH_HOT; j++) {
        if (uf_find(s, j) != root) continue;
        for (k = 0; k < TH_N + 4; k++)
          if (s->put_in[j][k]) want[nw++] = (uint32_t)k;
        nw = set_u32(want, nw);
      }
      memcpy(got, s->hot_stores[i], s->hot_nstores[i] * sizeof *got);
      ng = set_u32(got, s->hot_nstores[i]);
      CHECK(ng == nw && memcmp(got, want, nw * sizeof *got) == 0);
    } else {
      CHECK_EQ(s->hot_freed[i], 0);
    }
  }
  /* no lost update: the base objects are back to the main thread's handle */
  for (i = 0; i < TH_BASE; i++) CHECK_EQ(count_of(s->t, s->base[i]), 1);
  st = stats_of(s->t);
  CHECK_EQ(st.ids, TH_BASE);
  CHECK_EQ(st.objects, TH_BASE);
  CHECK_EQ(st.messages, 0);
  for (i = 0; i < TH_BASE; i++)
    CHECK_EQ(ipcref_table_decref(s->t, s->base[i]), IPCREF_OK);
  CHECK_EQ(s->base_freed, TH_BASE);
  st = stats_of(s->t);
  CHECK_EQ(st.ids, 0);
  CHECK_EQ(st.objects, 0);
  CHECK_EQ(st.deallocs, (uint64_t)(created + groups + TH_BASE));
  CHECK_EQ(st.violations, 0);
  printf("    %d threads x %ld ops: %ld containers, %ld hot groups, %.2f s\n",
         TH_N, per_thread, created, groups, now_s() - t0);
  ipcref_view_release(&s->src);
  ipcref_table_free(s->t);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ======================================================================== */
/* 5. Wrong arguments. */

typedef struct snap {
  ipcref_table_stats st;
  uint64_t c[4];
} snap;

static snap snap_of(ipcref_table *t, const ipcref_id *ids) {
  snap s;
  int i;
  memset(&s, 0, sizeof s);
  s.st = stats_of(t);
  for (i = 0; i < 4; i++) s.c[i] = count_of(t, ids[i]);
  return s;
}

/* `call` returns `code` and changes nothing; `viol` violations reported
 * (1 exactly where the doc says the id was never handed out). */
#define ARG_FAILS(want_, viol, call)                                           \
  do {                                                                         \
    snap a_before_ = snap_of(t, ids), a_after_;                                \
    size_t a_nv_ = rec.nv;                                                     \
    ipcref_result a_rc_ = (call);                                              \
    a_after_ = snap_of(t, ids);                                                \
    if (a_rc_ != (want_)) {                                                    \
      printf("    %s: %d, want %d\n", #call, (int)a_rc_, (int)(want_));        \
      harness_failures_in_test++;                                              \
    }                                                                          \
    a_before_.st.violations += (viol);                                         \
    if (memcmp(&a_before_, &a_after_, sizeof a_after_) != 0) {                 \
      printf("    %s changed something (violations %llu -> %llu)\n", #call,    \
             (unsigned long long)(a_before_.st.violations - (viol)),           \
             (unsigned long long)a_after_.st.violations);                      \
      harness_failures_in_test++;                                              \
    }                                                                          \
    if (rec.nv - a_nv_ != (size_t)(viol) ||                                    \
        ((viol) && rec.v[rec.nv - 1].code != IPCREF_EINVAL)) {                 \
      printf("    %s: %zu violations told\n", #call, rec.nv - a_nv_);          \
      harness_failures_in_test++;                                              \
    }                                                                          \
    CHECK_EQ(rec.nd, 0);                                                       \
  } while (0)

static void test_args(void) {
  recorder rec;
  ipcref_table *t, *t2 = (ipcref_table *)0x1;
  ipcref_id ids[4], a, b, c, d, x = 77, bad[2];
  uint64_t tok = 0, tok2 = 0, cnt = 0;
  ipcref_view src, out, broken;
  ipcref_buf *buf = NULL;
  int64_t shape[1] = {8};
  ipcref_table_stats st;
  long base = ta_live_now();
  memset(&rec, 0, sizeof rec);
  memset(&out, 0, sizeof out);
  t = new_table(&rec);
  CHECK(t != NULL);
  if (!t) return;
  /* ipcref_table_new */
  CHECK_EQ(ipcref_table_new(NULL, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_table_new(NULL, &t2), IPCREF_OK); /* NULL hooks: none */
  CHECK(t2 != NULL && t2 != (ipcref_table *)0x1);
  ipcref_table_free(t2);
  ipcref_table_free(NULL);
  /* a state to keep unchanged: a, b aliased, c holds a, d in a message */
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &d), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, a, b), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, c, 3, &a, 1), IPCREF_OK);
  CHECK_EQ(ipcref_table_msg_out(t, &d, 1, &tok), IPCREF_OK);
  ids[0] = a;
  ids[1] = b;
  ids[2] = c;
  ids[3] = d;
  CHECK_EQ(ipcref_buf_new(32, &buf), IPCREF_OK);
  CHECK_EQ(ipcref_view_of(buf, IPCREF_U32, 1, shape, &src), IPCREF_OK);
  ipcref_buf_release(buf);

  /* create */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_create(NULL, &x));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_create(t, NULL));
  CHECK_EQ(x, 77);
  /* incref / decref: NULL table; id 0 and ids never handed out */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_incref(NULL, a));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_decref(NULL, a));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_incref(t, 0));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_decref(t, 0));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_incref(t, d + 1));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_decref(t, d + 1));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_incref(t, UINT64_MAX));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_decref(t, UINT64_MAX));
  /* put */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_put(NULL, d, 1, NULL, 0));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_put(t, 0, 1, NULL, 0));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_put(t, d + 5, 1, NULL, 0));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_put(t, d, 1, NULL, 2));
  bad[0] = a;
  bad[1] = 0; /* contained id 0 */
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_put(t, d, 1, bad, 2));
  bad[1] = d + 9; /* contained id never handed out */
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_put(t, d, 1, bad, 2));
  /* "an object cannot contain its own id" */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_put(t, d, 1, &d, 1));
  /* a second put with contents (c was put holding a) */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_put(t, c, 4, &b, 1));
  /* msg_out */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_out(NULL, &a, 1, &tok2));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_out(t, &a, 1, NULL));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_out(t, NULL, 1, &tok2));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_msg_out(t, bad, 2, &tok2));
  bad[1] = 0;
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_msg_out(t, bad, 2, &tok2));
  CHECK_EQ(tok2, 0);
  /* msg_in / msg_cancel: tokens never issued */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_in(NULL, tok));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_cancel(NULL, tok));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_in(t, 0));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_cancel(t, 0));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_in(t, tok + 1000));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_msg_cancel(t, UINT64_MAX));
  /* alias */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_alias(NULL, a, c));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_alias(t, 0, c));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_alias(t, c, 0));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_alias(t, c, d + 3));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_alias(t, UINT64_MAX, c));
  /* count: a query, not a breach */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_count(NULL, a, &cnt));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_count(t, a, NULL));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_count(t, 0, &cnt));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_count(t, d + 1, &cnt));
  /* view */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_view(NULL, a, &src, &out));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_view(t, a, NULL, &out));
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_view(t, a, &src, NULL));
  broken = src;
  broken.shape[0] = 9; /* past the buffer's end */
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_view(t, a, &broken, &out));
  broken = src;
  broken.buf = NULL;
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_view(t, a, &broken, &out));
  broken = src;
  broken.ndim = IPCREF_MAX_DIMS + 1;
  ARG_FAILS(IPCREF_EINVAL, 0, ipcref_table_view(t, a, &broken, &out));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_view(t, 0, &src, &out));
  ARG_FAILS(IPCREF_EINVAL, 1, ipcref_table_view(t, d + 1, &src, &out));
  CHECK(out.buf == NULL);
  CHECK_EQ(ipcref_buf_strong_count(src.buf), 1);
  /* stats */
  CHECK_EQ(ipcref_table_get_stats(NULL, &st), IPCREF_EINVAL);
  CHECK_EQ(ipcref_table_get_stats(t, NULL), IPCREF_EINVAL);
  /* n == 0 with NULL arrays is an empty list */
  {
    uint64_t empty = 0;
    st = stats_of(t);
    CHECK_EQ(ipcref_table_msg_out(t, NULL, 0, &empty), IPCREF_OK);
    CHECK_EQ(stats_of(t).messages, st.messages + 1);
    CHECK(empty != tok);
    CHECK_EQ(ipcref_table_msg_in(t, empty), IPCREF_OK);
    CHECK_EQ(ipcref_table_put(t, d, 6, NULL, 0), IPCREF_OK);
    CHECK_EQ(count_of(t, d), 2);
  }
  /* the violation hook heard each id never handed out, with EINVAL */
  {
    size_t i, bad_code = 0;
    for (i = 0; i < rec.nv; i++)
      if (rec.v[i].code != IPCREF_EINVAL) bad_code++;
    CHECK_EQ(bad_code, 0);
  }
  /* everything goes as it should after all that */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_msg_in(t, tok), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
  CHECK_EQ(rec.nd, 1);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);
  CHECK_EQ(rec.nd, 1); /* c still holds a */
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(rec.nd, 3);
  {
    uint32_t sc = 3, sd[2] = {6};
    CHECK(stores_are(&rec, c, &sc, 1));
    CHECK(stores_are(&rec, a, NULL, 0));
    CHECK(stores_are(&rec, d, sd, 1));
  }
  st = stats_of(t);
  CHECK_EQ(st.ids, 0);
  CHECK_EQ(st.objects, 0);
  ipcref_view_release(&src);
  ipcref_table_free(t);
  rec_fini(&rec);
  CHECK_EQ(ta_live_now(), base);
}

/* ======================================================================== */
/* 6. One rule at a time. */

static void hook_decref_extra(recorder *r, ipcref_id id) {
  ipcref_id *pair = (ipcref_id *)r->extra;
  /* the hook of pair[0] drops pair[1]: a call back into the table */
  if (id == pair[0] && pair[1]) {
    ipcref_id other = pair[1];
    pair[1] = 0;
    if (ipcref_table_decref(r->t, other) != IPCREF_OK) r->hook_count_wrong++;
  }
}

static void test_semantics(void) {
  recorder rec;
  ipcref_table *t;
  ipcref_id a, b, c, d, e, x, y, cont[3];
  uint64_t tok, tok2;
  ipcref_table_stats st;
  long base = ta_live_now();
  memset(&rec, 0, sizeof rec);
  rec.check_dead_in_hook = 1;
  t = new_table(&rec);
  if (!t) return;

  /* "counts stay per id, and the object is deallocated only when every id
   * naming it is at zero"; the hook names "the first id of the group and
   * every store either was put in" */
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, a, 10, NULL, 0), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, c, 30, NULL, 0), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, c, 31, NULL, 0), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, c, 30, NULL, 0), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, c, b), IPCREF_OK); /* {b, c} */
  CHECK_EQ(ipcref_table_alias(t, b, a), IPCREF_OK); /* {a, b, c}: first a */
  CHECK_EQ(ipcref_table_alias(t, a, c), IPCREF_OK); /* already one */
  CHECK_EQ(ipcref_table_alias(t, b, b), IPCREF_OK);
  st = stats_of(t);
  CHECK_EQ(st.ids, 3);
  CHECK_EQ(st.objects, 1);
  CHECK_EQ(count_of(t, a), 1);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(rec.nd, 0);
  CHECK_EQ(count_of(t, a), 0); /* alive at zero: b holds the object */
  CHECK_EQ(ipcref_table_incref(t, a), IPCREF_OK); /* and usable */
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_EDEAD); /* below zero */
  CHECK_EQ(stats_of(t).violations, 1);
  CHECK_EQ(rec.nv, 1);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);
  CHECK_EQ(rec.nd, 1);
  {
    uint32_t want[3] = {10, 30, 31};
    CHECK(rec.nd == 1 && rec.d[0].id == a);
    CHECK(stores_are(&rec, a, want, 3));
  }
  CHECK_EQ(rec.hook_count_wrong, 0);
  /* a dead object's ids are dead for good */
  CHECK_EQ(ipcref_table_incref(t, b), IPCREF_EDEAD);
  CHECK_EQ(ipcref_table_put(t, c, 1, NULL, 0), IPCREF_EDEAD);
  CHECK_EQ(ipcref_table_msg_out(t, &a, 1, &tok), IPCREF_EDEAD);
  CHECK_EQ(stats_of(t).violations, 4);

  /* the first id when the smaller group holds it: merge order does not
   * matter */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &d), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, b, c), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, d, c), IPCREF_OK); /* {b,c,d} */
  CHECK_EQ(ipcref_table_alias(t, d, a), IPCREF_OK); /* + {a} */
  CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(rec.nd, 0);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK(rec.nd == 1 && rec.d[0].id == a);

  /* an alias that finds one side deallocated: EDEAD, a violation */
  rec_clear(&rec);
  st = stats_of(t);
  CHECK_EQ(ipcref_table_create(t, &e), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, e, a), IPCREF_EDEAD);
  CHECK_EQ(ipcref_table_alias(t, b, e), IPCREF_EDEAD);
  CHECK_EQ(stats_of(t).violations, st.violations + 2);
  CHECK(rec.nv == 2 && rec.v[0].id == a && rec.v[0].code == IPCREF_EDEAD &&
        rec.v[1].id == b);
  CHECK_EQ(stats_of(t).objects, st.objects + 1);

  /* contained ids: each entry counted; all back when the container goes */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
  cont[0] = e;
  cont[1] = e;
  cont[2] = e;
  CHECK_EQ(ipcref_table_put(t, x, 1, cont, 3), IPCREF_OK);
  CHECK_EQ(count_of(t, e), 4);
  CHECK_EQ(ipcref_table_put(t, x, 2, NULL, 0), IPCREF_OK); /* a store more */
  CHECK_EQ(ipcref_table_put(t, x, 3, cont, 1), IPCREF_EINVAL);
  CHECK_EQ(count_of(t, e), 4);
  CHECK_EQ(ipcref_table_decref(t, e), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, x), IPCREF_OK); /* x, then e */
  CHECK_EQ(rec.nd, 2);
  {
    uint32_t want[2] = {1, 2};
    CHECK(stores_are(&rec, x, want, 2));
    CHECK(find_dealloc(&rec, e) != NULL);
  }

  /* messages: exactly once; a second msg_in or msg_cancel is EINVAL, and
   * (the rules) "a count never goes below zero (decref, msg_in of a spent
   * message)": a breach, "reported to the violation hook" */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  cont[0] = a;
  cont[1] = a;
  CHECK_EQ(ipcref_table_msg_out(t, cont, 2, &tok), IPCREF_OK);
  CHECK_EQ(ipcref_table_msg_out(t, cont, 1, &tok2), IPCREF_OK);
  CHECK(tok != tok2);
  CHECK_EQ(count_of(t, a), 4);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK); /* only messages hold it */
  CHECK_EQ(ipcref_table_msg_in(t, tok), IPCREF_OK);
  CHECK_EQ(count_of(t, a), 1);
  st = stats_of(t);
  CHECK_EQ(ipcref_table_msg_in(t, tok), IPCREF_EINVAL);
  CHECK_EQ(ipcref_table_msg_cancel(t, tok), IPCREF_EINVAL);
  CHECK_EQ(count_of(t, a), 1);
  CHECK_EQ(rec.nd, 0);
  CHECK_EQ(stats_of(t).violations, st.violations + 2);
  CHECK_EQ(rec.nv, 2);
  CHECK_EQ(ipcref_table_msg_cancel(t, tok2), IPCREF_OK);
  CHECK(rec.nd == 1 && rec.d[0].id == a);
  CHECK_EQ(ipcref_table_msg_in(t, tok2), IPCREF_EINVAL);
  CHECK_EQ(stats_of(t).violations, st.violations + 3);

  /* A count that would go below zero through a container: the caller
   * dropped a reference the container held (c's count is per id: the
   * table cannot tell). When the container goes, c is at zero: "a count
   * never goes below zero" (a breach, reported, "changes nothing: never an
   * early free") -- so d, which names the same object and still has its
   * handle, keeps it alive. */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &d), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, c, d), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, x, 1, &c, 1), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK); /* the handle */
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK); /* x's reference, stolen */
  CHECK_EQ(count_of(t, c), 0);
  st = stats_of(t);
  CHECK_EQ(ipcref_table_decref(t, x), IPCREF_OK);
  CHECK(find_dealloc(&rec, x) != NULL);
  CHECK(find_dealloc(&rec, c) == NULL); /* d's handle holds it */
  CHECK_EQ(count_of(t, c), 0);
  CHECK_EQ(count_of(t, d), 1);
  CHECK_EQ(stats_of(t).violations, st.violations + 1);
  if (find_dealloc(&rec, c) == NULL) {
    CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
    CHECK(find_dealloc(&rec, c) != NULL);
  }
  /* the same, when the object lives on anyway: c's count stays at zero
   * (it does not wrap around) */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &d), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
  CHECK_EQ(ipcref_table_incref(t, d), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, c, d), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, x, 1, &c, 1), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK); /* x's reference, stolen */
  st = stats_of(t);
  CHECK_EQ(ipcref_table_decref(t, x), IPCREF_OK);
  CHECK_EQ(rec.nd, 1); /* x only */
  CHECK_EQ(count_of(t, c), 0);
  CHECK_EQ(count_of(t, d), 2);
  CHECK_EQ(stats_of(t).violations, st.violations + 1);
  CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
  CHECK_EQ(rec.nd, 1);
  CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
  CHECK_EQ(rec.nd, 2); /* c's object, named c, now */
  CHECK(find_dealloc(&rec, c) != NULL);
  if (find_dealloc(&rec, c) == NULL) { /* leaked: drop it for the leak check */
    rec_clear(&rec);
    while (count_of(t, d) > 0 && count_of(t, d) < UINT64_MAX - 1 &&
           ipcref_table_decref(t, d) == IPCREF_OK) {
    }
  }
  /* the same through a message */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &d), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, d, c), IPCREF_OK);
  CHECK_EQ(ipcref_table_msg_out(t, &c, 1, &tok), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK); /* the message's, stolen */
  st = stats_of(t);
  (void)ipcref_table_msg_in(t, tok); /* the code is not specified */
  CHECK(find_dealloc(&rec, c) == NULL);
  CHECK_EQ(count_of(t, c), 0);
  CHECK_EQ(count_of(t, d), 1);
  CHECK_EQ(stats_of(t).violations, st.violations + 1);
  if (find_dealloc(&rec, c) == NULL) {
    CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
    CHECK(find_dealloc(&rec, c) != NULL);
  }

  /* hooks may call back into the table: the dealloc of x drops y */
  rec_clear(&rec);
  {
    ipcref_id pair[2];
    CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
    CHECK_EQ(ipcref_table_create(t, &y), IPCREF_OK);
    pair[0] = x;
    pair[1] = y;
    rec.extra = pair;
    rec.on_dealloc = hook_decref_extra;
    CHECK_EQ(ipcref_table_decref(t, x), IPCREF_OK);
    CHECK_EQ(rec.nd, 2);
    CHECK(find_dealloc(&rec, y) != NULL);
    rec.on_dealloc = NULL;
    rec.extra = NULL;
  }
  CHECK_EQ(rec.hook_count_wrong, 0);
  st = stats_of(t);
  CHECK_EQ(st.ids, 0);
  CHECK_EQ(st.objects, 0);
  CHECK_EQ(st.messages, 0);
  ipcref_table_free(t);
  rec_fini(&rec);
  CHECK_EQ(ta_live_now(), base);
}

/* ======================================================================== */
/* 6b. Misuse met by a container's deallocation is reported as the same
 * misuse met by a decref: the violation hook hears the contained id with
 * the code decref gives for it (EDEAD), once per reference that would go
 * below zero, stats.violations counts it, and the rest goes on as the
 * rules say (the other contained ids lose their reference, nothing is
 * freed early, nothing leaks). The caller breaks the rule by dropping a
 * reference a container holds: counts are per id, so the table cannot
 * tell whose reference a decref takes until the container goes. */

static void test_misuse_contained(void) {
  recorder rec;
  ipcref_table *t;
  ipcref_id a, b, c, d, x, y, p, q, cont[3];
  ipcref_table_stats st, st2;
  ipcref_result want_code = IPCREF_EDEAD;
  int order;
  long base = ta_live_now();
  memset(&rec, 0, sizeof rec);
  rec.check_dead_in_hook = 1;
  t = new_table(&rec);
  if (!t) return;

  /* what the decref path reports for an id already deallocated */
  CHECK_EQ(ipcref_table_create(t, &d), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
  rec_clear(&rec);
  st = stats_of(t);
  CHECK_EQ(ipcref_table_decref(t, d), IPCREF_EDEAD);
  CHECK(rec.nv == 1 && rec.v[0].id == d);
  if (rec.nv == 1) want_code = rec.v[0].code;
  CHECK_EQ(want_code, IPCREF_EDEAD);
  CHECK_EQ(stats_of(t).violations, st.violations + 1);

  /* x holds a and b; a's handle goes, then one decref more: x's
   * reference, so a is deallocated now */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
  cont[0] = a;
  cont[1] = b;
  CHECK_EQ(ipcref_table_put(t, x, 7, cont, 2), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK); /* x's reference */
  CHECK(rec.nd == 1 && rec.d[0].id == a);
  CHECK_EQ(rec.nv, 0);
  /* x goes and meets a dead: reported once, as decref reports it */
  rec_clear(&rec);
  st = stats_of(t);
  CHECK_EQ(ipcref_table_decref(t, x), IPCREF_OK);
  CHECK(rec.nd == 1 && rec.d[0].id == x);
  CHECK_EQ(rec.nv, 1);
  CHECK(rec.nv == 1 && rec.v[0].id == a && rec.v[0].code == want_code);
  st2 = stats_of(t);
  CHECK_EQ(st2.violations, st.violations + 1);
  CHECK_EQ(st2.deallocs, st.deallocs + 1);
  CHECK_EQ(st2.ids, st.ids - 1);
  CHECK_EQ(st2.objects, st.objects - 1);
  /* b lost x's reference and nothing more: alive on its handle */
  CHECK(find_dealloc(&rec, b) == NULL);
  CHECK_EQ(count_of(t, b), 1);
  CHECK_EQ(count_of(t, a), UINT64_MAX - 1); /* still dead */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);
  CHECK(rec.nd == 1 && rec.d[0].id == b);
  CHECK_EQ(rec.nv, 0);

  /* a container holding a dead id twice: two references below zero, two
   * reports */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
  cont[0] = a;
  cont[1] = b;
  cont[2] = a;
  CHECK_EQ(ipcref_table_put(t, x, 7, cont, 3), IPCREF_OK);
  CHECK_EQ(count_of(t, a), 3);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK); /* both of x's */
  CHECK(rec.nd == 1 && rec.d[0].id == a);
  rec_clear(&rec);
  st = stats_of(t);
  CHECK_EQ(ipcref_table_decref(t, x), IPCREF_OK);
  CHECK(rec.nd == 1 && rec.d[0].id == x);
  CHECK(rec.nv == 2 && rec.v[0].id == a && rec.v[0].code == want_code &&
        rec.v[1].id == a && rec.v[1].code == want_code);
  CHECK_EQ(stats_of(t).violations, st.violations + 2);
  CHECK_EQ(count_of(t, b), 1);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);

  /* deep in a cascade: y holds x, x holds c and b; c was dropped once too
   * often; y's last reference frees y, then x, which meets c dead */
  rec_clear(&rec);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &y), IPCREF_OK);
  cont[0] = c;
  cont[1] = b;
  CHECK_EQ(ipcref_table_put(t, x, 1, cont, 2), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, y, 2, &x, 1), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, x), IPCREF_OK); /* only y holds x */
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK); /* x's reference */
  CHECK(rec.nd == 1 && rec.d[0].id == c);
  rec_clear(&rec);
  st = stats_of(t);
  CHECK_EQ(ipcref_table_decref(t, y), IPCREF_OK);
  CHECK_EQ(rec.nd, 2);
  CHECK(find_dealloc(&rec, y) != NULL && find_dealloc(&rec, x) != NULL);
  CHECK(rec.nv == 1 && rec.v[0].id == c && rec.v[0].code == want_code);
  st2 = stats_of(t);
  CHECK_EQ(st2.violations, st.violations + 1);
  CHECK_EQ(st2.deallocs, st.deallocs + 2);
  CHECK_EQ(st2.ids, st.ids - 2);
  CHECK_EQ(count_of(t, b), 1);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);

  /* an object holding an id of its own alias group (p holds q, p and q
   * aliased): q's reference was dropped too, so when the object goes,
   * q is at zero or already gone, depending on which of its ids the
   * table lets go of first. Reported either way. */
  for (order = 0; order < 2; order++) {
    rec_clear(&rec);
    CHECK_EQ(ipcref_table_create(t, &p), IPCREF_OK);
    CHECK_EQ(ipcref_table_create(t, &q), IPCREF_OK);
    if (order)
      CHECK_EQ(ipcref_table_alias(t, q, p), IPCREF_OK);
    else
      CHECK_EQ(ipcref_table_alias(t, p, q), IPCREF_OK);
    CHECK_EQ(ipcref_table_put(t, p, 3, &q, 1), IPCREF_OK);
    CHECK_EQ(ipcref_table_decref(t, q), IPCREF_OK);
    CHECK_EQ(ipcref_table_decref(t, q), IPCREF_OK); /* p's reference */
    CHECK_EQ(rec.nd, 0);
    st = stats_of(t);
    CHECK_EQ(ipcref_table_decref(t, p), IPCREF_OK);
    CHECK(rec.nd == 1 && rec.d[0].id == p);
    if (rec.nv != 1 || rec.v[0].id != q || rec.v[0].code != want_code) {
      printf("    alias(%s): %zu violations told for q\n",
             order ? "q, p" : "p, q", rec.nv);
      harness_failures_in_test++;
    }
    CHECK_EQ(stats_of(t).violations, st.violations + 1);
  }

  /* afterwards: everything consistent, nothing left, nothing leaked */
  CHECK_EQ(rec.hook_count_wrong, 0);
  st = stats_of(t);
  CHECK_EQ(st.ids, 0);
  CHECK_EQ(st.objects, 0);
  CHECK_EQ(st.messages, 0);
  ipcref_table_free(t);
  rec_fini(&rec);
  CHECK_EQ(ta_live_now(), base);
}

/* A breach is told even when no memory can be had, and telling it tries
 * no allocation (freeing meets breaches, and freeing never allocates):
 * every path that meets one before allocating anything, with every
 * allocation failing. */
static void test_misuse_no_alloc(void) {
  recorder rec;
  ipcref_table *t;
  ipcref_id a, b, c, d, w, x, z;
  uint64_t tok = 0, spent = 0;
  ipcref_view src, pv;
  ipcref_buf *buf = NULL;
  int64_t shape[1] = {4};
  ipcref_table_stats st;
  size_t nv;
  long base = ta_live_now();
  memset(&rec, 0, sizeof rec);
  t = new_table(&rec);
  if (!t) return;
  CHECK_EQ(ipcref_buf_new(16, &buf), IPCREF_OK);
  CHECK_EQ(ipcref_view_of(buf, IPCREF_U32, 1, shape, &src), IPCREF_OK);
  ipcref_buf_release(buf);
  /* d dead; z at zero, its object alive through w */
  CHECK_EQ(ipcref_table_create(t, &d), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, d), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &z), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &w), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, z, w), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, z), IPCREF_OK);
  /* a, b, c dead, their references in x, a message and a pull taken */
  CHECK_EQ(ipcref_table_create(t, &a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &x), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, x, 1, &a, 1), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, a), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &b), IPCREF_OK);
  CHECK_EQ(ipcref_table_msg_out(t, &b, 1, &tok), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, b), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &c), IPCREF_OK);
  CHECK_EQ(ipcref_table_view(t, c, &src, &pv), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(ipcref_table_decref(t, c), IPCREF_OK);
  CHECK_EQ(ipcref_table_msg_out(t, NULL, 0, &spent), IPCREF_OK);
  CHECK_EQ(ipcref_table_msg_in(t, spent), IPCREF_OK);
  rec.nv = 0;
  rec.capv = 64; /* the recorder's own room, made now */
  rec.v = (ev_violation *)realloc(rec.v, rec.capv * sizeof *rec.v);
  if (!rec.v) abort();
  rec_clear(&rec);
  st = stats_of(t);
  ta_fail_all = 1;
#define TOLD(call, want, id_)                                                  \
  do {                                                                         \
    nv = rec.nv;                                                               \
    CHECK_EQ((call), (want));                                                  \
    CHECK(rec.nv == nv + 1 && rec.v[nv].id == (id_));                          \
  } while (0)
  TOLD(ipcref_table_decref(t, d), IPCREF_EDEAD, d);
  TOLD(ipcref_table_incref(t, d), IPCREF_EDEAD, d);
  TOLD(ipcref_table_decref(t, z), IPCREF_EDEAD, z);
  TOLD(ipcref_table_decref(t, UINT64_MAX), IPCREF_EINVAL, UINT64_MAX);
  TOLD(ipcref_table_put(t, d, 1, NULL, 0), IPCREF_EDEAD, d);
  TOLD(ipcref_table_alias(t, w, d), IPCREF_EDEAD, d);
  TOLD(ipcref_table_msg_in(t, spent), IPCREF_EINVAL, 0);
  TOLD(ipcref_table_msg_in(t, tok), IPCREF_OK, b); /* the message */
  TOLD(ipcref_table_decref(t, x), IPCREF_OK, a);   /* the container */
  CHECK(rec.nd == 1 && rec.d[0].id == x);
  nv = rec.nv;
  ipcref_view_release(&pv); /* the pull */
  CHECK(rec.nv == nv + 1 && rec.v[nv].id == c);
#undef TOLD
  ta_fail_all = 0;
  CHECK_EQ(ta_failed, 0); /* nothing tried to allocate */
  CHECK_EQ(stats_of(t).violations, st.violations + 10);
  CHECK_EQ(rec.nv, 10);
  CHECK_EQ(ipcref_table_decref(t, w), IPCREF_OK);
  st = stats_of(t);
  CHECK_EQ(st.ids, 0);
  CHECK_EQ(st.objects, 0);
  CHECK_EQ(st.messages, 0);
  ipcref_view_release(&src);
  ipcref_table_free(t);
  rec_fini(&rec);
  CHECK_EQ(ta_live_now(), base);
}

/* "Frees the table; objects still alive are forgotten without dealloc
 * calls": aliases (merged in either order), containers, messages, pulls;
 * no hook, nothing left. */
static void test_free_alive(void) {
  recorder rec;
  ipcref_table *t;
  ipcref_id ids[40];
  int i;
  uint64_t tk;
  ipcref_buf *b = NULL;
  ipcref_view src, pv;
  int64_t shape[1] = {4};
  long base = ta_live_now();
  memset(&rec, 0, sizeof rec);
  t = new_table(&rec);
  if (!t) return;
  for (i = 0; i < 40; i++) CHECK_EQ(ipcref_table_create(t, &ids[i]), IPCREF_OK);
  for (i = 1; i < 20; i++)
    CHECK_EQ(ipcref_table_alias(t, ids[0], ids[i]), IPCREF_OK);
  for (i = 21; i < 30; i++)
    CHECK_EQ(ipcref_table_alias(t, ids[i], ids[20]), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, ids[35], ids[39]), IPCREF_OK);
  CHECK_EQ(ipcref_table_alias(t, ids[38], ids[36]), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, ids[30], 1, ids, 5), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, ids[31], 1, ids + 20, 3), IPCREF_OK);
  CHECK_EQ(ipcref_table_put(t, ids[31], 2, NULL, 0), IPCREF_OK);
  CHECK_EQ(ipcref_table_msg_out(t, ids + 30, 4, &tk), IPCREF_OK);
  CHECK_EQ(ipcref_buf_new(16, &b), IPCREF_OK);
  CHECK_EQ(ipcref_view_of(b, IPCREF_U32, 1, shape, &src), IPCREF_OK);
  ipcref_buf_release(b);
  CHECK_EQ(ipcref_table_view(t, ids[33], &src, &pv), IPCREF_OK);
  ipcref_view_release(&src);
  rec_clear(&rec);
  rec.freed = 1;
  ipcref_table_free(t);
  ipcref_view_release(&pv); /* the table's memory goes now */
  CHECK_EQ(rec.late_calls, 0);
  rec_fini(&rec);
  CHECK_EQ(ta_live_now(), base);
}

/* ======================================================================== */
/* 7. Out of memory: every allocation of a call made to fail in turn. The
 * doc: "Nothing changes on error"; a success is the whole effect, and an
 * object that went was told to the dealloc hook. */

typedef struct oom_state {
  ipcref_table_stats st;
  uint64_t c[6];
} oom_state;

static oom_state oom_snap(ipcref_table *t, const ipcref_id *ids) {
  oom_state s;
  int i;
  memset(&s, 0, sizeof s);
  s.st = stats_of(t);
  for (i = 0; i < 6; i++) s.c[i] = count_of(t, ids[i]);
  return s;
}

enum {
  OOM_CREATE,
  OOM_INCREF,
  OOM_PUT,
  OOM_MSG_OUT,
  OOM_ALIAS,
  OOM_VIEW,
  OOM_DECREF_FREES,
  OOM_MSG_IN_FREES,
  OOM_UNPULL_FREES,
  OOM_KINDS
};
static const char *oom_names[OOM_KINDS] = {"create",
                                           "incref",
                                           "put",
                                           "msg_out",
                                           "alias",
                                           "view",
                                           "decref that frees",
                                           "msg_in that frees",
                                           "a pull's release that frees"};

static void test_oom(void) {
  int kind;
  for (kind = 0; kind < OOM_KINDS; kind++) {
    long k;
    int done = 0, failures_seen = 0, untold = 0;
    for (k = 1; k < 64 && !done; k++) {
      recorder rec;
      ipcref_table *t;
      ipcref_id ids[6], nid = 0;
      uint64_t tok = 0;
      ipcref_view src, pv, scratch;
      ipcref_buf *b = NULL;
      int64_t shape[1] = {4};
      oom_state before, after;
      ipcref_result rc = IPCREF_OK;
      int i;
      long base = ta_live_now();
      memset(&rec, 0, sizeof rec);
      memset(&pv, 0, sizeof pv);
      memset(&scratch, 0, sizeof scratch);
      t = new_table(&rec);
      if (!t) break;
      for (i = 0; i < 6; i++)
        CHECK_EQ(ipcref_table_create(t, &ids[i]), IPCREF_OK);
      CHECK_EQ(ipcref_table_alias(t, ids[4], ids[5]), IPCREF_OK);
      CHECK_EQ(ipcref_table_put(t, ids[3], 1, ids, 2), IPCREF_OK);
      CHECK_EQ(ipcref_buf_new(16, &b), IPCREF_OK);
      CHECK_EQ(ipcref_view_of(b, IPCREF_U32, 1, shape, &src), IPCREF_OK);
      ipcref_buf_release(b);
      /* setups for the calls that free */
      if (kind == OOM_MSG_IN_FREES) {
        CHECK_EQ(ipcref_table_msg_out(t, &ids[2], 1, &tok), IPCREF_OK);
        CHECK_EQ(ipcref_table_decref(t, ids[2]), IPCREF_OK);
      }
      if (kind == OOM_UNPULL_FREES) {
        CHECK_EQ(ipcref_table_view(t, ids[2], &src, &pv), IPCREF_OK);
        CHECK_EQ(ipcref_table_decref(t, ids[2]), IPCREF_OK);
      }
      rec_clear(&rec);
      before = oom_snap(t, ids);
      __atomic_store_n(&ta_fail_in, k, __ATOMIC_RELAXED);
      switch (kind) {
      case OOM_CREATE: rc = ipcref_table_create(t, &nid); break;
      case OOM_INCREF: rc = ipcref_table_incref(t, ids[1]); break;
      case OOM_PUT: rc = ipcref_table_put(t, ids[2], 7, ids, 2); break;
      case OOM_MSG_OUT: rc = ipcref_table_msg_out(t, ids, 3, &tok); break;
      case OOM_ALIAS: rc = ipcref_table_alias(t, ids[1], ids[4]); break;
      case OOM_VIEW: rc = ipcref_table_view(t, ids[1], &src, &pv); break;
      case OOM_DECREF_FREES: rc = ipcref_table_decref(t, ids[3]); break;
      case OOM_MSG_IN_FREES: rc = ipcref_table_msg_in(t, tok); break;
      default: ipcref_view_release(&pv); break;
      }
      /* did the failure happen? (the counter ran out) */
      if (__atomic_load_n(&ta_fail_in, __ATOMIC_RELAXED) > 0) done = 1;
      __atomic_store_n(&ta_fail_in, 0, __ATOMIC_RELAXED);
      after = oom_snap(t, ids);
      if (rc == IPCREF_ENOMEM) {
        failures_seen++;
        if (memcmp(&before, &after, sizeof after) != 0 || rec.nd || rec.nv) {
          printf("    %s, allocation %ld failed: ENOMEM but something "
                 "changed\n",
                 oom_names[kind], k);
          harness_failures_in_test++;
        }
      } else if (rc != IPCREF_OK) {
        printf("    %s, allocation %ld failed: %d\n", oom_names[kind], k,
               (int)rc);
        harness_failures_in_test++;
      } else if (kind >= OOM_DECREF_FREES) {
        /* it freed: the hook must have heard it ("The dealloc hook names
         * each object that must go") */
        if (rec.nd == 0) untold++;
      }
      if (kind == OOM_VIEW && rc == IPCREF_OK) {
        CHECK_EQ(after.c[1], before.c[1] + 1);
        ipcref_view_release(&pv);
      }
      if (kind == OOM_CREATE && rc == IPCREF_OK)
        CHECK_EQ(after.st.objects, before.st.objects + 1);
      if (kind == OOM_MSG_OUT && rc == IPCREF_OK)
        CHECK_EQ(ipcref_table_msg_cancel(t, tok), IPCREF_OK);
      if (kind == OOM_UNPULL_FREES && pv.buf) ipcref_view_release(&pv);
      ipcref_view_release(&src);
      ipcref_table_free(t);
      rec_fini(&rec);
      CHECK_EQ(ta_live_now(), base);
    }
    if (untold) {
      printf("    %s: %d injected allocation failures ended in an object "
             "freed without a dealloc call\n",
             oom_names[kind], untold);
      harness_failures_in_test++;
    }
    if (!done) {
      printf("    %s: more than 63 allocations?\n", oom_names[kind]);
      harness_failures_in_test++;
    }
  }
}

/* Pulls store object `slot` (n uint32 in `b`) in place, then lets go. */
static void pull_in_place(store *s, ipcref_table *t, int slot, ipcref_buf *b,
                          int64_t n) {
  ipcref_view v, kept;
  ipcref_id id = s->id[slot];
  long deallocs = s->deallocs;
  CHECK_EQ(ipcref_view_of(b, IPCREF_U32, 1, &n, &v), IPCREF_OK);
  CHECK_EQ(ipcref_buf_strong_count(b), 2); /* the store's, the view's */
  CHECK_EQ(ipcref_table_view(t, id, &v, &v), IPCREF_OK);
  CHECK(v.buf != b);
  CHECK_EQ(ipcref_buf_strong_count(b), 2); /* the store's, the pull's */
  CHECK_EQ(count_of(t, id), 2);
  CHECK(reads_right(&v, 0, 1, n));
  CHECK(ipcref_view_data_mut(&v) == NULL);
  kept = v;
  CHECK_EQ(ipcref_table_view(t, id + 100, &v, &v), IPCREF_EINVAL);
  CHECK(memcmp(&v, &kept, sizeof v) == 0);
  CHECK_EQ(ipcref_table_decref(t, id), IPCREF_OK);
  CHECK_EQ(s->deallocs, deallocs);
  ipcref_view_release(&v);
  CHECK_EQ(s->deallocs, deallocs + 1);
  CHECK(s->buf[slot] == NULL);
}

/* A pull in place, ipcref_table_view(t, id, &v, &v), as view.h allows
 * out to be the input: the caller's reference to the source buffer goes
 * with its old view (the pull holds its own), so the object and the
 * store's buffer go with the pull; a refused one leaves v as it was. From
 * a plain buffer, and from a shared one made here (the pull an alias). */
static void test_view_pull_in_place(void) {
  store s;
  ipcref_table_hooks h;
  ipcref_table *t = NULL;
  long base = ta_live_now();
  memset(&s, 0, sizeof s);
  memset(&h, 0, sizeof h);
  h.dealloc = store_dealloc;
  h.user = &s;
  CHECK_EQ(ipcref_table_new(&h, &t), IPCREF_OK);
  if (!t) return;
  CHECK(store_object(&s, t, 0, 64) != 0);
  if (s.buf[0]) pull_in_place(&s, t, 0, s.buf[0], 64);
#ifdef IPCREF_HAVE_SHARING
  {
    ipcref_ctx *ctx = NULL;
    ipcref_buf *sb = NULL;
    int64_t i;
    CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
    if (ctx) CHECK_EQ(ipcref_shared_new(ctx, 32 * 4, &sb), IPCREF_OK);
    if (sb) {
      for (i = 0; i < 32; i++)
        ((uint32_t *)ipcref_buf_data(sb))[i] = 0xC0DE0000u + (uint32_t)i;
      CHECK_EQ(ipcref_table_create(t, &s.id[1]), IPCREF_OK);
      CHECK_EQ(ipcref_table_put(t, s.id[1], 2, NULL, 0), IPCREF_OK);
      s.buf[1] = sb;
      pull_in_place(&s, t, 1, sb, 32);
    }
    ipcref_ctx_free(ctx);
  }
#endif
  CHECK_EQ(s.unknown, 0);
  ipcref_table_free(t);
  CHECK_EQ(ta_live_now(), base);
}

/* ======================================================================== */

/* Arguments: the names of the tests to run (all when none). */
static int selected(int argc, char **argv, const char *name) {
  int i;
  if (argc < 2) return 1;
  for (i = 1; i < argc; i++)
    if (strcmp(argv[i], name) == 0) return 1;
  return 0;
}

int main(int argc, char **argv) {
  double t0 = now_s(), t1;
  under_valgrind = harness_env_long("IPCREF_UNDER_VALGRIND", 0) != 0;
  opt_ops = harness_env_long("IPCREF_TEST_OPS", 1000000);
  if (getenv("IPCREF_TEST_SEED") && *getenv("IPCREF_TEST_SEED"))
    opt_seed = harness_env_long("IPCREF_TEST_SEED", 1);
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("test_table: %ld model ops (IPCREF_TEST_OPS)%s\n", opt_ops,
         under_valgrind ? ", under valgrind" : "");
#define TIMED(fn)                                                              \
  do {                                                                         \
    if (!selected(argc, argv, #fn)) break;                                     \
    t1 = now_s();                                                              \
    RUN(fn);                                                                   \
    printf("     (%s: %.2f s)\n", #fn, now_s() - t1);                          \
  } while (0)
  TIMED(test_args);
  TIMED(test_model);
  TIMED(test_chain);
  TIMED(test_view_pull);
  TIMED(test_view_pull_in_place);
  TIMED(test_threads);
  TIMED(test_semantics);
  TIMED(test_misuse_contained);
  TIMED(test_misuse_no_alloc);
  TIMED(test_oom);
  TIMED(test_free_alive);
  printf("test_table: %.2f s in all\n", now_s() - t0);
  return harness_finish();
}
