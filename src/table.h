/* table: cluster-style reference counting for object ids (portable C).
 *
 * One table knows how many references to each object exist anywhere, so
 * that the stores holding it can free it the moment the last one goes, with
 * no collection pauses. References live in three places, all counted on the
 * id they name:
 *   - in workers, as handles: ipcref_table_incref / ipcref_table_decref;
 *   - inside other stored objects (a distributed array holding the ids of
 *     its blocks): ipcref_table_put records what an object contains;
 *   - in messages on their way between processes (task arguments):
 *     ipcref_table_msg_out counts them while in flight, msg_in (after the
 *     receiver took its own references) or msg_cancel (a dropped message)
 *     lets go, exactly once per message.
 * Several ids can name one object (ipcref_table_alias): counts stay per id,
 * and the object is deallocated only when every id naming it is at zero.
 *
 * The table moves no data and knows no transport: an engine's scheduler
 * embeds it and carries the calls over whatever it already uses. The
 * dealloc hook names each object that must go and the stores that hold it.
 * Every EINVAL a call returns is also told to the process's error hook
 * (ipcref_set_error_hook) as "function: reason" ("ipcref_table_incref: id
 * was never handed out by this table"), after the violation hook, if the
 * breach is one, heard it.
 *
 * A cycle of containment (a holds b, b holds a) is never freed, as with
 * any reference counting; an object cannot contain its own id.
 *
 * The rules, checked (a breach is reported to the violation hook and
 * changes nothing: never an early free):
 *   - a count never goes below zero: a decref at zero, or a reference
 *     taken twice (a decref of the reference a container, a message or a
 *     pulled view holds: counts are per id, so the table cannot tell
 *     whose a decref takes), met when that holder lets go (the container
 *     is deallocated, msg_in / msg_cancel, the view goes) and reported
 *     then as a decref at zero is (EDEAD, the id), once per reference; a
 *     second msg_in / msg_cancel of one message (EINVAL);
 *   - a deallocated object's ids are dead for good (ids are never reused):
 *     incref, put, msg_out or alias on one is refused with IPCREF_EDEAD;
 *   - aliasing: when two ids will be aliased, either the alias call has
 *     happened or both are still alive; an alias that finds one side
 *     already deallocated is a violation (that object was freed while the
 *     other id still named it: the caller broke the rule).
 *
 * Costs: every call is O(1) on average (hash tables; alias groups merge
 * smaller into larger), except put (O(contained)) and deallocating an
 * object (O(its ids + its contained ids), done with an explicit worklist,
 * so a chain of any length frees without recursion). Memory, on x86-64: 72
 * bytes per live id and 40 per object, plus 8 per id it contains and 4 per
 * store it is in; 16 + 8 per carried id for a message in flight; and the
 * two hash tables, 16 bytes a slot, at least twice as many slots as live
 * ids and messages (at most four times). Thread-safe: one lock per table;
 * hooks run outside it, and may call back into the table. */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ipcref_table ipcref_table;
typedef uint64_t ipcref_id; /* 1, 2, 3, ...: never 0, never reused */

typedef struct ipcref_table_hooks {
  /* Object `id` (its first id) must be deallocated: every id naming it is
   * at zero. `stores` lists the stores holding it (nstores, maybe 0; the
   * array lives until the hook returns). */
  void (*dealloc)(void *user, ipcref_id id, const uint32_t *stores,
                  size_t nstores);
  /* A breach of the rules above (code EDEAD: a count below zero, or a
   * dead id used; EINVAL: an id never handed out). Nothing was changed.
   * Each breach is told once and counted once (stats.violations), with
   * the same id and code whichever call met it; telling allocates
   * nothing, so none goes untold, even out of memory. */
  void (*violation)(void *user, ipcref_id id, ipcref_result code,
                    const char *what);
  void *user;
} ipcref_table_hooks;

typedef struct ipcref_table_stats {
  size_t ids;          /* live ids */
  size_t objects;      /* live objects (alias groups) */
  size_t messages;     /* messages in flight */
  uint64_t deallocs;   /* objects deallocated, ever */
  uint64_t violations; /* breaches reported, ever */
} ipcref_table_stats;

/* A new, empty table. `hooks` is copied (NULL: no hooks). Errors: EINVAL
 * (out NULL), ENOMEM. */
IPCREF_API ipcref_result ipcref_table_new(const ipcref_table_hooks *hooks,
                                          ipcref_table **out);

