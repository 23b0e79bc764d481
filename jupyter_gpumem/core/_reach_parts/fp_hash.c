/* fp_hash.c: the fingerprint's hashing run, what it mixes and how it reads a container
 * (part of _reach.c; the Fingerprint and its invariants are in fingerprint.h).
 *
 * A Fingerprint hashes everything a root holds, depth first, in the order a walk reads
 * it, into two 64-bit sums: each object's kind, address and type; an exact dict's
 * version (CPython gives every dict a version, unique in the interpreter, new at each
 * change: the same address with the same version is the same dict with the same keys and
 * values); the length and items of a list, tuple or set, in order; an OrderedDict's
 * order; a plain tensor's data pointer and the backend's own record of its storages (the
 * record is kept by the caller, so it cannot be mistaken for a later one at the same
 * address); a function's code, module name, closure cells, defaults and attributes; a
 * class's dict version and entries. With a plan asked for, it also records what it read
 * as checks (plan.c). Start at fp_py_of (fingerprint.c), then fp_visit (fp_kinds.c). */

/* ==== the sums ====================================================================== */

/* x rotated left by k bits */
static inline uint64_t
fp_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* one word into both sums, as MurmurHash3 takes a block: the word is mixed on its own
 * (two multiplies that do not wait on the sums), then each sum takes it in three quick
 * steps; the sums are mixed whole once, at the end (fp_final) */
static inline void
fp_mix(fp_run *r, uint64_t w)
{
    uint64_t k1 = fp_rotl(w * 0x87c37b91114253d5ull, 31) * 0x4cf5ad432745937full;
    uint64_t k2 = fp_rotl(w * 0x4cf5ad432745937full, 33) * 0x87c37b91114253d5ull;
    r->h1 = fp_rotl(r->h1 ^ k1, 27) * 5 + 0x52dce729;
    r->h2 = fp_rotl(r->h2 ^ k2, 31) * 5 + 0x38495ab5;
}

/* a sum mixed whole, once, at the end (MurmurHash3's finalizer) */
static inline uint64_t
fp_final(uint64_t h)
{
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
    h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* a dict's version (unique in the interpreter, new at each change: see fp_hash.c's top) */
static inline uint64_t
fp_version(PyObject *d)
{
    _Pragma("GCC diagnostic push")
    _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
    return ((PyDictObject *)d)->ma_version_tag;
    _Pragma("GCC diagnostic pop")
}

/* an address into both sums */
static inline void
fp_mix_ptr(fp_run *r, const void *p)
{
    fp_mix(r, (uint64_t)(uintptr_t)p);
}

/* ==== the run's stack, and the children hashed where they are met ================== */

/* o stacked (a strong reference), with whether what reached it proves it; -1 out of
 * memory. */
static int
fp_push(fp_run *r, PyObject *o)
{
    if (r->top == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 256;
        PyObject **s = PyMem_Realloc(r->stack, cap * sizeof(PyObject *));
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->stack = s;
        uint8_t *pr = PyMem_Realloc(r->proven, cap);
        if (pr == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->proven = pr;
        r->cap = cap;
    }
    r->proven[r->top] = r->child_proven;
    r->stack[r->top++] = Py_NewRef(o);
    return 0;
}

/* Whether tp is an atom's type (its value is never part of what a walk reads). */
static inline int
fp_is_atom(PyTypeObject *tp)
{
    return tp == &PyLong_Type || tp == &PyUnicode_Type || tp == &PyFloat_Type ||
        tp == &PyBool_Type || tp == Py_TYPE(Py_None) || tp == &PyBytes_Type;
}

#define FP_BELOW 0x5a17c0de5a17c0deull   /* a child read after its siblings' marks */

/* An object's children, in order: their count, then for each the type of an atom (its
 * value is never part of what a walk reads) or a mark, then (pushed in reverse, so
 * they are read in their order) each non-atom's own hash, depth first. */
/* A child hashed where it is met, never stacked: an empty exact dict, OrderedDict,
 * list, tuple or set (a module carries a dozen empty tables of hooks), or a short
 * exact list or tuple of atoms (a record's tags). */
#define FP_SHALLOW 8
static inline int
fp_inline(fp_run *r, PyObject *o, PyTypeObject *tp)
{
    Py_ssize_t n;
    PyObject *const *items;
    if (tp == &PyDict_Type || tp == &PyODict_Type) {
        if (PyDict_GET_SIZE(o) != 0)
            return 0;
        n = 0;
        items = NULL;
    } else if (tp == &PyList_Type) {
        n = PyList_GET_SIZE(o);
        items = ((PyListObject *)o)->ob_item;
    } else if (tp == &PyTuple_Type) {
        n = PyTuple_GET_SIZE(o);
        items = ((PyTupleObject *)o)->ob_item;
    } else if (tp == &PySet_Type || tp == &PyFrozenSet_Type) {
        if (PySet_GET_SIZE(o) != 0)
            return 0;
        n = 0;
        items = NULL;
    } else {
        return 0;
    }
    if (n > FP_SHALLOW)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!fp_is_atom(Py_TYPE(items[i])))
            return 0;
    return 1;   /* (one the walk never enters holds nothing to enter either) */
}

