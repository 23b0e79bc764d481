/* The reach walk's core at C speed: what plain containers and plain instances hold.
 *
 * A Walker takes objects of the "plain" types (exact dicts, lists, tuples, sets and
 * the other types the scan reads through the collector: what gc.get_referents reads)
 * and walks everything they hold, depth first, without running any user code:
 * exact lists, tuples and dicts are read item by item (so a walk can stop and go on
 * inside one), every other plain object through its type's tp_traverse, as
 * gc.get_referents does. What is not plain (tensors, modules, classes, functions,
 * frames, numpy arrays, types not learned yet) is handed back to Python, once.
 *
 * Objects that only their parent holds (a reference count of 1) cannot be met again,
 * so only objects held more than once are remembered; each remembered or stacked
 * object is held by a strong reference until the walk is cleared, so an object that
 * goes while the walk waits between two runs cannot be mistaken for a new one.
 *
 * It also reads and writes small /proc files without letting go of the interpreter
 * lock (pread_held, write_held): such a read never waits on a disk, and each time
 * the main thread lets go of the lock a kernel's busy I/O thread may take it for as
 * long as a message takes to send, several times per cell's footer.
 *
 * This module is optional: jupyter_gpumem.core.scan_reach walks in Python (the same
 * objects, the same answers) where it is not built, and jupyter_gpumem.core.devices
 * reads /proc through os.pread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifndef _WIN32
#include <errno.h>
#include <unistd.h>
#endif
#include <stdint.h>

/* -- a set of pointers (open addressing) ------------------------------------------- */
typedef struct {
    void **keys;
    size_t cap;   /* a power of two, or 0 */
    size_t n;
} pset;

static size_t
pset_slot(void *p, size_t mask)
{
    return (size_t)((((uintptr_t)p) >> 4) * (uint64_t)11400714819323198485ull) & mask;
}

static int
pset_grow(pset *s)
{
    size_t cap = s->cap ? s->cap * 2 : 32;
    void **keys = PyMem_Calloc(cap, sizeof(void *));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < s->cap; i++) {
        void *k = s->keys[i];
        if (k != NULL) {
            size_t h = pset_slot(k, cap - 1);
            while (keys[h] != NULL)
                h = (h + 1) & (cap - 1);
            keys[h] = k;
        }
    }
    PyMem_Free(s->keys);
    s->keys = keys;
    s->cap = cap;
    return 0;
}

/* 1: added, 0: there already, -1: out of memory */
static int
pset_add(pset *s, void *p)
{
    if ((s->n + 1) * 2 > s->cap && pset_grow(s) < 0)
        return -1;
    size_t mask = s->cap - 1, h = pset_slot(p, mask);
    while (s->keys[h] != NULL) {
        if (s->keys[h] == p)
            return 0;
        h = (h + 1) & mask;
    }
    s->keys[h] = p;
    s->n++;
    return 1;
}

static int
pset_has(const pset *s, void *p)
{
    if (s->n == 0)
        return 0;
    size_t mask = s->cap - 1, h = pset_slot(p, mask);
    while (s->keys[h] != NULL) {
        if (s->keys[h] == p)
            return 1;
        h = (h + 1) & mask;
    }
    return 0;
}

static void
pset_free(pset *s)
{
    PyMem_Free(s->keys);
    s->keys = NULL;
    s->cap = s->n = 0;
}

/* -- the walker ---------------------------------------------------------------------- */
typedef struct {
    PyObject *obj;    /* a strong reference */
    Py_ssize_t pos;   /* where reading a list, tuple or dict goes on */
    int depth;
} frame;

typedef struct {
    PyObject_HEAD
    pset plain;        /* types walked here */
    pset known;        /* types Python has classified (the plain ones among them) */
    pset watch;        /* types the collector does not track whose instances matter */
    pset stop;         /* objects not to enter (their ids) */
    pset seen;         /* objects held more than once, met already (each held) */
    PyObject *held;    /* a list holding the remembered objects */
    frame *stack;
    size_t top, cap;
    PyObject *out;     /* what this run hands back to Python */
    PyObject *clock;   /* a callable giving the time, compared with run()'s deadline */
    int check_singles; /* look objects only their parent holds up in stop too */
    int max_depth;
    int deep;          /* a structure deeper than max_depth was cut */
    int failed;        /* out of memory inside a visit */
    int paused;        /* an object of a type not classified yet was handed back */
    Py_ssize_t count;  /* objects entered */
    int depth;         /* of the object whose referents a tp_traverse visits */
} Walker;

