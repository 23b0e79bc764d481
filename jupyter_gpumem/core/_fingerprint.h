/* Fingerprints: what proves that a root's walk would read again what it read last time.
 *
 * Included by _reach.c (it uses its pointer sets). A Fingerprint hashes everything a
 * root holds, depth first, in the order a walk reads it, into two 64-bit sums:
 * each object's kind, address and type; an exact dict's version (CPython gives every
 * dict a version, unique in the interpreter, new at each change: the same address with
 * the same version is the same dict with the same keys and values); the length and
 * items of a list, tuple or set, in order; an OrderedDict's order; a plain tensor's
 * data pointer and the backend's own record of its storages (the record is kept by the
 * caller, so it cannot be mistaken for a later one at the same address); a function's
 * code, module name, closure cells, defaults and attributes; a class's dict version and
 * entries. Objects met again hash as their address.
 *
 * It reads more than any walk reads (a superset is safe: more can only say "changed"),
 * never less, and it runs no user code. A kind it cannot prove (an autograd graph, a
 * frame, a numpy array, a type it was not told about...) gives None at once: the
 * caller walks that root again. So does a structure of more than `limit` objects.
 *
 * With plan (1 or 2) it also records what it read as checks, which the next scan runs
 * instead of hashing again (see "plans" below). The Fingerprint is kept from scan to
 * scan (begin() starts one, forget() ends it), with the backend's record of each plain
 * tensor it proved, by the tensor's address (see fp_record).
 *
 * Only where the dict version is known (CPython 3.11 to 3.13 with the GIL, the same
 * condition as DICT_TABLE in _reach.c): elsewhere the type is not built and the scan
 * always walks every root. */
#ifdef DICT_TABLE
#define HAVE_FINGERPRINT 1

/* actions, as the caller's judge gives them for a type (see core/scan_warm.py) */
enum {
    FP_DOUBT = 0, FP_ATOM = 1, FP_DICT = 2, FP_ODICT = 3, FP_DDICT = 4, FP_SEQ = 5,
    FP_SET = 6, FP_ITER = 7, FP_TENSOR = 8, FP_REFERENTS = 9,
    FP_FUNCTION = 10, FP_CELL = 11, FP_TYPE = 12, FP_MODULE = 13, FP_ACTIONS = 14
};

/* a backend's getter (a getset or no-argument method descriptor, called through its C
 * function; anything else through a call) */
typedef struct {
    PyObject *obj;
    PyTypeObject *owner;   /* the descriptor's type: the tensor must be one */
    getter get;
    void *closure;
    PyCFunction meth;
} fp_getter;

#define FP_TYPE_CACHE 512   /* a power of two; emptied when half full */

/* what one plain tensor's reading gave, kept for the rest of the scan (a model's
 * parameters are its optimizer's too): each pointer a strong reference */
typedef struct {
    PyObject *tensor;   /* NULL: an empty slot */
    PyObject *infos;    /* borrowed: the record table (or the walk's record) holds it, and
                           neither lets go of it while the memo has the tensor */
    PyObject *held;
} fp_seen_tensor;

typedef struct {
    fp_seen_tensor *slots;
    size_t cap, n;      /* cap: a power of two, or 0 */
    size_t last;        /* tensors read by the last scan: the next one's first room */
} fp_tensors;

/* the backend's record of one plain tensor, kept from scan to scan so that proving the
 * tensor unchanged asks no dict: by the tensor's address (no reference to it), the
 * record (a strong reference: a weak ref, the storage's stamp, the storages), and the
 * record's weak ref, stamp and storages read out of it */
typedef struct {
    PyObject *tensor;   /* NULL: an empty slot */
    PyObject *rec;
    PyObject *ref;
    PyObject *stamp;
    PyObject *infos;
} fp_record;

typedef struct {
    fp_record *slots;
    size_t cap, n;      /* cap: a power of two, or 0 */
    size_t live;        /* entries at the last sweep */
} fp_records;

typedef struct {
    PyObject_HEAD
    PyObject *judge;     /* judge(type) -> action */
    PyTypeObject *cache_type[FP_TYPE_CACHE];   /* open addressing; strong references */
    unsigned char cache_action[FP_TYPE_CACHE];
    int cache_n;
    fp_getter fn, ptr, held;   /* ptr: its obj is the stamp's getters (stamp_holds) */
    fp_tensors tensors;  /* read in this scan (forget() empties it) */
    fp_records records;  /* the backend's records met in earlier scans (see fp_record) */
    PyObject *taken;     /* a dict or NULL: id -> (storages, label, gradient) of the tensors
                            this scan's walk took (use_taken), read instead of the tensor */
    PyObject *libs;      /* dict: module name -> whether it is a library's (through is_lib) */
    PyObject *is_lib;    /* is_lib(name) -> bool */
    pset stop;           /* objects never entered (their ids) */
    PyObject *known;     /* the backend's record: id(tensor) -> (weak ref, stamp, storages) */
    PyObject *skip_keys; /* a class's entries that are not what it holds (a frozenset) */
    Py_ssize_t limit;
} Fingerprint;

/* -- plans -------------------------------------------------------------------------
 * A plan is what one fingerprint read, kept as checks in the order it read them: the
 * next scan proves the root unchanged by running them (Fingerprint.check), which reads
 * far less than hashing it all again. Each check is of one object by its address, and
 * holds no reference to it: the checks run in the order the fingerprint read, a parent
 * before what it holds, and stop at the first that fails, so each object checked is one
 * that a checked parent holds now, alive (no code runs meanwhile: no collection, and no
 * Python code in the tensor getters: the caller checks first that no torch function
 * mode is on).
 *
 * What a check proves depends on how its object was reached. A dict with the same
 * address and version is the same dict with the same keys and values (versions are
 * unique), so what it holds is "proven": the same objects as before, whose immutable
 * parts (a tuple's items, an atom) need no check at all. A list's items are compared by
 * address, and an address can be another object's since (one freed, another made), so
 * what a list (a set, a cell, a function's parts, an instance's referents, a gradient)
 * holds is not proven: its type is checked, and whether the stop set holds it. A plan
 * reads what the hash reads; where it cannot say (a check failed), the caller hashes. */