/* Frees the table; objects still alive are forgotten without dealloc
 * calls. NULL: no-op. */
IPCREF_API void ipcref_table_free(ipcref_table *t);

/* A new id for a new object, with one reference (the caller's). Errors:
 * EINVAL (t or out NULL), ENOMEM. */
IPCREF_API ipcref_result ipcref_table_create(ipcref_table *t, ipcref_id *out);

/* One more / one less reference on `id` (a worker's handle). The last
 * reference of an object deallocates it (see the hooks); that never
 * allocates, so it cannot fail. Errors: EINVAL (t NULL, an id never handed
 * out), EDEAD (decref at zero, or the object is gone). */
IPCREF_API ipcref_result ipcref_table_incref(ipcref_table *t, ipcref_id id);
IPCREF_API ipcref_result ipcref_table_decref(ipcref_table *t, ipcref_id id);

/* Records that object `id` is stored in `store`, and (the first time it is
 * put) that it holds references to the `n` ids in `contained`, each
 * counted once more until `id` is deallocated, when each is decremented.
 * A later put of the same id adds a store; its contained list must then
 * be empty (else EINVAL). Nothing changes on error. Errors: EINVAL (t
 * NULL, contained NULL with n > 0, id or a contained id never handed out,
 * `contained` listing `id` itself, or given again), EDEAD (id or a
 * contained id is gone), ENOMEM. */
IPCREF_API ipcref_result ipcref_table_put(ipcref_table *t, ipcref_id id,
                                          uint32_t store,
                                          const ipcref_id *contained, size_t n);

/* A message carrying `n` ids leaves: each is counted once more while it is
 * in flight; *token names the message. msg_in (the receiver took its own
 * references) or msg_cancel (the message was dropped) lets go, exactly
 * once: a second call with the token is EINVAL. Errors: EINVAL (t or
 * token NULL, ids NULL with n > 0, an id never handed out; for msg_in and
 * msg_cancel a token that is 0, spent or never handed out), EDEAD (an id
 * is gone), ENOMEM. */
IPCREF_API ipcref_result ipcref_table_msg_out(ipcref_table *t,
                                              const ipcref_id *ids, size_t n,
                                              uint64_t *token);
IPCREF_API ipcref_result ipcref_table_msg_in(ipcref_table *t, uint64_t token);
IPCREF_API ipcref_result ipcref_table_msg_cancel(ipcref_table *t,
                                                 uint64_t token);

/* Ids `a` and `b` name one object: it lives while either is above zero
 * (counts stay per id), and the object is deallocated once, naming the
 * first id of the group and every store either was put in. Errors: EINVAL
 * (t NULL, an id never handed out), EDEAD (one of them is gone already: a
 * violation, reported), ENOMEM. */
IPCREF_API ipcref_result ipcref_table_alias(ipcref_table *t, ipcref_id a,
                                            ipcref_id b);

/* `id`'s own count (workers, containers and messages together) into
 * *out. Errors: EINVAL (t or out NULL, an id never handed out), EDEAD. */
IPCREF_API ipcref_result ipcref_table_count(ipcref_table *t, ipcref_id id,
                                            uint64_t *out);

/* The zero-copy pull: a read-only view of `src`'s elements (the same
 * memory, its buffer retained) that also holds one table reference on
 * `id`, dropped when the last reference to the new view's buffer goes. So
 * a worker that pulled an object's data by `id` keeps it readable after
 * its own handle on `id` is gone: the store cannot free it underneath.
 * When `src` is a shared buffer made in this process, the new view is an
 * alias of it, itself shared: it can be sent to another process, and the
 * table reference then lasts until the alias and every lease taken
 * through it are gone (the consumer's release, then a sweep). The table
 * stays allocated while such views live (ipcref_table_free included; no
 * hook is called after it). `out` may be `src` (as in view.h): the
 * caller's reference to src's buffer then goes, the pull keeping its own.
 * Errors: EINVAL (t or out NULL, an invalid src, an id never handed out),
 * EDEAD, ENOMEM; on error `out` is unchanged. */
IPCREF_API ipcref_result ipcref_table_view(ipcref_table *t, ipcref_id id,
                                           const ipcref_view *src,
                                           ipcref_view *out);

/* Fills *out. Errors: EINVAL (t or out NULL). */
IPCREF_API ipcref_result ipcref_table_get_stats(ipcref_table *t,
                                                ipcref_table_stats *out);

#ifdef __cplusplus
}
#endif

/* @implementation */