static int
push(Walker *w, PyObject *o, int depth)
{
    if (w->top == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        frame *stack = PyMem_Realloc(w->stack, cap * sizeof(frame));
        if (stack == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        w->stack = stack;
        w->cap = cap;
    }
    Py_INCREF(o);
    w->stack[w->top].obj = o;
    w->stack[w->top].pos = 0;
    w->stack[w->top].depth = depth;
    w->top++;
    w->count++;
    return 0;
}

/* Whether the class of an object can be a key of Python's sets and dicts: its
   metaclass hashes and compares as type does. One that defines __hash__ or __eq__
   would run that code (or fail: __eq__ alone makes its classes unhashable), so its
   instances are never handed back to Python: they are walked here, through their
   type's tp_traverse (see scan_types.keyable_meta, the same rule in Python). */
static int
keyable_class(PyTypeObject *tp)
{
    PyTypeObject *meta = Py_TYPE(tp);
    return meta == &PyType_Type || (meta->tp_hash == PyType_Type.tp_hash
                                    && meta->tp_richcompare == PyType_Type.tp_richcompare);
}

/* One object met inside a plain one, at ``depth``: entered, handed back, or left. */
static int
consider(Walker *w, PyObject *o, int depth)
{
    PyTypeObject *tp = Py_TYPE(o);
    if (!(PyObject_IS_GC(o) && PyObject_GC_IsTracked(o))) {
        /* atoms, and dicts and tuples of atoms only, hold nothing; a few untracked
           types still matter (numpy arrays, some frameworks' tensors) */
        if (w->watch.n == 0 || !pset_has(&w->watch, tp))
            return 0;
    }
    int plain = pset_has(&w->plain, tp) || !keyable_class(tp);
    if (plain && depth > w->max_depth) {
        w->deep = 1;
        return 0;
    }
    if (Py_REFCNT(o) > 1) {
        int added = pset_add(&w->seen, o);
        if (added < 0)
            return -1;
        if (added == 0)
            return 0;
        if (PyList_Append(w->held, o) < 0)
            return -1;
        if (w->stop.n && pset_has(&w->stop, o) && plain)
            return 0;
    }
    else if (w->check_singles && w->stop.n && pset_has(&w->stop, o) && plain) {
        return 0;
    }
    if (plain)
        return push(w, o, depth);
    if (!pset_has(&w->known, tp))
        w->paused = 1;   /* Python classifies its type before the walk goes on */
    return PyList_Append(w->out, o);   /* Python decides (a stopped one too) */
}

static int
visit(PyObject *o, void *arg)
{
    Walker *w = (Walker *)arg;
    if (consider(w, o, w->depth + 1) < 0) {
        w->failed = 1;
        return 1;   /* stops the traversal */
    }
    return 0;
}

static void
clear_state(Walker *w)
{
    while (w->top) {
        w->top--;
        Py_CLEAR(w->stack[w->top].obj);
    }
    pset_free(&w->seen);
    if (w->held != NULL)
        (void)PyList_SetSlice(w->held, 0, PyList_GET_SIZE(w->held), NULL);
    w->deep = 0;
    w->count = 0;
}

static void
Walker_dealloc(Walker *w)
{
    clear_state(w);
    PyMem_Free(w->stack);
    pset_free(&w->plain);
    pset_free(&w->known);
    pset_free(&w->watch);
    pset_free(&w->stop);
    Py_XDECREF(w->held);
    Py_XDECREF(w->out);
    Py_XDECREF(w->clock);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Every item of ``items`` into ``s``: types (``ids`` 0; other objects are left out)
   or ids (``ids`` 1: ints, the addresses id() gives). */
static int
fill(pset *s, PyObject *items, int ids)
{
    PyObject *it = PyObject_GetIter(items);
    if (it == NULL)
        return -1;
    PyObject *item;
    int r = 0;
    while (r == 0 && (item = PyIter_Next(it)) != NULL) {
        void *p = NULL;
        if (ids) {
            p = PyLong_AsVoidPtr(item);
            if (p == NULL && PyErr_Occurred())
                r = -1;
        }
        else if (PyType_Check(item)) {
            p = item;   /* types the scan knows are held by the scan */
        }
        Py_DECREF(item);
        if (p != NULL && pset_add(s, p) < 0)
            r = -1;
    }
    Py_DECREF(it);
    return (r < 0 || PyErr_Occurred()) ? -1 : 0;
}

static PyObject *
Walker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"plain", "watch", "stop", "check_singles", "max_depth", "clock",
                             NULL};
    PyObject *plain, *watch, *stop, *clock;
    int check_singles, max_depth;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOpiO", kwlist, &plain, &watch, &stop,
                                     &check_singles, &max_depth, &clock))
        return NULL;
    if (!PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "clock must be callable");
        return NULL;
    }
    Walker *w = (Walker *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    w->check_singles = check_singles;
    w->max_depth = max_depth;
    Py_INCREF(clock);
    w->clock = clock;
    w->held = PyList_New(0);
    w->out = PyList_New(0);
    if (w->held == NULL || w->out == NULL || fill(&w->plain, plain, 0) < 0
        || fill(&w->known, plain, 0) < 0 || fill(&w->watch, watch, 0) < 0
        || fill(&w->stop, stop, 1) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

/* learn(tp, plain, watch): Python's verdict on a type. */
static PyObject *
Walker_learn(Walker *w, PyObject *args)
{
    PyObject *tp;
    int plain, watch;
    if (!PyArg_ParseTuple(args, "O!pp", &PyType_Type, &tp, &plain, &watch))
        return NULL;
    if (pset_add(&w->known, tp) < 0 || (plain && pset_add(&w->plain, tp) < 0)
        || (watch && pset_add(&w->watch, tp) < 0))
        return NULL;
    Py_RETURN_NONE;
}

/* push(objs, depth): plain objects to walk, from Python (not looked up in seen). */
static PyObject *
Walker_push(Walker *w, PyObject *args)
{
    PyObject *objs;
    int depth;
    if (!PyArg_ParseTuple(args, "O!i", &PyList_Type, &objs, &depth))
        return NULL;
    for (Py_ssize_t i = PyList_GET_SIZE(objs) - 1; i >= 0; i--) {
        PyObject *o = PyList_GET_ITEM(objs, i);
        if (Py_REFCNT(o) > 2) {   /* the list's reference and another: remember it */
            int added = pset_add(&w->seen, o);
            if (added < 0 || (added == 1 && PyList_Append(w->held, o) < 0))
                return NULL;
        }
        if (push(w, o, depth) < 0)
            return NULL;
    }
    w->count -= PyList_GET_SIZE(objs);   /* counted by Python already */
    Py_RETURN_NONE;
}

#define CHECK_EVERY 1024

/* run(deadline): walk until the stack is empty (returns (handed back, True)), the
   clock passes ``deadline`` or an object of a type not classified yet is met
   (returns (handed back, False): classify the types handed back, then run again). */
static PyObject *
Walker_run(Walker *w, PyObject *arg)
{
    double deadline = PyFloat_AsDouble(arg);
    if (deadline == -1.0 && PyErr_Occurred())
        return NULL;
    unsigned steps = 0;
    int done = 1;
    w->failed = 0;
    w->paused = 0;
    while (w->top && !w->paused) {
        if (++steps % CHECK_EVERY == 0) {
            PyObject *now = PyObject_CallNoArgs(w->clock);
            if (now == NULL)
                return NULL;
            double t = PyFloat_AsDouble(now);
            Py_DECREF(now);
            if (t == -1.0 && PyErr_Occurred())
                return NULL;
            if (t >= deadline) {
                done = 0;
                break;
            }
        }
        frame *f = &w->stack[w->top - 1];
        PyObject *o = f->obj;
        int depth = f->depth + 1;
        if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
            /* the length read again each step: a list can change between two runs */
            if (f->pos < PySequence_Fast_GET_SIZE(o)) {
                /* borrowed: nothing consider() does runs code that could drop it (no
                   object the collector tracks is made), and a reference of ours would
                   hide that only the list holds it */
                PyObject *item = PySequence_Fast_GET_ITEM(o, f->pos);
                f->pos++;
                if (consider(w, item, depth) < 0)
                    return NULL;
                continue;
            }
        }
        else if (PyDict_CheckExact(o)) {
            PyObject *k, *v;
            if (PyDict_Next(o, &f->pos, &k, &v)) {   /* borrowed, as above */
                if (consider(w, k, depth) < 0 || consider(w, v, depth) < 0)
                    return NULL;
                continue;
            }
        }
        else {
            /* read whole through its type's traverse, as gc.get_referents does */
            w->top--;
            w->depth = f->depth;
            traverseproc traverse = Py_TYPE(o)->tp_traverse;
            if (PyObject_IS_GC(o) && traverse != NULL)
                traverse(o, visit, w);
            Py_DECREF(o);
            if (w->failed)
                return NULL;
            continue;
        }
        /* a list, tuple or dict read to its end */
        w->top--;
        Py_DECREF(o);
    }
    PyObject *out = w->out;
    w->out = PyList_New(0);
    if (w->out == NULL) {
        w->out = out;
        return NULL;
    }
    if (w->paused && w->top)
        done = 0;
    PyObject *result = Py_BuildValue("(NO)", out, done ? Py_True : Py_False);
    return result;
}

static PyObject *
Walker_clear(Walker *w, PyObject *Py_UNUSED(ignored))
{
    clear_state(w);
    (void)PyList_SetSlice(w->out, 0, PyList_GET_SIZE(w->out), NULL);
    Py_RETURN_NONE;
}

static PyObject *
Walker_get_pending(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(w->top);
}

static PyObject *
Walker_get_count(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(w->count);
}

static PyObject *
Walker_get_deep(Walker *w, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(w->deep);
}

static PyMethodDef Walker_methods[] = {
    {"learn", (PyCFunction)Walker_learn, METH_VARARGS,
     "learn(tp, plain, watch): tp is classified; walked here if plain; looked at "
     "untracked if watch (types are held by the caller)."},
    {"push", (PyCFunction)Walker_push, METH_VARARGS,
     "push(objs, depth): plain objects to walk (a list), at that depth."},
    {"run", (PyCFunction)Walker_run, METH_O,
     "run(deadline) -> (handed back, done): walk until done or the clock passes deadline."},
    {"clear", (PyCFunction)Walker_clear, METH_NOARGS,
     "clear(): forget and let go of everything the walk holds."},
    {NULL}
};

static PyGetSetDef Walker_getset[] = {
    {"pending", (getter)Walker_get_pending, NULL, "objects still on the stack", NULL},
    {"count", (getter)Walker_get_count, NULL, "objects entered here", NULL},
    {"deep", (getter)Walker_get_deep, NULL, "a structure deeper than max_depth was cut", NULL},
    {NULL}
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jupyter_gpumem.core._reach.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Walker(plain, watch, stop, check_singles, max_depth, clock): see the module.",
    .tp_methods = Walker_methods,
    .tp_getset = Walker_getset,
    .tp_new = Walker_new,
};

#ifndef _WIN32
/* pread_held(fd, size): up to size bytes of fd from its start, the lock held. */
static PyObject *
reach_pread_held(PyObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "in:pread_held", &fd, &size))
        return NULL;
    if (size < 0 || size > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "pread_held reads at most 1 MiB");
        return NULL;
    }
    PyObject *buf = PyBytes_FromStringAndSize(NULL, size);
    if (buf == NULL)
        return NULL;
    ssize_t n;
    do {
        n = pread(fd, PyBytes_AS_STRING(buf), (size_t)size, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        Py_DECREF(buf);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (_PyBytes_Resize(&buf, n) < 0)
        return NULL;
    return buf;
}

/* write_held(fd, data): write data to fd, the lock held; the bytes written. */
static PyObject *
reach_write_held(PyObject *self, PyObject *args)
{
    int fd;
    const char *data;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "iy#:write_held", &fd, &data, &len))
        return NULL;
    ssize_t n;
    do {
        n = write(fd, data, (size_t)len);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromSsize_t(n);
}
#endif