enum {
    PL_ATOM, PL_STOP, PL_DICT, PL_ODICT, PL_DDICT, PL_SEQ, PL_ITER, PL_TENSOR, PL_REFS,
    PL_FUNC, PL_LIBFUNC, PL_CELL, PL_TYPE, PL_STATIC, PL_MODULE, PL_EMPTY_SET, PL_ATOMS
};

typedef struct {
    PyObject *obj;          /* an address (no reference: see above) */
    PyTypeObject *type;     /* its exact type then */
    uint8_t kind;
    uint8_t proven;         /* the same object as when recorded (see above) */
    uint8_t visited;        /* read as itself (its stop-set membership is part of it) */
    uint32_t n;             /* words in aux */
    size_t aux;             /* where they start */
    uint64_t a, b;          /* a version, a pointer... (per kind) */
} fp_step;

typedef struct {
    PyObject_HEAD
    fp_step *steps;
    size_t n, cap;
    uintptr_t *aux;
    size_t naux, capaux;
    PyObject *types;        /* a list of weak refs: the heap types its checks compare */
    pset typeset;           /* (while it is recorded) the heap types in types */
    int broken;             /* recording failed (out of memory): it proves nothing */
} FpPlan;

static PyTypeObject FpPlanType;

/* a plan of more checks (or words) than these is not kept: its root is hashed each time,
 * as without plans (a plan costs about 48 bytes a check) */
#define PLAN_MAX_STEPS (1 << 18)
#define PLAN_MAX_WORDS (1 << 20)

typedef struct {
    uint64_t h1, h2;
    Py_ssize_t count;
    PyObject **stack;    /* strong references */
    uint8_t *proven;     /* per stack entry: reached from a parent that proves it */
    uint8_t child_proven;   /* for what is pushed now */
    uint8_t cur_proven;     /* of the object being read */
    FpPlan *plan;        /* NULL: none recorded */
    size_t top, cap;
    pset seen;
    PyObject *held;      /* a list: what seen holds, so no address is reused meanwhile */
    PyObject *keep;      /* a list or NULL: the records and code objects hashed by address */
    const pset *stop;
    int doubt;
} fp_run;

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

static inline uint64_t
fp_final(uint64_t h)
{
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
    h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* a dict's version (see the top of this file) */
static inline uint64_t
fp_version(PyObject *d)
{
    _Pragma("GCC diagnostic push")
    _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
    return ((PyDictObject *)d)->ma_version_tag;
    _Pragma("GCC diagnostic pop")
}

static inline void
fp_mix_ptr(fp_run *r, const void *p)
{
    fp_mix(r, (uint64_t)(uintptr_t)p);
}

/* a check of o appended to the plan being recorded (NULL: none recorded, or it broke) */
static fp_step *
plan_step(fp_run *r, int kind, PyObject *o, int proven, int visited)
{
    FpPlan *p = r->plan;
    if (p == NULL || p->broken)
        return NULL;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        if (cap > PLAN_MAX_STEPS) {
            p->broken = 1;
            return NULL;
        }
        fp_step *steps = PyMem_Realloc(p->steps, cap * sizeof(fp_step));
        if (steps == NULL) {
            p->broken = 1;
            return NULL;
        }
        p->steps = steps;
        p->cap = cap;
    }
    PyTypeObject *tp = Py_TYPE(o);
    if ((tp->tp_flags & Py_TPFLAGS_HEAPTYPE) && !pset_has(&p->typeset, tp)) {
        PyObject *ref = PyWeakref_NewRef((PyObject *)tp, NULL);
        if (ref == NULL || PyList_Append(p->types, ref) < 0 || pset_add(&p->typeset, tp) < 0) {
            Py_XDECREF(ref);
            PyErr_Clear();
            p->broken = 1;
            return NULL;
        }
        Py_DECREF(ref);
    }
    fp_step *st = &p->steps[p->n++];
    st->obj = o;
    st->type = tp;
    st->kind = (uint8_t)kind;
    st->proven = (uint8_t)proven;
    st->visited = (uint8_t)visited;
    st->n = 0;
    st->aux = p->naux;
    st->a = st->b = 0;
    return st;
}

/* a word of the last check's (its items' addresses, types...) */
static void
plan_word(fp_run *r, fp_step *st, uintptr_t w)
{
    FpPlan *p = r->plan;
    if (st == NULL || p->broken)
        return;
    if (p->naux == p->capaux) {
        size_t cap = p->capaux ? p->capaux * 2 : 16;
        if (cap > PLAN_MAX_WORDS) {
            p->broken = 1;
            return;
        }
        uintptr_t *aux = PyMem_Realloc(p->aux, cap * sizeof(uintptr_t));
        if (aux == NULL) {
            p->broken = 1;
            return;
        }
        p->aux = aux;
        p->capaux = cap;
    }
    p->aux[p->naux++] = w;
    st->n++;
}

/* A recorded plan's tables cut to what it holds: a plan is kept per root, most roots
 * are small, and a plan's memory follows its checks, not its tables' growth. */
static void
plan_trim(FpPlan *p)
{
    if (p->cap > p->n) {
        fp_step *steps = PyMem_Realloc(p->steps, (p->n ? p->n : 1) * sizeof(fp_step));
        if (steps != NULL) {
            p->steps = steps;
            p->cap = p->n ? p->n : 1;
        }
    }
    if (p->capaux > p->naux) {
        uintptr_t *aux = PyMem_Realloc(p->aux, (p->naux ? p->naux : 1) * sizeof(uintptr_t));
        if (aux != NULL) {
            p->aux = aux;
            p->capaux = p->naux ? p->naux : 1;
        }
    }
}