/* A live id. Its object (alias group) keeps the ids in a list; counts stay
 * per id, and the object's total is their sum. */
typedef struct ipcref__table_id {
  ipcref_id id;
  uint64_t count;                /* this id's references */
  struct ipcref__table_obj *obj; /* the object it names */
  struct ipcref__table_id *next; /* the next id of the same object */
  ipcref_id *contained;          /* what the object holds (first put) */
  size_t ncontained;
  uint32_t *stores, nstores, cap; /* where it is stored */
  int put;                        /* put at least once */
} ipcref__table_id;

/* What a call owes the hooks, told after the lock is let go. Making one
 * never allocates (freeing can meet a breach, and freeing cannot fail): a
 * dealloc's note is part of its object, a violation's is the caller's (on
 * its stack, told before the call returns). */
typedef struct ipcref__table_note {
  ipcref_id id;       /* a dealloc: the object's first id */
  ipcref_result code; /* OK: a dealloc; else a violation */
  const char *what;
  const ipcref_id *ids; /* a violation: the ids it names (n), each told */
  uint32_t *stores;     /* a dealloc: the stores (n; owned by the object) */
  size_t n;
  struct ipcref__table_note *next;
} ipcref__table_note;

typedef struct ipcref__table_obj {
  ipcref_id first;       /* its smallest id: the name the dealloc hook gets */
  uint64_t total;        /* the sum of its ids' counts */
  ipcref__table_id *ids; /* the list; once deallocated, the ids whose contained
                       lists met breaches (see ipcref__table_dealloc) */
  size_t nids;
  struct ipcref__table_obj *next_free; /* on the dealloc worklist */
  /* Its dealloc note, made in place: freeing never allocates, so it can
   * never fail halfway. `stores` has room for every store of its ids,
   * reserved by put and alias (which can say ENOMEM before changing
   * anything). */
  ipcref__table_note note;
  size_t nstores, room; /* stores of its ids (with repeats); reserved */
} ipcref__table_obj;

/* A message in flight: the ids it carries. */
typedef struct ipcref__table_msg {
  size_t n;
  ipcref_id ids[1]; /* n of them */
} ipcref__table_msg;

/* An open-addressing hash from nonzero 64-bit keys to pointers (linear
 * probing; deletion shifts back, so there are no tombstones). */
typedef struct ipcref__table_hash {
  uint64_t *keys;
  void **vals;
  size_t cap, n; /* cap: a power of two, or 0 */
} ipcref__table_hash;

struct ipcref_table {
  int lock; /* a spinlock: the table is portable C, calls are short */
  int refs; /* atomic: the owner's, and one per pulled view */
  ipcref_table_hooks hooks;
  ipcref_id next_id;
  uint64_t next_token;
  ipcref__table_hash ids, msgs;
  size_t objects;
  uint64_t deallocs, violations;
  ipcref__table_note *notes, **notes_tail;
};

/* Takes the table's spinlock; ipcref__table_unlock lets it go. */
IPCREF__PRIVATE void ipcref__table_lock(ipcref_table *t) {
  while (__atomic_test_and_set(&t->lock, __ATOMIC_ACQUIRE))
    while (__atomic_load_n(&t->lock, __ATOMIC_RELAXED)) {
    }
}

/* ---- the hash ------------------------------------------------------------ */

/* The hash's smallest table, in slots (a power of two). */
#define IPCREF__TABLE_HASH_MIN_SLOTS 16
/* The multiplier of MurmurHash3's 64-bit finalizer (fmix64). */
#define IPCREF__TABLE_HASH_MIX 0xff51afd7ed558ccdull

/* Key `k`'s home slot. Ids and tokens are sequential: they are mixed
 * first, so that neighbours spread. */
IPCREF__PRIVATE size_t ipcref__table_hash_slot(const ipcref__table_hash *h,
                                               uint64_t k) {
  k ^= k >> 33;
  k *= IPCREF__TABLE_HASH_MIX;
  k ^= k >> 33;
  return (size_t)k & (h->cap - 1);
}

IPCREF__PRIVATE void *ipcref__table_hash_get(const ipcref__table_hash *h,
                                             uint64_t k) {
  size_t i;
  if (!h->cap) return NULL;
  for (i = ipcref__table_hash_slot(h, k); h->keys[i];
       i = (i + 1) & (h->cap - 1))
    if (h->keys[i] == k) return h->vals[i];
  return NULL;
}