/* -- a dict's entry table, read in place -------------------------------------------------
 * PyDict_Next reads each key's hash from the key object itself, so a pass over a table
 * touches every key: a cache miss apiece once the table is cold (a notebook's namespace
 * after a cell), and a namespace gains IPython's `_iN` names every cell. For the
 * interpreters whose table layout is known (CPython 3.11 to 3.13 with the GIL; the same
 * in all three, Include/internal/pycore_dict.h), a combined table of str keys is read in
 * place instead, its key and value pointers only. The module checks at import that this
 * reading gives what PyDict_Next gives (dict_table_ok); elsewhere PyDict_Next is used. */
#if defined(PY_VERSION_HEX) && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 \
    && !defined(Py_GIL_DISABLED) && !defined(Py_LIMITED_API) && !defined(PYPY_VERSION)
#define DICT_TABLE 1
typedef struct {                /* struct _dictkeysobject */
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind;            /* DICT_KEYS_UNICODE: 1 */
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} table_keys;
typedef struct {                /* PyDictUnicodeEntry */
    PyObject *me_key;
    PyObject *me_value;
} table_entry;

/* The entries of a combined table of str keys, and their count; NULL for any other */
static table_entry *
dict_table(PyObject *dict, Py_ssize_t *count)
{
    PyDictObject *mp = (PyDictObject *)dict;
    table_keys *keys = (table_keys *)mp->ma_keys;
    if (mp->ma_values != NULL || keys == NULL || keys->dk_kind != 1)
        return NULL;
    *count = keys->dk_nentries;
    return (table_entry *)(&keys->dk_indices[(size_t)1 << keys->dk_log2_index_bytes]);
}
#endif
static int dict_table_ok = 0;   /* set by check_dict_table() at import */

