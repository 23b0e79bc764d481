/* fp_tensor.c: the fingerprint's plain tensors, read through the backend's own record
 * of their storages (part of _reach.c; the tables and their invariants are in
 * fp_tensor.h). Start at fp_tensor. */

/* ==== the tensors read in this scan ============================================== */

/* t's slot in the table, or the empty one where it would go (NULL: no array yet). */
static fp_seen_tensor *
fp_tensor_slot(fp_tensors *m, PyObject *t)
{
    return m->cap ? &m->slots[tab_find(m->slots, sizeof(fp_seen_tensor), m->cap, t)] : NULL;
}

/* The table emptied (its references let go), its size noted as the next one's room. */
static void
fp_tensors_clear(fp_tensors *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        Py_CLEAR(m->slots[i].tensor);
        Py_CLEAR(m->slots[i].held);
    }
    PyMem_Free(m->slots);
    m->slots = NULL;
    if (m->n)
        m->last = m->n;
    m->cap = m->n = 0;
}

/* t's reading added (t not in the table yet), the table grown first where it would be
 * over half full; -1 with MemoryError set. */
static int
fp_tensors_add(fp_tensors *m, PyObject *t, PyObject *infos, PyObject *held)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        while (m->cap == 0 && cap < 2 * (m->last + 1))   /* room for as many as last time */
            cap *= 2;
        fp_seen_tensor *slots = tab_alloc(cap, sizeof(fp_seen_tensor));
        if (slots == NULL)
            return -1;
        tab_rehash(slots, cap, m->slots, m->cap, sizeof(fp_seen_tensor));
        PyMem_Free(m->slots);
        m->slots = slots;
        m->cap = cap;
    }
    fp_seen_tensor *slot = fp_tensor_slot(m, t);
    slot->tensor = Py_NewRef(t);
    slot->infos = infos;
    slot->held = Py_NewRef(held);
    m->n++;
    return 0;
}

/* one plain tensor's reading hashed (its record of storages: the walk's answer while the
 * record stands, and the record is checked to stand), its gradient (None: inline) pushed */
static int
fp_tensor_mix(fp_run *r, PyObject *infos, PyObject *held)
{
    fp_mix_ptr(r, infos);
    if (fp_keep(r, infos) < 0)
        return -1;
    if (held == Py_None) {
        fp_mix_ptr(r, Py_TYPE(held));
        return 0;
    }
    return fp_push(r, held);
}

/* what a weak reference refers to (borrowed; None once it is gone) */
static inline PyObject *
fp_referent(PyObject *ref)
{
    _Pragma("GCC diagnostic push")
    _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
    return PyWeakref_GetObject(ref);
    _Pragma("GCC diagnostic pop")
}

/* ==== the backend's records, kept from scan to scan ================================ */

/* t's slot in the table, or the empty one where it would go (NULL: no array yet). */
static fp_record *
fp_record_slot(fp_records *m, PyObject *t)
{
    return m->cap ? &m->slots[tab_find(m->slots, sizeof(fp_record), m->cap, t)] : NULL;
}

/* The table emptied (its records let go) and freed. */
static void
fp_records_clear(fp_records *m)
{
    for (size_t i = 0; i < m->cap; i++)
        Py_CLEAR(m->slots[i].rec);
    PyMem_Free(m->slots);
    m->slots = NULL;
    m->cap = m->n = m->live = 0;
}

/* the table again, without the records whose tensor is gone (its weak ref dead, or
 * another object at its address), in a table of room for twice the rest */
static int
fp_records_sweep(fp_records *m, size_t room)
{
    size_t live = 0;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].tensor != NULL && fp_referent(m->slots[i].ref) == m->slots[i].tensor)
            live++;
    size_t cap = 1024;
    while (cap < 2 * (live + room))
        cap *= 2;
    fp_record *slots = tab_alloc(cap, sizeof(fp_record));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < m->cap; i++) {
        fp_record *e = &m->slots[i];
        if (e->tensor == NULL)
            continue;
        if (fp_referent(e->ref) != e->tensor) {
            Py_CLEAR(e->rec);
            continue;
        }
        slots[tab_find(slots, sizeof(fp_record), cap, e->tensor)] = *e;
    }
    PyMem_Free(m->slots);
    m->slots = slots;
    m->cap = cap;
    m->n = m->live = live;
    return 0;
}

/* record `rec` (checked: a tuple of a live weak ref to t, its stamp, its storages) kept
 * for tensor t, in place of any other it had */
static int
fp_records_put(fp_records *m, PyObject *t, PyObject *rec)
{
    if ((m->n + 1) * 2 > m->cap && fp_records_sweep(m, m->n + 1) < 0)
        return -1;
    fp_record *e = fp_record_slot(m, t);
    if (e->tensor == NULL)
        m->n++;
    Py_XSETREF(e->rec, Py_NewRef(rec));
    e->tensor = t;
    e->ref = PyTuple_GET_ITEM(rec, 0);
    e->stamp = PyTuple_GET_ITEM(rec, 1);
    e->infos = PyTuple_GET_ITEM(rec, 2);
    return 0;
}