static void
plan_words(fp_run *r, fp_step *st, PyObject *const *items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        plan_word(r, st, (uintptr_t)items[i]);
}

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

/* the check of a child hashed where it is met (see fp_inline): an empty table's
 * version or length, a short list's (or an unproven tuple's) length and item types */
static void
plan_inline(fp_run *r, PyObject *o, PyTypeObject *tp, int proven)
{
    if (tp == &PyDict_Type || tp == &PyODict_Type) {
        fp_step *st = plan_step(r, PL_DICT, o, proven, 0);
        if (st != NULL)
            st->a = fp_version(o);
    } else if (tp == &PySet_Type || tp == &PyFrozenSet_Type) {
        if (!(proven && tp == &PyFrozenSet_Type))
            plan_step(r, PL_EMPTY_SET, o, proven, 0);
    } else if (!(proven && tp == &PyTuple_Type)) {   /* a proven tuple: as it was */
        fp_step *st = plan_step(r, PL_ATOMS, o, proven, 0);
        Py_ssize_t n = Py_SIZE(o);
        PyObject *const *items = tp == &PyList_Type ? ((PyListObject *)o)->ob_item :
            ((PyTupleObject *)o)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++)
            plan_word(r, st, (uintptr_t)Py_TYPE(items[i]));
    }
}

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
                plan_step(r, PL_ATOM, o, 0, 0);
        } else if (fp_inline(r, o, tp)) {
            fp_mix_inline(r, o, tp);
            if (r->plan != NULL)
                plan_inline(r, o, tp, r->child_proven);
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

static int
fp_keep(fp_run *r, PyObject *o)
{
    return r->keep == NULL ? 0 : PyList_Append(r->keep, o);
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
    size_t mask = FP_TYPE_CACHE - 1, slot = pset_slot(tp, mask);
    while (f->cache_type[slot] != NULL) {
        if (f->cache_type[slot] == tp)
            return f->cache_action[slot];
        slot = (slot + 1) & mask;
    }
    PyObject *got = PyObject_CallOneArg(f->judge, (PyObject *)tp);
    if (got == NULL)
        return -1;
    long action = PyLong_AsLong(got);
    Py_DECREF(got);
    if (action == -1 && PyErr_Occurred())
        return -1;
    if (action < 0 || action >= FP_ACTIONS)
        action = FP_DOUBT;
    if (2 * (f->cache_n + 1) > FP_TYPE_CACHE) {   /* half full: start again */
        for (int i = 0; i < FP_TYPE_CACHE; i++)
            Py_CLEAR(f->cache_type[i]);
        f->cache_n = 0;
        slot = pset_slot(tp, mask);
    }
    f->cache_type[slot] = (PyTypeObject *)Py_NewRef(tp);
    f->cache_action[slot] = (unsigned char)action;
    f->cache_n++;
    return (int)action;
}

typedef struct {
    PyObject **items;   /* borrowed, while tp_traverse runs and until they are pushed */
    Py_ssize_t n, cap;
    PyObject *small[32];
} fp_found;

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
 * every key is a str (read in place, see dict_table in _reach.c) the version says which
 * keys, and only the values are read */
static int
fp_dict(fp_run *r, PyObject *d)
{
    fp_mix(r, fp_version(d));
    Py_ssize_t n = PyDict_GET_SIZE(d), count = 0, i = 0;
    table_entry *e = dict_table_ok ? dict_table(d, &count) : NULL;
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
        plan_words(r, plan_step(r, step, o, r->cur_proven, 1), got.items, got.n);
    r->child_proven = 0;
    if (rc == 0)
        rc = fp_push_all(r, got.items, got.n);
    if (got.items != got.small)
        PyMem_Free(got.items);
    return rc < 0 ? -1 : 0;
}

/* the slot of t in a table of `cap` entries (a power of two) of `size` bytes each, whose
 * first member is the tensor's address: t's, or the empty one where it would go */
static size_t
fp_probe(const void *slots, size_t size, size_t cap, const PyObject *t)
{
    size_t mask = cap - 1, h = pset_slot((void *)t, mask);
    for (;;) {
        PyObject *const *at = (PyObject *const *)((const char *)slots + h * size);
        if (*at == NULL || *at == t)
            return h;
        h = (h + 1) & mask;
    }
}

static fp_seen_tensor *
fp_tensor_slot(fp_tensors *m, PyObject *t)
{
    return m->cap ? &m->slots[fp_probe(m->slots, sizeof(fp_seen_tensor), m->cap, t)] : NULL;
}

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

static int
fp_tensors_add(fp_tensors *m, PyObject *t, PyObject *infos, PyObject *held)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        while (m->cap == 0 && cap < 2 * (m->last + 1))   /* room for as many as last time */
            cap *= 2;
        fp_seen_tensor *slots = PyMem_Calloc(cap, sizeof(fp_seen_tensor));
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].tensor != NULL)
                slots[fp_probe(slots, sizeof(fp_seen_tensor), cap, m->slots[i].tensor)] =
                    m->slots[i];
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

static fp_record *
fp_record_slot(fp_records *m, PyObject *t)
{
    return m->cap ? &m->slots[fp_probe(m->slots, sizeof(fp_record), m->cap, t)] : NULL;
}

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
    fp_record *slots = PyMem_Calloc(cap, sizeof(fp_record));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        fp_record *e = &m->slots[i];
        if (e->tensor == NULL)
            continue;
        if (fp_referent(e->ref) != e->tensor) {
            Py_CLEAR(e->rec);
            continue;
        }
        slots[fp_probe(slots, sizeof(fp_record), cap, e->tensor)] = *e;
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