/* Whether reading tables in place gives what PyDict_Next gives, on dicts of several
 * sizes with deleted entries (then in place reading is used). */
static int
check_dict_table(void)
{
#ifdef DICT_TABLE
    int ok = 1;
    for (int size = 1; size <= 200 && ok; size = size * 3 + 1) {
        PyObject *d = PyDict_New();
        if (d == NULL)
            return -1;
        for (int i = 0; i < size && ok; i++) {
            PyObject *k = PyUnicode_FromFormat("k%d", i), *v = PyLong_FromLong(i);
            ok = k != NULL && v != NULL && PyDict_SetItem(d, k, v) == 0;
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        for (int i = 0; i < size && ok; i += 3) {
            PyObject *k = PyUnicode_FromFormat("k%d", i);
            ok = k != NULL && PyDict_DelItem(d, k) == 0;
            Py_XDECREF(k);
        }
        if (!ok) {
            Py_DECREF(d);
            return -1;
        }
        Py_ssize_t count = 0, pos = 0, i = 0;
        table_entry *e = dict_table(d, &count);
        PyObject *key, *value;
        ok = e != NULL && count >= PyDict_GET_SIZE(d);
        while (ok && PyDict_Next(d, &pos, &key, &value)) {
            while (i < count && e[i].me_value == NULL)
                i++;
            ok = i < count && e[i].me_key == key && e[i].me_value == value && pos == i + 1;
            i++;
        }
        while (ok && i < count && e[i].me_value == NULL)
            i++;
        ok = ok && i == count;
        Py_DECREF(d);
    }
    dict_table_ok = ok;
#endif
    return 0;
}

/* items_except(dict, types[, memo, judge]): the (key, value) pairs of a dict whose
 * value's exact type is not one of `types` (a frozenset of at most 64 types), in the
 * dict's order. Types are compared by address: no Python code runs while the table is
 * read (a metaclass's __hash__ or __eq__ is never asked, as `type(v) in types` would).
 *
 * With `memo` (a list of two lists, [out, kept], that the caller keeps from call to
 * call) and `judge` (a callable that says of an exact str key whether the caller leaves
 * its name out, whatever its value): out[i] holds the key found at position i of the
 * table when judge left it out, kept[i] the key found there when judge did not. A later
 * call that finds that same key object there in `out` skips the entry without reading
 * its key or its value (with the table read in place, see above): IPython's `_iN`
 * names, one more every cell, then cost no cache miss apiece after every cell; one found
 * in `kept` is not judged again. The memo holds its keys (strings) by strong references,
 * so a key found at its position is the very object judged, and the verdict holds (it
 * depends on the name alone); a table rebuilt, or another dict, only costs the memo its
 * hits. judge is asked after the table is read, for the str keys the memo did not know. */
#define ITEMS_EXCEPT_MAX 64
typedef struct {
    PyObject **taken;       /* key, value (new references) per entry taken */
    Py_ssize_t *where;      /* its position in the table */
    char *flags;            /* LEFT_OUT (by its value's type, or later by judge), TO_JUDGE */
    Py_ssize_t n;
} taking;
#define LEFT_OUT 1
#define TO_JUDGE 2

static inline void
take_entry(taking *t, PyObject *key, PyObject *value, Py_ssize_t at, PyObject *const *skip,
           Py_ssize_t nskip, int judging)
{
    /* judging: 1 where this key is to be judged, 0 where it is known to stay in */
    PyObject *type = (PyObject *)Py_TYPE(value);
    Py_ssize_t i = 0;
    while (i < nskip && skip[i] != type)
        i++;
    if (i < nskip && !(judging && PyUnicode_CheckExact(key)))
        return;                 /* dropped by its type, with no name to judge */
    Py_INCREF(key);
    Py_INCREF(value);
    t->taken[2 * t->n] = key;
    t->taken[2 * t->n + 1] = value;
    t->where[t->n] = at;
    t->flags[t->n] = (i < nskip ? LEFT_OUT : 0) | (judging && PyUnicode_CheckExact(key) ? TO_JUDGE : 0);
    t->n++;
}

/* list[at] = item, the list first grown with None as far as `at` (it lets go of what was
 * there); -1 with an error set */
static int
note_key(PyObject *list, Py_ssize_t at, PyObject *item)
{
    if (item == Py_None && at >= PyList_GET_SIZE(list))
        return 0;
    while (PyList_GET_SIZE(list) <= at)
        if (PyList_Append(list, Py_None) < 0)
            return -1;
    if (PyList_GET_ITEM(list, at) == item)
        return 0;
    Py_INCREF(item);
    return PyList_SetItem(list, at, item);
}

static PyObject *
reach_items_except(PyObject *self, PyObject *args)
{
    PyObject *dict, *types, *memo = Py_None, *judge = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!|OO:items_except", &PyDict_Type, &dict,
                          &PyFrozenSet_Type, &types, &memo, &judge))
        return NULL;
    PyObject *out_memo = NULL, *kept_memo = NULL;
    if (memo != Py_None) {
        if (!PyList_CheckExact(memo) || PyList_GET_SIZE(memo) != 2
                || !PyList_CheckExact(PyList_GET_ITEM(memo, 0))
                || !PyList_CheckExact(PyList_GET_ITEM(memo, 1)) || judge == Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "items_except: memo is a list of two lists, given with judge");
            return NULL;
        }
        out_memo = PyList_GET_ITEM(memo, 0);
        kept_memo = PyList_GET_ITEM(memo, 1);
    }
    PyObject *skip[ITEMS_EXCEPT_MAX];
    Py_ssize_t nskip = 0;
    PyObject *it = PyObject_GetIter(types);
    if (it == NULL)
        return NULL;
    PyObject *t;
    while ((t = PyIter_Next(it)) != NULL) {
        if (nskip == ITEMS_EXCEPT_MAX) {
            Py_DECREF(t);
            Py_DECREF(it);
            PyErr_SetString(PyExc_ValueError, "items_except takes at most 64 types");
            return NULL;
        }
        skip[nskip++] = t;      /* the frozenset keeps it alive */
        Py_DECREF(t);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    /* first the entries to look at, each taken (new references) while the table is
       read: nothing here allocates an object, so no collection can run a finalizer
       that changes the dict; judge is asked and the pairs are made afterwards, from
       what was taken */
    Py_ssize_t size = PyDict_GET_SIZE(dict);
    Py_ssize_t nout = out_memo != NULL ? PyList_GET_SIZE(out_memo) : 0;
    Py_ssize_t nkept = kept_memo != NULL ? PyList_GET_SIZE(kept_memo) : 0;
    PyObject **outs = out_memo != NULL ? ((PyListObject *)out_memo)->ob_item : NULL;
    PyObject **keeps = kept_memo != NULL ? ((PyListObject *)kept_memo)->ob_item : NULL;
    taking tk = {PyMem_Malloc(sizeof(PyObject *) * 2 * (size ? size : 1)),
                 PyMem_Malloc(sizeof(Py_ssize_t) * (size ? size : 1)),
                 PyMem_Malloc(size ? size : 1), 0};
    if (tk.taken == NULL || tk.where == NULL || tk.flags == NULL) {
        PyMem_Free(tk.taken);
        PyMem_Free(tk.where);
        PyMem_Free(tk.flags);
        return PyErr_NoMemory();
    }
    int judging = out_memo != NULL;
    PyObject *key, *value;
#ifdef DICT_TABLE
    Py_ssize_t count = 0;
    table_entry *entries = dict_table_ok ? dict_table(dict, &count) : NULL;
#else
    void *entries = NULL;
#endif
    if (entries != NULL) {
#ifdef DICT_TABLE
        for (Py_ssize_t at = 0; at < count && tk.n < size; at++) {
            key = entries[at].me_key;
            value = entries[at].me_value;
            if (value == NULL)
                continue;       /* a deleted entry */
            if (at < nout && outs[at] == key)
                continue;       /* the same key object the memo judged: left out */
            take_entry(&tk, key, value, at, skip, nskip,
                       judging && !(at < nkept && keeps[at] == key));
        }
#endif
    } else {
        Py_ssize_t pos = 0;
        while (tk.n < size && PyDict_Next(dict, &pos, &key, &value)) {
            Py_ssize_t at = pos - 1;
            if (at < nout && outs[at] == key)
                continue;
            take_entry(&tk, key, value, at, skip, nskip,
                       judging && !(at < nkept && keeps[at] == key));
        }
    }
    /* the memo's lists grow from here on: outs and keeps are read no more */
    int failed = 0;
    for (Py_ssize_t j = 0; j < tk.n; j++) {
        if (!(tk.flags[j] & TO_JUDGE))
            continue;           /* no name, or known to stay in */
        PyObject *k = tk.taken[2 * j];
        Py_ssize_t at = tk.where[j];
        PyObject *verdict = PyObject_CallOneArg(judge, k);
        int out_of_it = verdict == NULL ? -1 : PyObject_IsTrue(verdict);
        Py_XDECREF(verdict);
        if (out_of_it < 0
                || note_key(out_memo, at, out_of_it ? k : Py_None) < 0
                || note_key(kept_memo, at, out_of_it ? Py_None : k) < 0) {
            failed = 1;
            break;
        }
        if (out_of_it)
            tk.flags[j] |= LEFT_OUT;
    }
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < tk.n; j++)
        kept += !(tk.flags[j] & LEFT_OUT);
    PyObject *out = failed ? NULL : PyList_New(kept);
    Py_ssize_t made = 0;
    for (Py_ssize_t j = 0; out != NULL && j < tk.n; j++) {
        if (tk.flags[j] & LEFT_OUT)
            continue;
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(pair, 0, tk.taken[2 * j]);        /* the references move in */
        PyTuple_SET_ITEM(pair, 1, tk.taken[2 * j + 1]);
        tk.taken[2 * j] = tk.taken[2 * j + 1] = NULL;
        PyList_SET_ITEM(out, made++, pair);
    }
    for (Py_ssize_t j = 0; j < tk.n; j++) {     /* what was not moved into a pair */
        Py_XDECREF(tk.taken[2 * j]);
        Py_XDECREF(tk.taken[2 * j + 1]);
    }
    PyMem_Free(tk.taken);
    PyMem_Free(tk.where);
    PyMem_Free(tk.flags);
    return out;
}