/* ==== a plain tensor ============================================================== */

/* What a plain tensor's walk would read: the backend's record of its storages
 * (borrowed) and its gradient (a new reference). 1; 0 where it cannot be proved (an
 * autograd graph, no record, a stamp that no longer holds: batch_stamp_holds); -1 with an
 * error set. A tensor held by more
 * than one object (more than `refs` references: a model's parameter is its optimizer's
 * too) is noted in this scan's memo, which the other roots that hold it read. */
static int
fp_tensor_read(Fingerprint *f, PyObject *t, PyObject **infos_out, PyObject **held_out,
               Py_ssize_t refs)
{
    fp_seen_tensor *seen = fp_tensor_slot(&f->tensors, t);
    if (seen != NULL && seen->tensor == t) {
        *infos_out = seen->infos;
        *held_out = Py_NewRef(seen->held);
        return 1;
    }
    if (batch_has_attrs(t))
        return 0;   /* attributes of its own: what they hold is walked each time */
    PyObject *key;
    if (f->taken != NULL && PyDict_GET_SIZE(f->taken) != 0) {
        /* taken by this scan's walk (no other code ran since): what it read then, the
           backend's record of storages and the gradient, without a graph */
        key = PyLong_FromVoidPtr(t);
        if (key == NULL)
            return -1;
        PyObject *entry = PyDict_GetItemWithError(f->taken, key);
        Py_DECREF(key);
        if (entry == NULL && PyErr_Occurred())
            return -1;
        if (entry != NULL && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) >= 3) {
            PyObject *infos = PyTuple_GET_ITEM(entry, 0), *held = PyTuple_GET_ITEM(entry, 2);
            if (Py_REFCNT(t) > refs && fp_tensors_add(&f->tensors, t, infos, held) < 0)
                return -1;
            *infos_out = infos;
            *held_out = Py_NewRef(held);
            return 1;
        }
    }
    /* an autograd graph, or a view's base (and what the base holds now): what it holds
       is walked each time */
    int walked = fp_get_some(&f->fn, t);
    if (walked == 0)
        walked = fp_get_some(&f->base, t);
    if (walked != 0)
        return walked < 0 ? -1 : 0;
    /* the backend's record of t, kept from an earlier scan: it still stands where its weak
       ref is still t's and its stamp holds (the same storage, bytes and address; the
       backend then keeps it too) */
    fp_record *e = fp_record_slot(&f->records, t);
    PyObject *infos = NULL;
    if (e != NULL && e->tensor == t && fp_referent(e->ref) == t) {
        int holds = batch_stamp_holds(f->ptr.obj, t, e->stamp);
        if (holds < 0)
            return -1;
        if (holds)
            infos = e->infos;
    }
    if (infos == NULL) {   /* none kept, or the backend read t again since */
        key = PyLong_FromVoidPtr(t);
        if (key == NULL)
            return -1;
        PyObject *rec = PyDict_GetItemWithError(f->known, key);   /* borrowed */
        Py_DECREF(key);
        if (rec == NULL)
            return PyErr_Occurred() ? -1 : 0;   /* never taken: the walk takes it */
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 3 ||
                !PyWeakref_Check(PyTuple_GET_ITEM(rec, 0)) ||
                fp_referent(PyTuple_GET_ITEM(rec, 0)) != t)
            return 0;
        Py_INCREF(rec);
        int holds = batch_stamp_holds(f->ptr.obj, t, PyTuple_GET_ITEM(rec, 1));
        if (holds > 0 && fp_records_put(&f->records, t, rec) < 0)
            holds = -1;
        Py_DECREF(rec);   /* (the records hold it where it stands) */
        if (holds <= 0)
            return holds;   /* changed: the walk reads it again */
        infos = PyTuple_GET_ITEM(rec, 2);   /* held by the record, kept above */
    }
    PyObject *held = fp_get(&f->held, t);   /* its gradient */
    if (held == NULL)
        return -1;
    if (Py_REFCNT(t) > refs && fp_tensors_add(&f->tensors, t, infos, held) < 0) {
        Py_DECREF(held);
        return -1;
    }
    *infos_out = infos;
    *held_out = held;
    return 1;
}

/* one plain tensor's reading hashed (the record of storages: the walk's answer while the
 * record stands, and the record is checked to stand), its gradient pushed */
/* one plain tensor hashed and recorded as a check (doubted where it cannot be proved) */
static int
fp_tensor(Fingerprint *f, fp_run *r, PyObject *t)
{
    PyObject *infos, *held;
    int got = fp_tensor_read(f, t, &infos, &held, 2);   /* (this walk's stack holds it too) */
    if (got <= 0) {
        if (got == 0)
            r->doubt = 1;
        return got;
    }
    plan_step *st = plan_record(r, PL_TENSOR, t, r->cur_proven, 1);
    if (st != NULL) {
        st->a = (uintptr_t)infos;
        st->b = (uintptr_t)held;
    }
    r->child_proven = 0;   /* a gradient at the same address can be another */
    int rc = fp_tensor_mix(r, infos, held);   /* (its push holds the gradient) */
    Py_DECREF(held);
    return rc;
}