/* What a plain tensor's walk would read: the backend's record of its storages
 * (borrowed) and its gradient (a new reference). 1; 0 where it cannot be proved (an
 * autograd graph, no record, a stamp that no longer holds: stamp_holds); -1 with an
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
    PyObject *fn = fp_get(&f->fn, t);
    if (fn == NULL)
        return -1;
    int graph = fn != Py_None;
    Py_DECREF(fn);
    if (graph)
        return 0;   /* an autograd graph: what it holds is walked each time */
    /* the backend's record of t, kept from an earlier scan: it still stands where its weak
       ref is still t's and its stamp holds (the same storage, bytes and address; the
       backend then keeps it too) */
    fp_record *e = fp_record_slot(&f->records, t);
    PyObject *infos = NULL;
    if (e != NULL && e->tensor == t && fp_referent(e->ref) == t) {
        int holds = stamp_holds(f->ptr.obj, t, e->stamp);
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
        int holds = stamp_holds(f->ptr.obj, t, PyTuple_GET_ITEM(rec, 1));
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
    fp_step *st = plan_step(r, PL_TENSOR, t, r->cur_proven, 1);
    if (st != NULL) {
        st->a = (uintptr_t)infos;
        st->b = (uintptr_t)held;
    }
    r->child_proven = 0;   /* a gradient at the same address can be another */
    int rc = fp_tensor_mix(r, infos, held);   /* (its push holds the gradient) */
    Py_DECREF(held);
    return rc;
}

/* Whether `name` (a module's name, as a walk reads it) is a library's: the walk reads
 * nothing inside a library's classes, functions and modules. The name is hashed, so
 * one renamed is seen. 1, 0, or -1 with an error set. */
static int
fp_library(Fingerprint *f, fp_run *r, PyObject *name)
{
    if (name == NULL || !PyUnicode_CheckExact(name)) {
        fp_mix(r, 0);
        return 0;
    }
    Py_hash_t h = PyObject_Hash(name);
    if (h == -1)
        return -1;
    fp_mix(r, (uint64_t)h);
    PyObject *got = PyDict_GetItemWithError(f->libs, name);
    if (got == NULL) {
        if (PyErr_Occurred())
            return -1;
        got = PyObject_CallOneArg(f->is_lib, name);
        if (got == NULL)
            return -1;
        int rc = PyDict_SetItem(f->libs, name, got);
        Py_DECREF(got);
        if (rc < 0)
            return -1;
        got = PyDict_GetItemWithError(f->libs, name);
        if (got == NULL)
            return -1;
    }
    return PyObject_IsTrue(got);
}

/* the hash of a function's module name (0: not a str), as fp_library hashes it */
static Py_hash_t
fp_name_hash(PyObject *name)
{
    return name != NULL && PyUnicode_CheckExact(name) ? PyObject_Hash(name) : 0;
}

/* a function's parts a walk reads: closure, defaults, keyword defaults, its dict (a new
 * reference, made where it was not yet) */
static int
fp_function_parts(PyObject *fn, PyObject *parts[4])
{
    parts[0] = PyFunction_GetClosure(fn);
    parts[1] = PyFunction_GetDefaults(fn);
    parts[2] = PyFunction_GetKwDefaults(fn);
    parts[3] = PyObject_GenericGetDict(fn, NULL);
    return parts[3] == NULL ? -1 : 0;
}

static int
fp_function(Fingerprint *f, fp_run *r, PyObject *fn)
{
    PyObject *code = PyFunction_GetCode(fn);
    fp_mix_ptr(r, code);
    if (fp_keep(r, code) < 0)
        return -1;
    Py_hash_t name = fp_name_hash(PyFunction_GetModule(fn));
    if (name == -1)
        return -1;
    int lib = fp_library(f, r, PyFunction_GetModule(fn));
    fp_step *st = plan_step(r, lib ? PL_LIBFUNC : PL_FUNC, fn, r->cur_proven, 1);
    if (st != NULL) {
        st->a = (uintptr_t)code;
        st->b = (uint64_t)name;
    }
    if (lib != 0)
        return lib;   /* a library's function: nothing of the user's inside */
    PyObject *parts[4];
    if (fp_function_parts(fn, parts) < 0)
        return -1;
    plan_words(r, st, parts, 4);
    r->child_proven = 0;
    int rc = fp_push_all(r, parts, 4);
    Py_DECREF(parts[3]);
    return rc;
}

static int
fp_type(Fingerprint *f, fp_run *r, PyTypeObject *tp)
{
    if (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE) || tp->tp_dict == NULL) {
        plan_step(r, PL_STATIC, (PyObject *)tp, r->cur_proven, 1);
        return 0;   /* a static type: nothing of the user's */
    }
    PyObject *d = tp->tp_dict;
    fp_mix(r, fp_version(d));
    fp_step *st = plan_step(r, PL_TYPE, (PyObject *)tp, r->cur_proven, 1);
    if (st != NULL)
        st->a = fp_version(d);
    r->child_proven = 1;   /* the version says which entries */
    int lib = fp_library(f, r, PyDict_GetItemString(d, "__module__"));
    if (lib != 0)
        return lib;   /* a library's class: the walk reads nothing inside */
    Py_ssize_t pos = 0;
    PyObject *k, *v, *items = PyList_New(0);
    if (items == NULL)
        return -1;
    while (PyDict_Next(d, &pos, &k, &v)) {
        int skip = PyUnicode_CheckExact(k) ? PySet_Contains(f->skip_keys, k) : 0;
        if (skip < 0 || (!skip && PyList_Append(items, v) < 0)) {
            Py_DECREF(items);
            return -1;
        }
    }
    int rc = fp_push_list(r, items);
    Py_DECREF(items);
    return rc;
}