/* stamp_holds(getters, t, stamp): whether a backend's record of tensor t still stands.
 * `stamp` is (weak ref to t's storage object, its bytes, its data pointer) as the record
 * took it; `getters` is (storage of a tensor, bytes of a storage, data pointer of a
 * storage), the backend's C methods. It stands where t's storage is that very object
 * and has those bytes at that address: a data pointer alone proves nothing (a larger
 * storage may start where a freed one did). 1, 0 (also where t has no storage of its
 * own: a sparse tensor is read the long way), or -1 with an error set. */
static int
stamp_holds(PyObject *getters, PyObject *t, PyObject *stamp)
{
    if (!PyTuple_Check(getters) || PyTuple_GET_SIZE(getters) != 3 || !PyTuple_Check(stamp) ||
            PyTuple_GET_SIZE(stamp) != 3 || !PyWeakref_Check(PyTuple_GET_ITEM(stamp, 0)))
        return 0;
    PyObject *storage = PyObject_CallOneArg(PyTuple_GET_ITEM(getters, 0), t);
    if (storage == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
        return 0;
    }
    _Pragma("GCC diagnostic push")
    _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
    int same = PyWeakref_GetObject(PyTuple_GET_ITEM(stamp, 0)) == storage;
    _Pragma("GCC diagnostic pop")
    for (Py_ssize_t i = 1; same > 0 && i < 3; i++) {
        PyObject *got = PyObject_CallOneArg(PyTuple_GET_ITEM(getters, i), storage);
        same = got == NULL ? -1 : PyObject_RichCompareBool(got, PyTuple_GET_ITEM(stamp, i), Py_EQ);
        Py_XDECREF(got);
    }
    Py_DECREF(storage);
    return same;
}