/* Makes room for one more key (load at most 1/2). 0 on ENOMEM. */
IPCREF__PRIVATE int ipcref__table_hash_reserve(ipcref__table_hash *h) {
  ipcref__table_hash g;
  size_t i, j;
  if ((h->n + 1) * 2 <= h->cap) return 1;
  g.cap = h->cap ? h->cap * 2 : IPCREF__TABLE_HASH_MIN_SLOTS;
  g.n = h->n;
  g.keys = (uint64_t *)IPCREF_MALLOC(g.cap * sizeof *g.keys);
  g.vals = (void **)IPCREF_MALLOC(g.cap * sizeof *g.vals);
  if (!g.keys || !g.vals) {
    IPCREF_FREE(g.keys);
    IPCREF_FREE(g.vals);
    return 0;
  }
  memset(g.keys, 0, g.cap * sizeof *g.keys);
  for (i = 0; i < h->cap; i++) {
    if (!h->keys[i]) continue;
    for (j = ipcref__table_hash_slot(&g, h->keys[i]); g.keys[j];
         j = (j + 1) & (g.cap - 1)) {
    }
    g.keys[j] = h->keys[i];
    g.vals[j] = h->vals[i];
  }
  IPCREF_FREE(h->keys);
  IPCREF_FREE(h->vals);
  *h = g;
  return 1;
}

/* After ipcref__table_hash_reserve. */
IPCREF__PRIVATE void ipcref__table_hash_put(ipcref__table_hash *h, uint64_t k,
                                            void *v) {
  size_t i;
  for (i = ipcref__table_hash_slot(h, k); h->keys[i];
       i = (i + 1) & (h->cap - 1)) {
  }
  h->keys[i] = k;
  h->vals[i] = v;
  h->n++;
}

IPCREF__PRIVATE void ipcref__table_hash_del(ipcref__table_hash *h, uint64_t k) {
  size_t i, j, home;
  if (!h->cap) return;
  for (i = ipcref__table_hash_slot(h, k); h->keys[i] != k;
       i = (i + 1) & (h->cap - 1))
    if (!h->keys[i]) return;
  /* Shift back what the hole would hide from its home slot. */
  for (j = (i + 1) & (h->cap - 1); h->keys[j]; j = (j + 1) & (h->cap - 1)) {
    home = ipcref__table_hash_slot(h, h->keys[j]);
    if (((j - home) & (h->cap - 1)) >= ((j - i) & (h->cap - 1))) {
      h->keys[i] = h->keys[j];
      h->vals[i] = h->vals[j];
      i = j;
    }
  }
  h->keys[i] = 0;
  h->n--;
}

/* ---- notes for the hooks ------------------------------------------------- */

/* A breach naming `id`: counted, and told to the violation hook after the
 * unlock through `note`, the caller's (it must live until the unlock;
 * one note per breach). Never allocates. */
IPCREF__PRIVATE ipcref_result ipcref__table_breach(ipcref_table *t,
                                                   ipcref__table_note *note,
                                                   ipcref_id id,
                                                   ipcref_result code,
                                                   const char *what) {
  memset(note, 0, sizeof *note);
  note->id = id;
  note->code = code;
  note->what = what;
  note->ids = &note->id;
  note->n = 1;
  *t->notes_tail = note;
  t->notes_tail = &note->next;
  t->violations++;
  return code;
}

/* Unlocks, then tells the hooks (they may call into the table), then frees
 * what was told. */
IPCREF__PRIVATE void ipcref__table_unlock(ipcref_table *t) {
  ipcref__table_note *n = t->notes;
  ipcref_table_hooks h = t->hooks;
  size_t k;
  t->notes = NULL;
  t->notes_tail = &t->notes;
  __atomic_clear(&t->lock, __ATOMIC_RELEASE);
  while (n) {
    ipcref__table_note *next = n->next;
    if (n->code == IPCREF_OK) { /* a dealloc: its note is in its object */
      ipcref__table_obj *o =
          (ipcref__table_obj *)(void *)((char *)n -
                                        offsetof(ipcref__table_obj, note));
      ipcref__table_id *x;
      for (x = o->ids; x && h.violation; x = x->next) /* breaches it met */
        for (k = 0; k < x->ncontained; k++)           /* as decref tells them */
          h.violation(h.user, x->contained[k], IPCREF_EDEAD,
                      "a contained id went below zero (at zero or gone "
                      "when its container was deallocated)");
      if (h.dealloc) h.dealloc(h.user, n->id, n->stores, n->n);
      while ((x = o->ids) != NULL) {
        o->ids = x->next;
        IPCREF_FREE(x->contained);
        IPCREF_FREE(x);
      }
      IPCREF_FREE(n->stores);
      IPCREF_FREE(o);
    } else if (h.violation) { /* the caller's note */
      for (k = 0; k < n->n; k++)
        h.violation(h.user, n->ids[k], n->code, n->what);
    }
    n = next;
  }
}