/* Whether every key of dict d hashes in C, with no Python code (str, int, bytes, float,
 * bool, None, exact): an OrderedDict's iteration hashes each key to find its node */
static int
fp_keys_hash_in_c(PyObject *d)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v))   /* (the table itself: no key is hashed) */
        if (!fp_is_atom(Py_TYPE(k)))
            return 0;
    return 1;
}

/* an exact defaultdict's factory (a new reference, or NULL: none, or an error set) */
static PyObject *
fp_factory(PyObject *o)
{
    static PyObject *name = NULL;
    if (name == NULL && (name = PyUnicode_InternFromString("default_factory")) == NULL)
        return NULL;
    PyObject *got = PyObject_GetAttr(o, name);   /* a member of the C type: no code runs */
    if (got == Py_None) {
        Py_DECREF(got);
        return NULL;
    }
    return got;
}

/* an instance's dict made, where its type has one, so that it is read as a dict */
static int
fp_own_dict(PyObject *o)
{
    if (Py_TYPE(o)->tp_dictoffset != 0) {
        PyObject *d = PyObject_GenericGetDict(o, NULL);
        if (d == NULL)
            PyErr_Clear();
        Py_XDECREF(d);
    }
    return 0;
}

static int
fp_visit(Fingerprint *f, fp_run *r, PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    int proven = r->cur_proven;
    int action = fp_action(f, tp);
    if (action < 0)
        return -1;
    fp_mix(r, (uint64_t)action);
    fp_mix_ptr(r, tp);
    if (action == FP_ATOM) {
        if (!proven)
            plan_step(r, PL_ATOM, o, 0, 0);
        return 0;   /* its value is never part of what a walk reads */
    }
    if (action == FP_DOUBT) {
        r->doubt = 1;
        return 0;
    }
    fp_mix_ptr(r, o);
    if (pset_has(&f->stop, o)) {
        if (!proven)
            plan_step(r, PL_STOP, o, 0, 1);
        return 0;   /* never entered by a walk */
    }
    if (Py_REFCNT(o) > 2) {   /* else only its parent (and this walk's stack) holds it: met once */
        int added = pset_add(&r->seen, o);
        if (added < 0)
            return -1;
        if (added == 0)
            return 0;   /* met again: its address said it (checked where first met) */
        if (PyList_Append(r->held, o) < 0)
            return -1;
    }
    if (++r->count > f->limit) {
        r->doubt = 1;
        return 0;
    }
    fp_step *st;
    r->child_proven = 0;
    switch (action) {
    case FP_DICT:
        st = plan_step(r, PL_DICT, o, proven, 1);
        if (st != NULL)
            st->a = fp_version(o);
        r->child_proven = 1;   /* the version says which keys and values */
        return fp_dict(r, o);
    case FP_ODICT: {
        st = plan_step(r, PL_ODICT, o, proven, 1);
        if (st != NULL)
            st->a = fp_version(o);
        /* its order is its own (move_to_end leaves the dict's version as it is); reading
           it hashes each key, so it is read only where no key's hash is Python code */
        if (PyDict_GET_SIZE(o) != 0) {
            if (!fp_keys_hash_in_c(o)) {
                r->doubt = 1;
                return 0;
            }
            PyObject *order = PySequence_List(o);
            if (order == NULL)
                return -1;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++)
                fp_mix_ptr(r, PyList_GET_ITEM(order, i));
            plan_words(r, st, ((PyListObject *)order)->ob_item, PyList_GET_SIZE(order));
            Py_DECREF(order);
        }
        r->child_proven = 1;
        return fp_dict(r, o);
    }
    case FP_DDICT: {
        PyObject *factory = fp_factory(o);
        if (factory == NULL && PyErr_Occurred())
            return -1;
        st = plan_step(r, PL_DDICT, o, proven, 1);
        if (st != NULL) {
            st->a = fp_version(o);
            st->b = (uintptr_t)factory;
        }
        Py_XDECREF(factory);
        fp_mix(r, fp_version(o));
        return fp_referents(r, o, -1);   /* its factory, then its keys and values */
    }
    case FP_SEQ:
        if (PyList_CheckExact(o)) {
            plan_words(r, plan_step(r, PL_SEQ, o, proven, 1), ((PyListObject *)o)->ob_item,
                       PyList_GET_SIZE(o));
            return fp_push_list(r, o);   /* (an item's address can be another's since) */
        }
        if (!proven)
            plan_words(r, plan_step(r, PL_SEQ, o, 0, 1), ((PyTupleObject *)o)->ob_item,
                       PyTuple_GET_SIZE(o));
        r->child_proven = proven;   /* a proven tuple holds what it held */
        return fp_push_all(r, ((PyTupleObject *)o)->ob_item, PyTuple_GET_SIZE(o));
    case FP_SET:
    case FP_ITER: {
        PyObject *items = PySequence_List(o);   /* exact sets, deques: their C iteration */
        if (items == NULL)
            return -1;
        int frozen = proven && tp == &PyFrozenSet_Type;
        if (!frozen)
            plan_words(r, plan_step(r, PL_ITER, o, proven, 1), ((PyListObject *)items)->ob_item,
                       PyList_GET_SIZE(items));
        r->child_proven = frozen;
        int rc = fp_push_list(r, items);
        Py_DECREF(items);
        return rc;
    }
    case FP_TENSOR:
        return fp_tensor(f, r, o);
    case FP_REFERENTS:
        if (fp_own_dict(o) < 0)
            return -1;
        return fp_referents(r, o, PL_REFS);
    case FP_FUNCTION:
        return fp_function(f, r, o);
    case FP_MODULE: {
        PyObject *d = PyModule_GetDict(o);   /* borrowed */
        if (d == NULL)
            return -1;
        fp_mix(r, fp_version(d));
        st = plan_step(r, PL_MODULE, o, proven, 1);
        if (st != NULL)
            st->a = fp_version(d);
        int lib = fp_library(f, r, PyDict_GetItemString(d, "__name__"));
        if (lib == 0)
            r->doubt = 1;   /* a module of the user's: walked each time */
        return lib < 0 ? -1 : 0;
    }
    case FP_CELL: {
        PyObject *got = PyCell_GET(o);
        st = plan_step(r, PL_CELL, o, proven, 1);
        if (st != NULL)
            st->a = (uintptr_t)got;
        return fp_push(r, got != NULL ? got : Py_None);
    }
    case FP_TYPE:
        return fp_type(f, r, (PyTypeObject *)o);
    }
    r->doubt = 1;
    return 0;
}