/* take_batch(values, memo, known, get_fn, stamp_of, get_held, storages, label, found,
 *            devices, node_type, node_head) -> list | None
 *
 * Many tensors of a backend's plain types at once (an optimizer's state, a model's
 * parameters): the Python walk's C-level passes over them fused into one loop.
 * `values` is a list; `memo` maps id(value) -> (storages, label, held) for the values
 * taken before in this scan. For each value not in `memo`: get_fn(value) is asked
 * first, for all of them (any answer other than None, an autograd graph, returns None
 * before anything is written: the caller takes those the long way); then its storages
 * are `known[id(value)][2]` where the stamp `known[id(value)][1]` holds (stamp_holds,
 * stamp_of: its getters; the backend's own record, kept while the tensor lives), else
 * storages(value); what it holds is get_held(value) (its gradient), recorded under
 * `label`; the entry goes into `memo`. Then each storage `info` (a tuple: key, bytes,
 * device, ...) whose device is in `devices` (None: every device) and whose key is not
 * in `found` yet goes in as found[key] = (info, node, None), node made here as
 * node_type(node_head + (key,)) (a tuple subclass) or None. The first value met with a
 * key stands for it. Returns the held values that are not None, in order.
 *
 * Only a backend's own getters run (no user code): the values are of the exact types
 * the backend named, the keys are tuples of strings and integers. */
