/* table_ops: the object table's public calls. Each one takes the table's
 * spinlock, changes the counts, and tells the hooks (deallocs and
 * breaches, noted while locked) after letting it go, so a hook may call
 * back in. */

/* ---- the API ------------------------------------------------------------- */

/* What a refusal tells the error hook: an id never handed out. */
#define IPCREF__TABLE_UNKNOWN "id was never handed out by this table"

/* Lets go of the lock (the table's hooks hear what they must), then
 * returns `r`, telling the error hook `why` when it is EINVAL. */
IPCREF__PRIVATE ipcref_result ipcref__table_done(ipcref_table *t,
                                                 ipcref_result r,
                                                 const char *fn,
                                                 const char *why) {
  ipcref__table_unlock(t);
  return r == IPCREF_EINVAL ? ipcref__invalid(fn, why) : r;
}

IPCREF_API ipcref_result ipcref_table_new(const ipcref_table_hooks *hooks,
                                          ipcref_table **out) {
  ipcref_table *t;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  t = (ipcref_table *)IPCREF_MALLOC(sizeof *t);
  if (!t) return IPCREF_ENOMEM;
  memset(t, 0, sizeof *t);
  if (hooks) t->hooks = *hooks;
  t->refs = 1;
  t->next_id = 1;
  t->next_token = 1;
  t->notes_tail = &t->notes;
  *out = t;
  return IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__table_unref(ipcref_table *t) {
  size_t i;
  if (__atomic_fetch_sub(&t->refs, 1, __ATOMIC_RELEASE) != 1) return;
  IPCREF__ACQUIRE_FENCE(&t->refs);
  for (i = 0; i < t->ids.cap; i++) {
    ipcref__table_id *x = (ipcref__table_id *)t->ids.vals[i];
    if (!t->ids.keys[i]) continue;
    if (x->obj) { /* the first of its ids met: all are still here */
      ipcref__table_obj *o = x->obj;
      ipcref__table_id *y;
      for (y = o->ids; y; y = y->next) y->obj = NULL;
      IPCREF_FREE(o->note.stores);
      IPCREF_FREE(o);
    }
    IPCREF_FREE(x->contained);
    IPCREF_FREE(x->stores);
    IPCREF_FREE(x);
  }
  for (i = 0; i < t->msgs.cap; i++)
    if (t->msgs.keys[i]) IPCREF_FREE(t->msgs.vals[i]);
  IPCREF_FREE(t->ids.keys);
  IPCREF_FREE(t->ids.vals);
  IPCREF_FREE(t->msgs.keys);
  IPCREF_FREE(t->msgs.vals);
  IPCREF_FREE(t);
}

IPCREF_API void ipcref_table_free(ipcref_table *t) {
  if (!t) return;
  ipcref__table_lock(t); /* no hook is called any more, whatever still runs */
  memset(&t->hooks, 0, sizeof t->hooks);
  ipcref__table_unlock(t);
  ipcref__table_unref(t);
}

IPCREF_API ipcref_result ipcref_table_create(ipcref_table *t, ipcref_id *out) {
  ipcref__table_id *x;
  ipcref__table_obj *o;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  x = (ipcref__table_id *)IPCREF_MALLOC(sizeof *x);
  o = (ipcref__table_obj *)IPCREF_MALLOC(sizeof *o);
  if (!x || !o) {
    IPCREF_FREE(x);
    IPCREF_FREE(o);
    return IPCREF_ENOMEM;
  }
  memset(x, 0, sizeof *x);
  memset(o, 0, sizeof *o);
  ipcref__table_lock(t);
  if (!ipcref__table_hash_reserve(&t->ids)) {
    ipcref__table_unlock(t);
    IPCREF_FREE(x);
    IPCREF_FREE(o);
    return IPCREF_ENOMEM;
  }
  x->id = t->next_id++;
  x->count = 1;
  x->obj = o;
  o->first = x->id;
  o->total = 1;
  o->ids = x;
  o->nids = 1;
  ipcref__table_hash_put(&t->ids, x->id, x);
  t->objects++;
  *out = x->id;
  ipcref__table_unlock(t);
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_table_incref(ipcref_table *t, ipcref_id id) {
  ipcref__table_id *x;
  ipcref__table_note note;
  ipcref_result r = IPCREF_OK;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  ipcref__table_lock(t);
  x = ipcref__table_find(t, id, &r);
  if (x)
    ipcref__table_gain(x);
  else
    r = ipcref__table_breach(t, &note, id, r,
                             "incref of an id that is gone or unknown");
  return ipcref__table_done(t, r, __func__, IPCREF__TABLE_UNKNOWN);
}

IPCREF_API ipcref_result ipcref_table_decref(ipcref_table *t, ipcref_id id) {
  ipcref__table_id *x;
  ipcref__table_note note;
  ipcref_result r = IPCREF_OK;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  ipcref__table_lock(t);
  x = ipcref__table_find(t, id, &r);
  if (!x)
    r = ipcref__table_breach(t, &note, id, r,
                             "decref of an id that is gone or unknown");
  else if (x->count == 0)
    r = ipcref__table_breach(t, &note, id, IPCREF_EDEAD,
                             "decref of an id at zero");
  else
    ipcref__table_drop(t, x);
  return ipcref__table_done(t, r, __func__, IPCREF__TABLE_UNKNOWN);
}

/* Records that `x` is stored in `store` (once: a store already listed is
 * not listed again), with room for it in its object's dealloc note (under
 * the lock). ENOMEM with nothing changed. */
IPCREF__PRIVATE ipcref_result ipcref__table_add_store(ipcref__table_id *x,
                                                      uint32_t store) {
  uint32_t i;
  for (i = 0; i < x->nstores; i++)
    if (x->stores[i] == store) return IPCREF_OK;
  if (x->nstores == x->cap) {
    uint32_t cap = x->cap ? x->cap * 2 : 2;
    uint32_t *s =
        (uint32_t *)IPCREF_REALLOC(x->stores, cap * sizeof *x->stores);
    if (!s) return IPCREF_ENOMEM;
    x->stores = s;
    x->cap = cap;
  }
  if (!ipcref__table_room(x->obj, x->obj->nstores + 1)) return IPCREF_ENOMEM;
  x->stores[x->nstores++] = store;
  x->obj->nstores++;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_table_put(ipcref_table *t, ipcref_id id,
                                          uint32_t store,
                                          const ipcref_id *contained,
                                          size_t n) {
  ipcref__table_id *x;
  ipcref_id *copy = NULL;
  ipcref__table_note note;
  ipcref_result r = IPCREF_OK;
  const char *why = IPCREF__TABLE_UNKNOWN;
  size_t i;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (n && !contained)
    return ipcref__invalid(__func__, "contained is NULL with n > 0");
  if (n > SIZE_MAX / sizeof *copy)
    return ipcref__invalid(__func__, "n is too large");
  if (n) {
    copy = (ipcref_id *)IPCREF_MALLOC(n * sizeof *copy);
    if (!copy) return IPCREF_ENOMEM;
    memcpy(copy, contained, n * sizeof *copy);
  }
  ipcref__table_lock(t);
  x = ipcref__table_find(t, id, &r);
  if (!x) {
    r = ipcref__table_breach(t, &note, id, r,
                             "put of an id that is gone or unknown");
    goto out;
  }
  if (n && x->put) { /* what an object holds is set once */
    r = IPCREF_EINVAL;
    why = "contained given again (only an id's first put may list any)";
    goto out;
  }
  for (i = 0; i < n; i++) { /* all, before anything changes */
    ipcref_result rc = IPCREF_OK;
    if (copy[i] == id || !ipcref__table_find(t, copy[i], &rc)) {
      r = copy[i] == id
              ? IPCREF_EINVAL
              : ipcref__table_breach(t, &note, copy[i], rc,
                                     "put containing an id that is gone "
                                     "or unknown");
      why = copy[i] == id ? "contained lists id itself"
                          : "contained lists an id never handed out";
      goto out;
    }
  }
  r = ipcref__table_add_store(x, store);
  if (r != IPCREF_OK) goto out;
  if (!x->put) {
    for (i = 0; i < n; i++)
      ipcref__table_gain(
          (ipcref__table_id *)ipcref__table_hash_get(&t->ids, copy[i]));
    x->contained = copy;
    x->ncontained = n;
    copy = NULL;
    x->put = 1;
  }
out:
  ipcref__table_unlock(t);
  IPCREF_FREE(copy);
  return r == IPCREF_EINVAL ? ipcref__invalid(__func__, why) : r;
}

IPCREF_API ipcref_result ipcref_table_msg_out(ipcref_table *t,
                                              const ipcref_id *ids, size_t n,
                                              uint64_t *token) {
  ipcref__table_msg *m;
  ipcref__table_note note;
  ipcref_result r = IPCREF_OK;
  size_t i;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (!token) return ipcref__invalid(__func__, "token is NULL");
  if (n && !ids) return ipcref__invalid(__func__, "ids is NULL with n > 0");
  if (n > (SIZE_MAX - sizeof *m) / sizeof(ipcref_id))
    return ipcref__invalid(__func__, "n is too large");
  m = (ipcref__table_msg *)IPCREF_MALLOC(sizeof *m + n * sizeof(ipcref_id));
  if (!m) return IPCREF_ENOMEM;
  m->n = n;
  if (n) memcpy(m->ids, ids, n * sizeof(ipcref_id));
  ipcref__table_lock(t);
  for (i = 0; i < n; i++)
    if (!ipcref__table_find(t, ids[i], &r)) {
      r = ipcref__table_breach(t, &note, ids[i], r,
                               "message carrying an id that is gone "
                               "or unknown");
      goto out;
    }
  if (!ipcref__table_hash_reserve(&t->msgs)) {
    r = IPCREF_ENOMEM;
    goto out;
  }
  for (i = 0; i < n; i++)
    ipcref__table_gain(
        (ipcref__table_id *)ipcref__table_hash_get(&t->ids, ids[i]));
  *token = t->next_token++;
  ipcref__table_hash_put(&t->msgs, *token, m);
  m = NULL;
out:
  ipcref__table_unlock(t);
  IPCREF_FREE(m);
  return r == IPCREF_EINVAL
             ? ipcref__invalid(__func__, "ids lists an id never handed out")
             : r;
}

/* msg_in and msg_cancel (public function `fn`): the message's references
 * go, once. An id the message finds at zero or gone is a breach (its
 * reference was taken by someone else); those ids are kept at the start of
 * the message's list, which is freed after they are told. */
IPCREF__PRIVATE ipcref_result ipcref__table_msg_end(ipcref_table *t,
                                                    uint64_t token,
                                                    const char *fn) {
  ipcref__table_msg *m;
  ipcref__table_note note;
  size_t i, nb = 0;
  const char *why = "token was never handed out by this table";
  if (!t) return ipcref__invalid(fn, "t is NULL");
  if (token == 0) return ipcref__invalid(fn, "token is 0");
  ipcref__table_lock(t);
  m = (ipcref__table_msg *)ipcref__table_hash_get(&t->msgs, token);
  if (m) {
    ipcref__table_hash_del(&t->msgs, token);
    for (i = 0; i < m->n; i++) {
      ipcref__table_id *x =
          (ipcref__table_id *)ipcref__table_hash_get(&t->ids, m->ids[i]);
      if (x && x->count) {
        ipcref__table_drop(t, x); /* alive: the message held it */
        continue;
      }
      if (nb == 0)
        (void)ipcref__table_breach(t, &note, m->ids[i], IPCREF_EDEAD,
                                   "a message's id went below zero");
      else
        t->violations++;
      m->ids[nb++] = m->ids[i];
      note.ids = m->ids;
      note.n = nb;
    }
  } else if (token < t->next_token) { /* spent: a second msg_in/cancel */
    (void)ipcref__table_breach(t, &note, 0, IPCREF_EINVAL,
                               "a message let go of twice");
    why = "token's message was let go of already (msg_in or msg_cancel)";
  }
  ipcref__table_unlock(t);
  IPCREF_FREE(m);
  return m ? IPCREF_OK : ipcref__invalid(fn, why);
}

IPCREF_API ipcref_result ipcref_table_msg_in(ipcref_table *t, uint64_t token) {
  return ipcref__table_msg_end(t, token, __func__);
}

IPCREF_API ipcref_result ipcref_table_msg_cancel(ipcref_table *t,
                                                 uint64_t token) {
  return ipcref__table_msg_end(t, token, __func__);
}

IPCREF_API ipcref_result ipcref_table_alias(ipcref_table *t, ipcref_id a,
                                            ipcref_id b) {
  ipcref__table_id *x, *y, *last;
  ipcref__table_obj *big, *small;
  ipcref__table_note note;
  ipcref_result ra = IPCREF_OK, rb = IPCREF_OK;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  ipcref__table_lock(t);
  x = ipcref__table_find(t, a, &ra);
  y = ipcref__table_find(t, b, &rb);
  if (!x || !y) {
    ipcref_result r = ra != IPCREF_OK ? ra : rb;
    r = ipcref__table_breach(t, &note, !x ? a : b, r,
                             r == IPCREF_EDEAD
                                 ? "alias of an object that was freed: the ids "
                                   "were not both alive until the alias"
                                 : "alias of an id never handed out");
    return ipcref__table_done(t, r, __func__,
                              !x ? "a was never handed out by this table"
                                 : "b was never handed out by this table");
  }
  if (x->obj != y->obj) { /* merge the smaller group into the larger */
    big = x->obj->nids >= y->obj->nids ? x->obj : y->obj;
    small = big == x->obj ? y->obj : x->obj;
    if (!ipcref__table_room(big, big->nstores + small->nstores)) {
      ipcref__table_unlock(t);
      return IPCREF_ENOMEM;
    }
    big->nstores += small->nstores;
    IPCREF_FREE(small->note.stores);
    for (last = small->ids; last->next; last = last->next) last->obj = big;
    last->obj = big;
    last->next = big->ids;
    big->ids = small->ids;
    big->nids += small->nids;
    big->total += small->total;
    if (small->first < big->first) big->first = small->first;
    t->objects--;
    IPCREF_FREE(small);
  }
  ipcref__table_unlock(t);
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_table_count(ipcref_table *t, ipcref_id id,
                                            uint64_t *out) {
  ipcref__table_id *x;
  ipcref_result r = IPCREF_OK;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  ipcref__table_lock(t);
  x = ipcref__table_find(t, id, &r);
  if (x) *out = x->count;
  return ipcref__table_done(t, r, __func__, IPCREF__TABLE_UNKNOWN);
}

IPCREF_API ipcref_result ipcref_table_get_stats(ipcref_table *t,
                                                ipcref_table_stats *out) {
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  ipcref__table_lock(t);
  out->ids = t->ids.n;
  out->objects = t->objects;
  out->messages = t->msgs.n;
  out->deallocs = t->deallocs;
  out->violations = t->violations;
  ipcref__table_unlock(t);
  return IPCREF_OK;
}

/* A pulled view's hold: the table reference and the source buffer. */
typedef struct ipcref__table_pin {
  ipcref_table *t;
  ipcref_id id;
  ipcref_buf *src;
} ipcref__table_pin;

/* The pin's end: the table reference goes, and the source buffer (unless
 * a shared alias releases it itself: src NULL). */
IPCREF__PRIVATE void ipcref__table_pin_end(void *user) {
  ipcref__table_pin *pin = (ipcref__table_pin *)user;
  ipcref__table_id *x = NULL;
  ipcref__table_note note;
  ipcref__table_lock(pin->t);
  if (pin->id)
    x = (ipcref__table_id *)ipcref__table_hash_get(&pin->t->ids, pin->id);
  if (x && x->count)
    ipcref__table_drop(pin->t, x); /* alive: the pin held it */
  else if (pin->id) /* someone let go of the pin's reference too */
    (void)ipcref__table_breach(pin->t, &note, pin->id, IPCREF_EDEAD,
                               "a pulled view's reference was decremented by "
                               "someone else");
  ipcref__table_unlock(pin->t);
  ipcref_buf_release(pin->src);
  ipcref__table_unref(pin->t);
  IPCREF_FREE(pin);
}

IPCREF__PRIVATE void ipcref__table_pin_release(void *user, void *data) {
  (void)data;
  ipcref__table_pin_end(user);
}

IPCREF_API ipcref_result ipcref_table_view(ipcref_table *t, ipcref_id id,
                                           const ipcref_view *src,
                                           ipcref_view *out) {
  ipcref__table_pin *pin;
  ipcref__table_id *x;
  ipcref_buf *b;
  ipcref__table_note note;
  ipcref_result r = IPCREF_OK;
  if (!t) return ipcref__invalid(__func__, "t is NULL");
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if (!ipcref__view_valid(src))
    return ipcref__view_invalid(src, __func__, "src");
  pin = (ipcref__table_pin *)IPCREF_MALLOC(sizeof *pin);
  if (!pin) return IPCREF_ENOMEM;
  pin->t = t;
  pin->id = id;
  pin->src = src->buf;
#ifdef IPCREF_HAVE_SHARING
  /* A shared buffer made here: the pulled view is an alias of it, which
   * can be sent on, and the table reference lives until the alias and
   * every lease taken through it are gone. */
  switch (ipcref__shared_alias(src->buf, ipcref__table_pin_end, pin, &b)) {
  case 1: pin->src = NULL; break; /* the alias releases it */
  case -1: IPCREF_FREE(pin); return IPCREF_ENOMEM;
  default:
#endif
    r = ipcref_buf_wrap_device(src->buf->data, src->buf->size,
                               ipcref_buf_device(src->buf),
                               ipcref__table_pin_release, pin, &b);
    if (r != IPCREF_OK) {
      IPCREF_FREE(pin);
      return r;
    }
    ipcref_buf_retain(src->buf);
#ifdef IPCREF_HAVE_SHARING
  }
#endif
  ipcref__table_lock(t);
  x = ipcref__table_find(t, id, &r);
  if (x)
    ipcref__table_gain(x);
  else
    r = ipcref__table_breach(t, &note, id, r,
                             "pull of an id that is gone or unknown");
  ipcref__table_unlock(t);
  if (r != IPCREF_OK) { /* the pin took nothing from the table */
    pin->id = 0;
    __atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED); /* the pin's end */
    ipcref_buf_release(b);
    return r == IPCREF_EINVAL ? ipcref__invalid(__func__, IPCREF__TABLE_UNKNOWN)
                              : r;
  }
  __atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
  ipcref__buf_set_read_only(b); /* others see the same memory */
  if (out == src) /* pulled in place: the pin holds its own reference */
    ipcref_buf_release(src->buf);
  else
    *out = *src;
  out->buf = b;
  return IPCREF_OK;
}