static void
FpPlan_dealloc(FpPlan *p)
{
    PyMem_Free(p->steps);
    PyMem_Free(p->aux);
    Py_XDECREF(p->types);
    pset_free(&p->typeset);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static Py_ssize_t
FpPlan_len(FpPlan *p)
{
    return (Py_ssize_t)p->n;
}

static PySequenceMethods FpPlan_sequence = {.sq_length = (lenfunc)FpPlan_len};

static PyTypeObject FpPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jupyter_gpumem.core._reach.FingerprintPlan",
    .tp_basicsize = sizeof(FpPlan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What one fingerprint read, as checks (Fingerprint.of(..., plan=1), "
              "Fingerprint.check): see core/_fingerprint.h. len() is its number of checks.",
    .tp_dealloc = (destructor)FpPlan_dealloc,
    .tp_as_sequence = &FpPlan_sequence,
};

/* Fingerprint.of(obj, keep=None, plan=0) -> (h1, h2, objects[, plan]) | None; plan 1:
 * with its plan (None where it could not be kept), 2: a plan or nothing (None as soon
 * as the plan would not be kept: a hash without it is of no use to the caller) */
/* (a Fingerprint made without its __init__ has no judge nor getters) */
static int
fp_ready(Fingerprint *f)
{
    if (f->judge != NULL && f->fn.obj != NULL)
        return 1;
    PyErr_SetString(PyExc_TypeError, "Fingerprint: not initialised");
    return 0;
}

static PyObject *
Fingerprint_of(Fingerprint *f, PyObject *args)
{
    PyObject *obj, *keep = Py_None;
    int want_plan = 0;
    if (!fp_ready(f))
        return NULL;
    if (!PyArg_ParseTuple(args, "O|Oi:of", &obj, &keep, &want_plan))
        return NULL;
    if (keep != Py_None && !PyList_Check(keep)) {
        PyErr_SetString(PyExc_TypeError, "of: keep must be a list or None");
        return NULL;
    }
    fp_run r = {0};
    r.h1 = 0xcbf29ce484222325ull;
    r.h2 = 0x2545f4914f6cdd1dull;
    r.keep = keep == Py_None ? NULL : keep;
    r.stop = &f->stop;
    r.held = PyList_New(0);
    PyObject *result = NULL;
    if (want_plan) {
        r.plan = PyObject_New(FpPlan, &FpPlanType);
        if (r.plan == NULL)
            goto done;
        r.plan->steps = NULL;
        r.plan->aux = NULL;
        r.plan->n = r.plan->cap = r.plan->naux = r.plan->capaux = 0;
        memset(&r.plan->typeset, 0, sizeof(pset));
        r.plan->broken = 0;
        r.plan->types = PyList_New(0);
        if (r.plan->types == NULL)
            goto done;
    }
    if (r.held == NULL || fp_push(&r, obj) < 0)
        goto done;
    while (r.top > 0 && !r.doubt) {
        if (want_plan == 2 && r.plan->broken) {
            r.doubt = 1;
            break;
        }
        PyObject *o = r.stack[--r.top];
        r.cur_proven = r.proven[r.top];
        int rc = fp_visit(f, &r, o);
        Py_DECREF(o);
        if (rc < 0)
            goto done;
    }
    if (r.doubt || (want_plan == 2 && r.plan->broken)) {
        result = Py_NewRef(Py_None);
    } else {
        unsigned long long h1 = fp_final(r.h1 + r.h2), h2 = fp_final(r.h2 ^ fp_rotl(r.h1, 17));
        if (!want_plan) {
            result = Py_BuildValue("(KKn)", h1, h2, r.count);
        } else {
            pset_free(&r.plan->typeset);   /* (only while it is recorded) */
            memset(&r.plan->typeset, 0, sizeof(pset));
            plan_trim(r.plan);
            result = Py_BuildValue("(KKnO)", h1, h2, r.count,
                                   r.plan->broken ? Py_None : (PyObject *)r.plan);
        }
    }
done:
    while (r.top > 0)
        Py_DECREF(r.stack[--r.top]);
    PyMem_Free(r.stack);
    PyMem_Free(r.proven);
    pset_free(&r.seen);
    Py_XDECREF(r.held);
    Py_XDECREF(r.plan);
    return result;
}

/* Whether what plan p checks still holds of root (see "plans" above): 1, 0, -1 with an
 * error. Its first check is of the root it was recorded from: another root (a name bound
 * to another object since) fails there, before any address of the plan is read. */
static int
plan_check(Fingerprint *f, FpPlan *p, PyObject *root)
{
    if (p->broken || p->n == 0 || p->steps[0].obj != root)
        return 0;
    /* the heap types its checks compare are the ones it met: none gone (so none's
       address is another's since) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(p->types); i++)
        if (fp_referent(PyList_GET_ITEM(p->types, i)) == Py_None)
            return 0;
    const fp_step *steps = p->steps;
    for (size_t i = 0; i < p->n; i++) {
        const fp_step *s = &steps[i];
        if (i + 8 < p->n) {
            __builtin_prefetch(steps[i + 8].obj);   /* its header, asked for ahead */
            if (steps[i + 8].kind == PL_TENSOR && f->records.cap)   /* and its record */
                __builtin_prefetch(&f->records.slots[pset_slot(steps[i + 8].obj,
                                                               f->records.cap - 1)]);
        }
        PyObject *o = s->obj;
        /* an object not proven the same can be of another type; an instance of a class
           (a tensor, a module, a class too) can have another class since */
        if ((!s->proven || s->kind == PL_REFS || s->kind == PL_TENSOR || s->kind == PL_TYPE ||
                s->kind == PL_MODULE) && Py_TYPE(o) != s->type)
            return 0;
        if (!s->proven && s->visited && (pset_has(&f->stop, o) != 0) != (s->kind == PL_STOP))
            return 0;
        const uintptr_t *w = p->aux + s->aux;
        switch (s->kind) {
        case PL_ATOM:
        case PL_STOP:
        case PL_STATIC:
            break;
        case PL_DICT:
            if (fp_version(o) != s->a)
                return 0;
            break;
        case PL_ODICT: {
            if (fp_version(o) != s->a)
                return 0;
            if (s->n == 0)
                break;
            PyObject *order = PySequence_List(o);
            if (order == NULL)
                return -1;
            int same = (size_t)PyList_GET_SIZE(order) == s->n &&
                memcmp(((PyListObject *)order)->ob_item, w, s->n * sizeof(uintptr_t)) == 0;
            Py_DECREF(order);
            if (!same)
                return 0;
            break;
        }
        case PL_DDICT: {
            if (fp_version(o) != s->a)
                return 0;
            PyObject *factory = fp_factory(o);
            if (factory == NULL && PyErr_Occurred())
                return -1;
            Py_XDECREF(factory);   /* (the defaultdict holds it) */
            if ((uintptr_t)factory != s->b)
                return 0;
            break;
        }
        case PL_SEQ: {
            PyObject *const *items = PyList_CheckExact(o) ? ((PyListObject *)o)->ob_item :
                ((PyTupleObject *)o)->ob_item;
            if ((size_t)Py_SIZE(o) != s->n ||
                    (s->n && memcmp(items, w, s->n * sizeof(uintptr_t)) != 0))
                return 0;
            break;
        }
        case PL_ITER: {
            PyObject *items = PySequence_List(o);
            if (items == NULL)
                return -1;
            int same = (size_t)PyList_GET_SIZE(items) == s->n && (s->n == 0 ||
                memcmp(((PyListObject *)items)->ob_item, w, s->n * sizeof(uintptr_t)) == 0);
            Py_DECREF(items);
            if (!same)
                return 0;
            break;
        }
        case PL_EMPTY_SET:
            if (PySet_GET_SIZE(o) != 0)
                return 0;
            break;
        case PL_ATOMS: {
            PyObject *const *items = PyList_CheckExact(o) ? ((PyListObject *)o)->ob_item :
                ((PyTupleObject *)o)->ob_item;
            if ((size_t)Py_SIZE(o) != s->n)
                return 0;
            for (size_t j = 0; j < s->n; j++)
                if ((uintptr_t)Py_TYPE(items[j]) != w[j])
                    return 0;
            break;
        }
        case PL_TENSOR: {
            PyObject *infos, *held;
            int got = fp_tensor_read(f, o, &infos, &held, 1);
            if (got <= 0)
                return got;
            Py_DECREF(held);   /* (the tensor holds it: the next checks read it) */
            if ((uintptr_t)infos != s->a || (uintptr_t)held != s->b)
                return 0;
            break;
        }
        case PL_REFS: {
            if (fp_own_dict(o) < 0)
                return -1;
            fp_found got;
            int rc = fp_collect_referents(o, &got);
            int same = rc == 0 && (size_t)got.n == s->n &&
                (s->n == 0 || memcmp(got.items, w, s->n * sizeof(uintptr_t)) == 0);
            if (got.items != got.small)
                PyMem_Free(got.items);
            if (rc < 0)
                return -1;
            if (!same)
                return 0;
            break;
        }
        case PL_FUNC:
        case PL_LIBFUNC: {
            if ((uintptr_t)PyFunction_GetCode(o) != s->a)
                return 0;
            Py_hash_t name = fp_name_hash(PyFunction_GetModule(o));
            if (name == -1)
                return -1;
            if ((uint64_t)name != s->b)
                return 0;
            if (s->kind == PL_LIBFUNC)
                break;
            PyObject *parts[4];
            if (fp_function_parts(o, parts) < 0)
                return -1;
            Py_DECREF(parts[3]);   /* (the function holds it) */
            for (int j = 0; j < 4; j++)
                if ((uintptr_t)parts[j] != w[j])
                    return 0;
            break;
        }
        case PL_CELL:
            if ((uintptr_t)PyCell_GET(o) != s->a)
                return 0;
            break;
        case PL_TYPE: {
            PyObject *d = ((PyTypeObject *)o)->tp_dict;
            if (d == NULL || fp_version(d) != s->a)
                return 0;
            break;
        }
        case PL_MODULE: {
            PyObject *d = PyModule_GetDict(o);
            if (d == NULL || fp_version(d) != s->a)
                return 0;
            break;
        }
        default:
            return 0;
        }
    }
    return 1;
}