static PyObject *
reach_take_batch(PyObject *self, PyObject *args)
{
    PyObject *values, *memo, *known, *get_fn, *stamp_of, *get_held, *storages, *label;
    PyObject *found, *devices, *node_type, *node_head;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOO!OOO:take_batch", &PyList_Type, &values,
                          &PyDict_Type, &memo, &PyDict_Type, &known, &get_fn, &stamp_of,
                          &get_held, &storages, &label, &PyDict_Type, &found, &devices,
                          &node_type, &node_head))
        return NULL;
    if (devices != Py_None && !PyAnySet_Check(devices)) {
        PyErr_SetString(PyExc_TypeError, "take_batch: devices must be a set or None");
        return NULL;
    }
    Py_ssize_t head = 0;
    if (node_type != Py_None) {
        if (!PyType_Check(node_type) ||
                !PyType_IsSubtype((PyTypeObject *)node_type, &PyTuple_Type) ||
                !PyTuple_Check(node_head)) {
            PyErr_SetString(PyExc_TypeError,
                            "take_batch: node_type must be a tuple subclass, node_head a tuple");
            return NULL;
        }
        head = PyTuple_GET_SIZE(node_head);
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    /* each value, its id and its memo entry, held here: the getters may allocate, and
       a collection's finalizer must not take anything from under the loop */
    PyObject **vals = PyMem_Calloc(3 * (size_t)(n ? n : 1), sizeof(PyObject *));
    if (vals == NULL)
        return PyErr_NoMemory();
    PyObject **ids = vals + n, **entries = vals + 2 * n;
    PyObject *result = NULL, *out = NULL;
    Py_ssize_t i;
    for (i = 0; i < n && i < PyList_GET_SIZE(values); i++) {
        vals[i] = Py_NewRef(PyList_GET_ITEM(values, i));
    }
    n = i;
    for (i = 0; i < n; i++) {
        ids[i] = PyLong_FromVoidPtr(vals[i]);
        if (ids[i] == NULL)
            goto done;
        PyObject *entry = PyDict_GetItemWithError(memo, ids[i]);
        if (entry != NULL) {
            entries[i] = Py_NewRef(entry);
            continue;
        }
        if (PyErr_Occurred())
            goto done;
        PyObject *fn = PyObject_CallOneArg(get_fn, vals[i]);
        if (fn == NULL)
            goto done;
        int graph = fn != Py_None;
        Py_DECREF(fn);
        if (graph) {
            result = Py_NewRef(Py_None);   /* nothing written yet */
            goto done;
        }
    }
    for (i = 0; i < n; i++) {
        if (entries[i] != NULL)
            continue;
        PyObject *infos = NULL;
        PyObject *rec = PyDict_GetItemWithError(known, ids[i]);
        if (rec == NULL && PyErr_Occurred())
            goto done;
        if (rec != NULL && PyTuple_Check(rec) && PyTuple_GET_SIZE(rec) >= 3) {
            Py_INCREF(rec);
            int same = stamp_holds(stamp_of, vals[i], PyTuple_GET_ITEM(rec, 1));
            if (same > 0)
                infos = Py_NewRef(PyTuple_GET_ITEM(rec, 2));
            Py_DECREF(rec);
            if (same < 0)
                goto done;
        }
        if (infos == NULL) {
            infos = PyObject_CallOneArg(storages, vals[i]);   /* first met, or moved */
            if (infos == NULL)
                goto done;
        }
        PyObject *held = PyObject_CallOneArg(get_held, vals[i]);
        if (held == NULL) {
            Py_DECREF(infos);
            goto done;
        }
        PyObject *entry = PyTuple_Pack(3, infos, label, held);
        Py_DECREF(infos);
        Py_DECREF(held);
        if (entry == NULL)
            goto done;
        entries[i] = entry;
        if (PyDict_SetItem(memo, ids[i], entry) < 0)
            goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *entry = entries[i];
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 3) {
            PyErr_SetString(PyExc_TypeError, "take_batch: a memo entry is not (storages, label, held)");
            goto fail;
        }
        PyObject *infos = PySequence_Fast(PyTuple_GET_ITEM(entry, 0),
                                          "take_batch: storages must be a sequence");
        if (infos == NULL)
            goto fail;
        Py_ssize_t m = PySequence_Fast_GET_SIZE(infos);
        for (Py_ssize_t j = 0; j < m; j++) {
            PyObject *info = PySequence_Fast_GET_ITEM(infos, j);
            if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) < 3) {
                PyErr_SetString(PyExc_TypeError, "take_batch: a storage is not (key, bytes, device, ...)");
                Py_DECREF(infos);
                goto fail;
            }
            PyObject *key = PyTuple_GET_ITEM(info, 0);
            if (devices != Py_None) {
                int on = PySet_Contains(devices, PyTuple_GET_ITEM(info, 2));
                if (on < 0) {
                    Py_DECREF(infos);
                    goto fail;
                }
                if (!on)
                    continue;
            }
            /* one look-up where the key is new (the common case): the entry is made
               first and set only if the key is not there (the first met stands) */
            PyObject *node;
            if (node_type == Py_None) {
                node = Py_NewRef(Py_None);
            } else {
                node = ((PyTypeObject *)node_type)->tp_alloc((PyTypeObject *)node_type, head + 1);
                if (node == NULL) {
                    Py_DECREF(infos);
                    goto fail;
                }
                for (Py_ssize_t h = 0; h < head; h++)
                    PyTuple_SET_ITEM(node, h, Py_NewRef(PyTuple_GET_ITEM(node_head, h)));
                PyTuple_SET_ITEM(node, head, Py_NewRef(key));
            }
            PyObject *value = PyTuple_Pack(3, info, node, Py_None);
            Py_DECREF(node);
            if (value == NULL || PyDict_SetDefault(found, key, value) == NULL) {
                Py_XDECREF(value);
                Py_DECREF(infos);
                goto fail;
            }
            Py_DECREF(value);
        }
        Py_DECREF(infos);
        PyObject *held = PyTuple_GET_ITEM(entry, 2);
        if (held != Py_None && PyList_Append(out, held) < 0)
            goto fail;
    }
    result = out;
    goto done;
