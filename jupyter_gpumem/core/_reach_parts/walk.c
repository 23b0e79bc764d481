/* walk.c: the Walker (part of _reach.c; its type and invariants are in walk.h).
 *
 * A Walker takes objects of the "plain" types (exact dicts, lists, tuples, sets and the
 * other types the scan reads through the collector: what gc.get_referents reads) and
 * walks everything they hold, depth first, without running any user code: exact lists,
 * tuples and dicts are read item by item (so a walk can stop and go on inside one), every
 * other plain object through its type's tp_traverse, as gc.get_referents does. What is
 * not plain (tensors, modules, classes, functions, frames, numpy arrays, types not
 * learned yet) is handed back to Python, once. Start at walk_py_run. */

/* ==== the stack, and what enters it ============================================== */

/* o stacked at `depth` (a strong reference taken) and counted; -1 out of memory. */
static inline __attribute__((always_inline)) int
walk_push(Walker *w, PyObject *o, int depth)
{
    if (w->top == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        walk_frame *stack = PyMem_Realloc(w->stack, cap * sizeof(walk_frame));
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
   type's tp_traverse (see core/scan/types.py keyable_meta, the same rule in Python). */
static inline int
walk_keyable_class(PyTypeObject *tp)
{
    PyTypeObject *meta = Py_TYPE(tp);
    return meta == &PyType_Type || (meta->tp_hash == PyType_Type.tp_hash
                                    && meta->tp_richcompare == PyType_Type.tp_richcompare);
}

/* One object met inside a plain one, at ``depth``: entered, handed back, or left. */
static inline __attribute__((always_inline)) int
walk_consider(Walker *w, PyObject *o, int depth)
{
    PyTypeObject *tp = Py_TYPE(o);
    if (!(PyObject_IS_GC(o) && PyObject_GC_IsTracked(o))) {
        /* atoms, and dicts and tuples of atoms only, hold nothing; a few untracked
           types still matter (numpy arrays, some frameworks' tensors) */
        if (w->watch.n == 0 || !pset_has(&w->watch, tp))
            return 0;
    }
    int plain = pset_has(&w->plain, tp) || !walk_keyable_class(tp);
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
        return walk_push(w, o, depth);
    if (!pset_has(&w->known, tp))
        w->paused = 1;   /* Python classifies its type before the walk goes on */
    return PyList_Append(w->out, o);   /* Python decides (a stopped one too) */
}

/* tp_traverse's callback: each referent considered one level below its parent. */
static int
walk_visit(PyObject *o, void *arg)
{
    Walker *w = (Walker *)arg;
    if (walk_consider(w, o, w->depth + 1) < 0) {
        w->failed = 1;
        return 1;   /* stops the traversal */
    }
    return 0;
}

/* The stack, the remembered objects and the counts let go (the type sets are kept). */
static void
walk_clear_state(Walker *w)
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

/* The Walker freed, with everything it holds. */
static void
walk_dealloc(Walker *w)
{
    walk_clear_state(w);
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

/* ==== the Walker type ============================================================ */

/* Walker(plain, watch, stop, check_singles, max_depth, clock): a walk with nothing stacked. */
static PyObject *
walk_py_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
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
    if (w->held == NULL || w->out == NULL || pset_fill(&w->plain, plain, 0) < 0
        || pset_fill(&w->known, plain, 0) < 0 || pset_fill(&w->watch, watch, 0) < 0
        || pset_fill(&w->stop, stop, 1) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

/* learn(tp, plain, watch): Python's verdict on a type. */
PyDoc_STRVAR(walk_learn_doc,
    "learn(tp, plain, watch): tp is classified; walked here if plain; looked at "
    "untracked if watch (types are held by the caller).");

static PyObject *
walk_py_learn(Walker *w, PyObject *args)
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
PyDoc_STRVAR(walk_push_doc,
    "push(objs, depth): plain objects to walk (a list), at that depth.");

static PyObject *
walk_py_push(Walker *w, PyObject *args)
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
        if (walk_push(w, o, depth) < 0)
            return NULL;
    }
    w->count -= PyList_GET_SIZE(objs);   /* counted by Python already */
    Py_RETURN_NONE;
}


/* ==== a run ====================================================================== */

/* run(deadline): walk until the stack is empty (returns (handed back, True)), the
   clock passes ``deadline`` or an object of a type not classified yet is met
   (returns (handed back, False): classify the types handed back, then run again). */
PyDoc_STRVAR(walk_run_doc,
    "run(deadline) -> (handed back, done): walk until done or the clock passes deadline.");

static PyObject *
walk_py_run(Walker *w, PyObject *arg)
{
    double deadline = PyFloat_AsDouble(arg);
    if (deadline == -1.0 && PyErr_Occurred())
        return NULL;
    unsigned steps = 0;
    int done = 1;
    w->failed = 0;
    w->paused = 0;
    while (w->top && !w->paused) {
        if (++steps % WALK_CHECK_EVERY == 0) {
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
        walk_frame *f = &w->stack[w->top - 1];
        PyObject *o = f->obj;
        int depth = f->depth + 1;
        if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
            /* the length read again each step: a list can change between two runs */
            if (f->pos < PySequence_Fast_GET_SIZE(o)) {
                /* borrowed: nothing walk_consider() does runs code that could drop it (no
                   object the collector tracks is made), and a reference of ours would
                   hide that only the list holds it */
                PyObject *item = PySequence_Fast_GET_ITEM(o, f->pos);
                f->pos++;
                if (walk_consider(w, item, depth) < 0)
                    return NULL;
                continue;
            }
        }
        else if (PyDict_CheckExact(o)) {
            PyObject *k, *v;
            if (PyDict_Next(o, &f->pos, &k, &v)) {   /* borrowed, as above */
                if (walk_consider(w, k, depth) < 0 || walk_consider(w, v, depth) < 0)
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
                traverse(o, walk_visit, w);
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

/* pick(objs, batched, most, atoms): the many small roots' pre-pass in one read of each. */
PyDoc_STRVAR(walk_pick_doc,
    "pick(objs, batched, most, atoms[, push]) -> (marks, unknown, pending): for a list of\n"
    "roots, a bytearray of one mark each: 1 for a root to walk together (a type in batched,\n"
    "a set of types; not in the stop set; a dict, list, tuple, set or frozenset of at most\n"
    "most items; tracked by the collector), 2 for an untracked dict or tuple where atoms is\n"
    "true (it holds atoms only), 3 for a root of a type Python has not classified yet, 0\n"
    "for the others; the types not classified yet, and the places of their roots (classify\n"
    "the types and ask again of these alone). A class whose metaclass hashes is never\n"
    "picked. With push true (the walk holding nothing), what is picked is also pushed at\n"
    "depth 0, as push() would, while it is read. (Marks, not lists of places: a long\n"
    "notebook's names are tens of thousands, and a number made for each, then read and\n"
    "freed, outgrew the caches.)");

static int
walk_append_index(PyObject *list, Py_ssize_t i)
{
    PyObject *at = PyLong_FromSsize_t(i);
    if (at == NULL)
        return -1;
    int rc = PyList_Append(list, at);
    Py_DECREF(at);
    return rc;
}

static Py_ssize_t
walk_sized(PyObject *o, PyTypeObject *tp)
{
    if (tp == &PyDict_Type)
        return PyDict_GET_SIZE(o);
    if (tp == &PyList_Type)
        return PyList_GET_SIZE(o);
    if (tp == &PyTuple_Type)
        return PyTuple_GET_SIZE(o);
    if (tp == &PySet_Type || tp == &PyFrozenSet_Type)
        return PySet_GET_SIZE(o);
    return -1;
}

static PyObject *
walk_py_pick(Walker *w, PyObject *args)
{
    PyObject *objs, *batched_types;
    Py_ssize_t most;
    int atoms, push = 0;
    if (!PyArg_ParseTuple(args, "O!Onp|p", &PyList_Type, &objs, &batched_types, &most, &atoms,
                          &push))
        return NULL;
    if (push && (w->top || w->seen.n)) {
        PyErr_SetString(PyExc_ValueError, "pick(push=True) starts a walk: clear() first");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(objs);
    pset batched = {0}, unknown = {0};
    PyObject *marks = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *fresh = PyList_New(0), *pending = PyList_New(0);
    if (marks == NULL || fresh == NULL || pending == NULL
            || pset_fill(&batched, batched_types, 0) < 0)
        goto fail;
    char *mark = PyByteArray_AS_STRING(marks);
    memset(mark, WALK_NOT_PICKED, (size_t)n);
    /* (nothing below runs Python code, so the list keeps its n items: a type's set
       look-up compares addresses only, and what is appended or added is no object the
       collector tracks) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(objs, i);
        if (i + WALK_AHEAD < n) {
            /* a root read (its type, size and collector flags: the flags sit just
               before it) and pushed a few places on: the fetches overlap */
            PyObject *ahead = PyList_GET_ITEM(objs, i + WALK_AHEAD);
            __builtin_prefetch(ahead, 1);
            __builtin_prefetch((char *)ahead - 2 * sizeof(void *));   /* (PyGC_Head) */
        }
        PyTypeObject *tp = Py_TYPE(o);
        if (!walk_keyable_class(tp))
            continue;   /* walked alone */
        if (!pset_has(&w->known, tp)) {
            int added = pset_add(&unknown, tp);
            if (added < 0 || (added == 1 && PyList_Append(fresh, (PyObject *)tp) < 0)
                    || walk_append_index(pending, i) < 0)
                goto fail;
            mark[i] = WALK_UNKNOWN;
            continue;
        }
        if (!pset_has(&batched, tp) || (w->stop.n && pset_has(&w->stop, o)))
            continue;
        Py_ssize_t size = walk_sized(o, tp);
        if (size > most)
            continue;   /* a big root: walked on its own */
        if (!PyObject_GC_IsTracked(o)) {
            if (atoms && (tp == &PyDict_Type || tp == &PyTuple_Type))
                mark[i] = WALK_ATOMS;
            continue;
        }
        mark[i] = WALK_PICKED;
        if (push) {   /* as walk_py_push does */
            if (Py_REFCNT(o) > 2) {
                int added = pset_add(&w->seen, o);
                if (added < 0 || (added == 1 && PyList_Append(w->held, o) < 0))
                    goto fail;
            }
            if (walk_push(w, o, 0) < 0)
                goto fail;
            w->count--;   /* counted by Python already */
        }
    }
    pset_free(&batched);
    pset_free(&unknown);
    return Py_BuildValue("(NNN)", marks, fresh, pending);
fail:
    pset_free(&batched);
    pset_free(&unknown);
    if (push)
        walk_clear_state(w);
    Py_XDECREF(marks);
    Py_XDECREF(fresh);
    Py_XDECREF(pending);
    return NULL;
}

/* ==== the rest of the type ======================================================= */

/* clear(): see walk_clear_state; what the run had to hand back is dropped too. */
PyDoc_STRVAR(walk_clear_doc,
    "clear(): forget and let go of everything the walk holds.");

static PyObject *
walk_py_clear(Walker *w, PyObject *Py_UNUSED(ignored))
{
    walk_clear_state(w);
    (void)PyList_SetSlice(w->out, 0, PyList_GET_SIZE(w->out), NULL);
    Py_RETURN_NONE;
}

/* pending: the objects still on the stack */
static PyObject *
walk_py_pending(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(w->top);
}

/* count: the objects entered here */
static PyObject *
walk_py_count(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(w->count);
}

/* deep: whether a structure deeper than max_depth was cut */
static PyObject *
walk_py_deep(Walker *w, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(w->deep);
}

static PyMethodDef walk_methods[] = {
    {"learn", (PyCFunction)walk_py_learn, METH_VARARGS, walk_learn_doc},
    {"push", (PyCFunction)walk_py_push, METH_VARARGS, walk_push_doc},
    {"run", (PyCFunction)walk_py_run, METH_O, walk_run_doc},
    {"clear", (PyCFunction)walk_py_clear, METH_NOARGS, walk_clear_doc},
    {"pick", (PyCFunction)walk_py_pick, METH_VARARGS, walk_pick_doc},
    {NULL}
};

static PyGetSetDef walk_getset[] = {
    {"pending", (getter)walk_py_pending, NULL, "objects still on the stack", NULL},
    {"count", (getter)walk_py_count, NULL, "objects entered here", NULL},
    {"deep", (getter)walk_py_deep, NULL, "a structure deeper than max_depth was cut", NULL},
    {NULL}
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jupyter_gpumem.core._reach.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_dealloc = (destructor)walk_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Walker(plain, watch, stop, check_singles, max_depth, clock): see the module.",
    .tp_methods = walk_methods,
    .tp_getset = walk_getset,
    .tp_new = walk_py_new,
};