/* Fingerprint.check(plan, obj) -> bool */
static PyObject *
Fingerprint_check(Fingerprint *f, PyObject *args)
{
    PyObject *plan, *obj;
    if (!fp_ready(f) || !PyArg_ParseTuple(args, "O!O:check", &FpPlanType, &plan, &obj))
        return NULL;
    int got = plan_check(f, (FpPlan *)plan, obj);
    if (got < 0)
        return NULL;
    return PyBool_FromLong(got);
}

/* What this scan read is let go: the tensors and gradients (read again if asked), the
 * walk's record, and the types judged (none is held while no scan runs: a class of the
 * user's can hold what a purge frees, and the fingerprint is kept from scan to scan). */
static void
fp_forget(Fingerprint *f)
{
    fp_tensors_clear(&f->tensors);
    Py_CLEAR(f->taken);
    for (int i = 0; i < FP_TYPE_CACHE; i++)
        Py_CLEAR(f->cache_type[i]);
    f->cache_n = 0;
}

static int
Fingerprint_init(Fingerprint *f, PyObject *args, PyObject *kwds)
{
    PyObject *judge, *libs, *is_lib, *stop, *known, *get_fn, *get_ptr, *get_held, *skip_keys;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OO!OOO!OOOO!n:Fingerprint", &judge, &PyDict_Type, &libs,
                          &is_lib, &stop, &PyDict_Type, &known, &get_fn, &get_ptr, &get_held,
                          &PyFrozenSet_Type, &skip_keys, &limit))
        return -1;
    PyObject *it = PyObject_GetIter(stop);
    if (it == NULL)
        return -1;
    /* (made again: nothing of its last making stays) */
    pset_free(&f->stop);
    fp_forget(f);
    fp_records_clear(&f->records);
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        void *p = PyLong_AsVoidPtr(item);
        Py_DECREF(item);
        if ((p == NULL && PyErr_Occurred()) || pset_add(&f->stop, p) < 0) {
            Py_DECREF(it);
            return -1;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return -1;
    Py_XSETREF(f->judge, Py_NewRef(judge));
    Py_XSETREF(f->libs, Py_NewRef(libs));
    Py_XSETREF(f->is_lib, Py_NewRef(is_lib));
    Py_XSETREF(f->known, Py_NewRef(known));
    PyObject *getters[3] = {get_fn, get_ptr, get_held};
    fp_getter *slots[3] = {&f->fn, &f->ptr, &f->held};
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(slots[i]->obj);
        fp_getter_set(slots[i], Py_NewRef(getters[i]));
    }
    Py_XSETREF(f->skip_keys, Py_NewRef(skip_keys));
    f->limit = limit;
    return 0;
}