/* a child hashed where it is met (see fp_inline): its type, address, and version or
 * length and item types */
static void
fp_mix_inline(fp_run *r, PyObject *o, PyTypeObject *tp)
{
    fp_mix_ptr(r, tp);
    fp_mix_ptr(r, o);
    if (tp == &PyDict_Type || tp == &PyODict_Type) {
        fp_mix(r, fp_version(o));
        return;
    }
    Py_ssize_t n = tp == &PyList_Type ? PyList_GET_SIZE(o) :
        tp == &PyTuple_Type ? PyTuple_GET_SIZE(o) : 0;
    PyObject *const *items = tp == &PyList_Type ? ((PyListObject *)o)->ob_item :
        ((PyTupleObject *)o)->ob_item;
    fp_mix(r, (uint64_t)n);
    for (Py_ssize_t i = 0; i < n; i++)
        fp_mix_ptr(r, Py_TYPE(items[i]));
}

/* n children hashed in order (see "An object's children" above), the non-atoms stacked
 * in reverse; -1 out of memory. */
static int
fp_push_all(fp_run *r, PyObject *const *items, Py_ssize_t n)
{
    fp_mix(r, (uint64_t)n);
    Py_ssize_t small[64], *below = n <= 64 ? small : PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    if (below == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++)   /* each child's header asked for at once */
        if (items[i] != NULL)
            __builtin_prefetch(items[i]);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = items[i] != NULL ? items[i] : Py_None;
        PyTypeObject *tp = Py_TYPE(o);
        if (fp_is_atom(tp)) {
            fp_mix_ptr(r, tp);
            if (r->plan != NULL && !r->child_proven && items[i] != NULL)
                plan_record(r, PL_ATOM, o, 0, 0);
        } else if (fp_inline(r, o, tp)) {
            fp_mix_inline(r, o, tp);
            if (r->plan != NULL)
                plan_record_inline(r, o, tp, r->child_proven);
        } else {
            fp_mix(r, FP_BELOW);
            below[m++] = i;
        }
    }
    int rc = 0;
    while (m > 0 && rc == 0)
        rc = fp_push(r, items[below[--m]]);
    if (below != small)
        PyMem_Free(below);
    return rc;
}

/* ==== a backend's getters, and the type cache ======================================= */

/* g set to call getter o (a new reference g holds) through its C function where it is a
 * getset or a no-argument method descriptor. */
static void
fp_getter_set(fp_getter *g, PyObject *o)
{
    g->obj = o;
    g->owner = NULL;
    g->get = NULL;
    g->closure = NULL;
    g->meth = NULL;
    if (Py_IS_TYPE(o, &PyGetSetDescr_Type)) {
        PyGetSetDescrObject *d = (PyGetSetDescrObject *)o;
        if (d->d_getset != NULL && d->d_getset->get != NULL) {
            g->owner = PyDescr_TYPE(d);
            g->get = d->d_getset->get;
            g->closure = d->d_getset->closure;
        }
    } else if (Py_IS_TYPE(o, &PyMethodDescr_Type)) {
        PyMethodDescrObject *d = (PyMethodDescrObject *)o;
        int flags = d->d_method->ml_flags & ~(METH_COEXIST);
        if (flags == METH_NOARGS) {
            g->owner = PyDescr_TYPE(d);
            g->meth = d->d_method->ml_meth;
        }
    }
}

/* What getter g gives of tensor t (a new reference; NULL with an error set). */
static inline PyObject *
fp_get(fp_getter *g, PyObject *t)
{
    if (g->owner != NULL && PyObject_TypeCheck(t, g->owner)) {
        if (g->get != NULL)
            return g->get(t, g->closure);
        return g->meth(t, NULL);
    }
    if (Py_IS_TYPE(g->obj, &PyGetSetDescr_Type))
        return Py_TYPE(g->obj)->tp_descr_get(g->obj, t, (PyObject *)Py_TYPE(t));
    return PyObject_CallOneArg(g->obj, t);
}

/* Whether getter g gives tensor t something other than None: 1 or 0 (-1 with an error
   set). A getter not given (obj NULL) gives nothing. */
static int
fp_get_some(fp_getter *g, PyObject *t)
{
    if (g->obj == NULL)
        return 0;
    PyObject *got = fp_get(g, t);
    if (got == NULL)
        return -1;
    int some = got != Py_None;
    Py_DECREF(got);
    return some;
}

/* o appended to the run's keep list (where one was given): hashed by its address. */
static int
fp_keep(fp_run *r, PyObject *o)
{
    return r->keep == NULL ? 0 : PyList_Append(r->keep, o);
}