/* ---- ids and objects ----------------------------------------------------- */

/* The live id `id`, or NULL with *r: EINVAL (never handed out), EDEAD. */
IPCREF__PRIVATE ipcref__table_id *
ipcref__table_find(ipcref_table *t, ipcref_id id, ipcref_result *r) {
  ipcref__table_id *x;
  if (id == 0 || id >= t->next_id) {
    *r = IPCREF_EINVAL;
    return NULL;
  }
  x = (ipcref__table_id *)ipcref__table_hash_get(&t->ids, id);
  if (!x) *r = IPCREF_EDEAD;
  return x;
}

/* Deallocates `o` and whatever only it kept alive (under the lock): its
 * ids go, the ids it contains lose a reference, and an object whose total
 * reaches zero joins the worklist (no recursion: a chain of any length).
 * A contained id already at zero, or gone, is a breach (its reference was
 * taken by someone else): it changes nothing and the rest goes on. The
 * breaches are kept in the dead id's contained list, which stays (with
 * the id) on its object until told: freeing never allocates. */
IPCREF__PRIVATE void ipcref__table_dealloc(ipcref_table *t,
                                           ipcref__table_obj *o) {
  ipcref__table_obj *work = o;
  o->next_free = NULL;
  while (work) {
    ipcref__table_obj *cur = work;
    ipcref__table_note *note = &cur->note;
    size_t k, nb;
    ipcref__table_id *x, *kept = NULL, **kept_tail = &kept;
    work = cur->next_free;
    note->id = cur->first;
    while ((x = cur->ids) != NULL) {
      cur->ids = x->next;
      for (k = 0; k < x->nstores; k++) { /* the union, in the room kept */
        size_t j;
        for (j = 0; j < note->n && note->stores[j] != x->stores[k]; j++) {
        }
        if (j == note->n) note->stores[note->n++] = x->stores[k];
      }
      for (k = nb = 0; k < x->ncontained; k++) {
        ipcref__table_id *c = (ipcref__table_id *)ipcref__table_hash_get(
            &t->ids, x->contained[k]);
        if (!c || c->count == 0) { /* gone, or at zero: a breach */
          x->contained[nb++] = x->contained[k];
          continue;
        }
        c->count--;
        if (--c->obj->total == 0 && c->obj != cur) {
          c->obj->next_free = work;
          work = c->obj;
        }
      }
      ipcref__table_hash_del(&t->ids, x->id);
      IPCREF_FREE(x->stores);
      if (nb) { /* kept until told (ipcref__table_unlock) */
        t->violations += nb;
        x->ncontained = nb;
        x->next = NULL;
        *kept_tail = x;
        kept_tail = &x->next;
      } else {
        IPCREF_FREE(x->contained);
        IPCREF_FREE(x);
      }
    }
    cur->ids = kept;
    t->objects--;
    t->deallocs++;
    *t->notes_tail = note; /* the object is freed after the hook */
    t->notes_tail = &note->next;
  }
}

/* Makes room in `o`'s dealloc note for `need` stores (under the lock). 0
 * on ENOMEM, with nothing changed. */
IPCREF__PRIVATE int ipcref__table_room(ipcref__table_obj *o, size_t need) {
  size_t room = o->room ? o->room * 2 : 4;
  uint32_t *s;
  if (need <= o->room) return 1;
  while (room < need) room *= 2;
  s = (uint32_t *)IPCREF_REALLOC(o->note.stores, room * sizeof *s);
  if (!s) return 0;
  o->note.stores = s;
  o->room = room;
  return 1;
}

/* One reference less on `x` (under the lock; its count is above zero). */
IPCREF__PRIVATE void ipcref__table_drop(ipcref_table *t, ipcref__table_id *x) {
  x->count--;
  if (--x->obj->total == 0) ipcref__table_dealloc(t, x->obj);
}

/* One reference more on `x` (under the lock). */
IPCREF__PRIVATE void ipcref__table_gain(ipcref__table_id *x) {
  x->count++;
  x->obj->total++;
}