static void
Fingerprint_dealloc(Fingerprint *f)
{
    Py_CLEAR(f->judge);
    Py_CLEAR(f->libs);
    Py_CLEAR(f->is_lib);
    Py_CLEAR(f->known);
    Py_CLEAR(f->fn.obj);
    Py_CLEAR(f->ptr.obj);
    Py_CLEAR(f->held.obj);
    fp_forget(f);
    fp_records_clear(&f->records);
    Py_CLEAR(f->skip_keys);
    pset_free(&f->stop);
    Py_TYPE(f)->tp_free((PyObject *)f);
}


static PyObject *
Fingerprint_forget(Fingerprint *f, PyObject *unused)
{
    fp_forget(f);
    Py_RETURN_NONE;
}

/* A new scan: as after forget(); the records of tensors are kept, those of tensors gone
 * dropped once they outnumber the rest. */
static PyObject *
Fingerprint_begin(Fingerprint *f, PyObject *unused)
{
    fp_forget(f);
    if (f->records.n > 2 * f->records.live + 1024 && fp_records_sweep(&f->records, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Fingerprint_use_taken(Fingerprint *f, PyObject *taken)
{
    if (taken != Py_None && !PyDict_Check(taken)) {
        PyErr_SetString(PyExc_TypeError, "use_taken: a dict or None");
        return NULL;
    }
    fp_tensors_clear(&f->tensors);   /* (its entries can borrow from the last record) */
    Py_XSETREF(f->taken, taken == Py_None ? NULL : Py_NewRef(taken));
    Py_RETURN_NONE;
}

static PyMethodDef Fingerprint_methods[] = {
    {"forget", (PyCFunction)Fingerprint_forget, METH_NOARGS,
     "forget(): the tensors and types read so far are read again, and what the walk took "
     "is not used (other code ran meanwhile, or the scan is over)"},
    {"begin", (PyCFunction)Fingerprint_begin, METH_NOARGS,
     "begin(): a new scan, as after forget() (the backend's records of tensors are kept)"},
    {"use_taken", (PyCFunction)Fingerprint_use_taken, METH_O,
     "use_taken(dict | None): id -> (storages, label, gradient) of the tensors this scan's "
     "walk took, read instead of asking each tensor (valid while no other code runs)"},
    {"check", (PyCFunction)Fingerprint_check, METH_VARARGS,
     "check(plan, obj) -> bool: whether what the plan checks holds still of obj, the root "
     "it was taken of (True: of(obj) would give the fingerprint taken with it)"},
    {"of", (PyCFunction)Fingerprint_of, METH_VARARGS,
     "of(obj, keep=None, plan=0) -> (h1, h2, objects[, plan]) | None: what obj holds, "
     "hashed (None: it cannot be proved, walk it); keep (a list) gets the records hashed by "
     "address; plan 1: with what was read as checks (None where it could not be kept), 2: "
     "None as soon as the plan could not be kept"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject FingerprintType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jupyter_gpumem.core._reach.Fingerprint",
    .tp_basicsize = sizeof(Fingerprint),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Fingerprint(judge, libs, is_lib, stop_ids, known, get_fn, get_ptr, "
              "get_held, skip_keys, limit): see core/_fingerprint.h",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Fingerprint_init,
    .tp_dealloc = (destructor)Fingerprint_dealloc,
    .tp_methods = Fingerprint_methods,
};
#endif