fail:
    Py_CLEAR(out);
done:
    for (i = 0; i < n; i++) {
        Py_XDECREF(vals[i]);
        Py_XDECREF(ids[i]);
        Py_XDECREF(entries[i]);
    }
    PyMem_Free(vals);
    return result;
}

#include "_fingerprint.h"

static PyMethodDef reach_functions[] = {
    {"items_except", reach_items_except, METH_VARARGS,
     "items_except(dict, types[, memo, judge]) -> list: the (key, value) pairs whose value's type is "
     "not in types (and whose name judge does not leave out)"},
    {"take_batch", reach_take_batch, METH_VARARGS,
     "take_batch(values, memo, known, get_fn, stamp_of, get_held, storages, label, found, "
     "devices, node_type, node_head) -> list | None: many plain tensors at once"},
#ifndef _WIN32
    {"pread_held", reach_pread_held, METH_VARARGS,
     "pread_held(fd, size) -> bytes: read from the start of fd without releasing the GIL"},
    {"write_held", reach_write_held, METH_VARARGS,
     "write_held(fd, data) -> int: write to fd without releasing the GIL"},
#endif
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef reach_module = {
    PyModuleDef_HEAD_INIT, "_reach",
    "The reach walk's core at C speed (optional; see jupyter_gpumem.core.scan_reach).", -1,
    reach_functions,
};

PyMODINIT_FUNC
PyInit__reach(void)
{
    if (check_dict_table() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&reach_module);
    if (m == NULL)
        return NULL;
    /* each type under its own name (PyModule_AddType readies it) */
    if (PyModule_AddIntConstant(m, "DICT_TABLE", dict_table_ok) < 0 ||
            PyModule_AddType(m, &WalkerType) < 0
#ifdef HAVE_FINGERPRINT
            || PyModule_AddType(m, &FingerprintType) < 0
            || PyModule_AddType(m, &FpPlanType) < 0
#endif
            ) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