/* The type cache emptied (its types let go). */
static void
fp_types_clear(Fingerprint *f)
{
    for (int i = 0; i < FP_TYPE_CACHE; i++)
        Py_CLEAR(f->types[i].type);
    f->ntypes = 0;
}

/* the action for objects of type tp: judged once in Python, then kept here (with a
 * strong reference to the type, so its address is not another type's meanwhile) */
static int
fp_action(Fingerprint *f, PyTypeObject *tp)
{
    if (fp_is_atom(tp))
        return FP_ATOM;
    if (tp == &PyDict_Type)
        return FP_DICT;
    if (tp == &PyList_Type || tp == &PyTuple_Type)
        return FP_SEQ;
    size_t slot = tab_find(f->types, sizeof(fp_type_slot), FP_TYPE_CACHE, tp);
    if (f->types[slot].type == tp)
        return f->types[slot].action;
    PyObject *got = PyObject_CallOneArg(f->judge, (PyObject *)tp);
    if (got == NULL)
        return -1;
    long action = PyLong_AsLong(got);
    Py_DECREF(got);
    if (action == -1 && PyErr_Occurred())
        return -1;
    if (action < 0 || action >= FP_ACTIONS)
        action = FP_DOUBT;
    if (2 * (f->ntypes + 1) > FP_TYPE_CACHE) {   /* half full: start again */
        fp_types_clear(f);
        slot = tab_find(f->types, sizeof(fp_type_slot), FP_TYPE_CACHE, tp);
    }
    f->types[slot].type = (PyTypeObject *)Py_NewRef(tp);
    f->types[slot].action = (unsigned char)action;
    f->ntypes++;
    return (int)action;
}

/* ==== reading a container ========================================================== */

/* what a tp_traverse visits, gathered (borrowed, while no code runs) */
typedef struct {
    PyObject **items;   /* borrowed, while tp_traverse runs and until they are pushed */
    Py_ssize_t n, cap;
    PyObject *small[32];
} fp_found;

/* tp_traverse's callback: o appended to the gathered items; -1 out of memory. */
static int
fp_collect(PyObject *o, void *arg)
{
    fp_found *got = arg;
    if (o == NULL)
        return 0;
    if (got->n == got->cap) {
        Py_ssize_t cap = got->cap * 2;
        PyObject **items = got->items == got->small ? PyMem_Malloc(cap * sizeof(PyObject *))
                                                    : PyMem_Realloc(got->items, cap * sizeof(PyObject *));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (got->items == got->small)
            memcpy(items, got->small, sizeof(got->small));
        got->items = items;
        got->cap = cap;
    }
    got->items[got->n++] = o;
    return 0;
}

/* a dict's entries: its version, then the key and value of each in order; where
 * every key is a str (read in place, see dict.h) the version says which
 * keys, and only the values are read */
static int
fp_dict(fp_run *r, PyObject *d)
{
    fp_mix(r, fp_version(d));
    Py_ssize_t n = PyDict_GET_SIZE(d), count = 0, i = 0;
    dict_entry *e = dict_table_ok ? dict_table(d, &count) : NULL;
    PyObject *small[64] = {NULL};
    PyObject **items = n <= 32 ? small : PyMem_Malloc((size_t)(2 * n) * sizeof(PyObject *));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (e != NULL) {
        fp_mix(r, 1);   /* values only */
        for (Py_ssize_t j = 0; j < count && i < n; j++)
            if (e[j].me_value != NULL)
                items[i++] = e[j].me_value;
    } else {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (i < 2 * n && PyDict_Next(d, &pos, &k, &v)) {
            items[i++] = k;
            items[i++] = v;
        }
    }
    int rc = fp_push_all(r, items, i);
    if (items != small)
        PyMem_Free(items);
    return rc;
}

/* the objects a list gives (its items, or what tp_traverse visits), in order */
static int
fp_push_list(fp_run *r, PyObject *list)
{
    return fp_push_all(r, ((PyListObject *)list)->ob_item, PyList_GET_SIZE(list));
}

/* what o's tp_traverse visits, in order (into got: its items borrowed while no code runs) */
static int
fp_collect_referents(PyObject *o, fp_found *got)
{
    traverseproc traverse = Py_TYPE(o)->tp_traverse;
    got->items = got->small;
    got->n = 0;
    got->cap = 32;
    return traverse != NULL ? traverse(o, fp_collect, got) : 0;
}

/* o's referents pushed; with step (a plan's kind, else -1) checked by their addresses */
static int
fp_referents(fp_run *r, PyObject *o, int step)
{
    fp_found got;
    int rc = fp_collect_referents(o, &got);
    if (rc == 0 && step >= 0)
        plan_record_words(r, plan_record(r, step, o, r->cur_proven, 1), got.items, got.n);
    r->child_proven = 0;
    if (rc == 0)
        rc = fp_push_all(r, got.items, got.n);
    if (got.items != got.small)
        PyMem_Free(got.items);
    return rc < 0 ? -1 : 0;
}
