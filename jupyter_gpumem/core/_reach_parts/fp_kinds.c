/* fp_kinds.c: what the fingerprint reads of each kind of object, and fp_visit, which
 * reads one object off the run's stack (part of _reach.c; fingerprint.h). Start at
 * fp_visit, at the bottom. */

/* ==== libraries, functions and classes ============================================== */
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

/* a function: its code and module name, then (unless a library's) its parts */
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
    plan_step *st = plan_record(r, lib ? PL_LIBFUNC : PL_FUNC, fn, r->cur_proven, 1);
    if (st != NULL) {
        st->a = (uintptr_t)code;
        st->b = (uint64_t)name;
    }
    if (lib != 0)
        return lib;   /* a library's function: nothing of the user's inside */
    PyObject *parts[4];
    if (fp_function_parts(fn, parts) < 0)
        return -1;
    plan_record_words(r, st, parts, 4);
    r->child_proven = 0;
    int rc = fp_push_all(r, parts, 4);
    Py_DECREF(parts[3]);
    return rc;
}

/* a class: its dict's version and module name, then (unless a library's or a static
 * type) the entries it holds (skip_keys left out) */
static int
fp_type(Fingerprint *f, fp_run *r, PyTypeObject *tp)
{
    if (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE) || tp->tp_dict == NULL) {
        plan_record(r, PL_STATIC, (PyObject *)tp, r->cur_proven, 1);
        return 0;   /* a static type: nothing of the user's */
    }
    PyObject *d = tp->tp_dict;
    fp_mix(r, fp_version(d));
    plan_step *st = plan_record(r, PL_TYPE, (PyObject *)tp, r->cur_proven, 1);
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

/* ==== what a few kinds need read first ============================================= */

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

/* ==== one object, by its kind ======================================================= */

/* an exact dict: its version (which says its keys and values: proven), then its entries */
static int
fp_exact_dict(fp_run *r, PyObject *o, int proven)
{
    plan_step *st = plan_record(r, PL_DICT, o, proven, 1);
    if (st != NULL)
        st->a = fp_version(o);
    r->child_proven = 1;   /* the version says which keys and values */
    return fp_dict(r, o);
}

/* an OrderedDict: its version, its order, then its entries */
static int
fp_odict(fp_run *r, PyObject *o, int proven)
{
    plan_step *st = plan_record(r, PL_ODICT, o, proven, 1);
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
        plan_record_words(r, st, ((PyListObject *)order)->ob_item, PyList_GET_SIZE(order));
        Py_DECREF(order);
    }
    r->child_proven = 1;
    return fp_dict(r, o);
}

/* an exact defaultdict: its version, then its factory, keys and values */
static int
fp_ddict(fp_run *r, PyObject *o, int proven)
{
    PyObject *factory = fp_factory(o);
    if (factory == NULL && PyErr_Occurred())
        return -1;
    plan_step *st = plan_record(r, PL_DDICT, o, proven, 1);
    if (st != NULL) {
        st->a = fp_version(o);
        st->b = (uintptr_t)factory;
    }
    Py_XDECREF(factory);
    fp_mix(r, fp_version(o));
    return fp_referents(r, o, -1);   /* its factory, then its keys and values */
}

/* an exact list (its items by address: one can be another's since) or tuple (a proven
 * tuple holds what it held) */
static int
fp_seq(fp_run *r, PyObject *o, int proven)
{
    if (PyList_CheckExact(o)) {
        plan_record_words(r, plan_record(r, PL_SEQ, o, proven, 1),
                          ((PyListObject *)o)->ob_item, PyList_GET_SIZE(o));
        return fp_push_list(r, o);   /* (an item's address can be another's since) */
    }
    if (!proven)
        plan_record_words(r, plan_record(r, PL_SEQ, o, 0, 1), ((PyTupleObject *)o)->ob_item,
                          PyTuple_GET_SIZE(o));
    r->child_proven = proven;   /* a proven tuple holds what it held */
    return fp_push_all(r, ((PyTupleObject *)o)->ob_item, PyTuple_GET_SIZE(o));
}

/* an exact set or deque: its items in the order its C iteration gives */
static int
fp_iterable(fp_run *r, PyObject *o, int proven)
{
    PyObject *items = PySequence_List(o);   /* exact sets, deques: their C iteration */
    if (items == NULL)
        return -1;
    int frozen = proven && Py_TYPE(o) == &PyFrozenSet_Type;
    if (!frozen)
        plan_record_words(r, plan_record(r, PL_ITER, o, proven, 1),
                          ((PyListObject *)items)->ob_item, PyList_GET_SIZE(items));
    r->child_proven = frozen;
    int rc = fp_push_list(r, items);
    Py_DECREF(items);
    return rc;
}

/* a module: its dict's version and its name; a module of the user's is doubted */
static int
fp_module(Fingerprint *f, fp_run *r, PyObject *o, int proven)
{
    PyObject *d = PyModule_GetDict(o);   /* borrowed */
    if (d == NULL)
        return -1;
    fp_mix(r, fp_version(d));
    plan_step *st = plan_record(r, PL_MODULE, o, proven, 1);
    if (st != NULL)
        st->a = fp_version(d);
    int lib = fp_library(f, r, PyDict_GetItemString(d, "__name__"));
    if (lib == 0)
        r->doubt = 1;   /* a module of the user's: walked each time */
    return lib < 0 ? -1 : 0;
}

/* a cell: what it holds (None where empty) */
static int
fp_cell(fp_run *r, PyObject *o, int proven)
{
    PyObject *got = PyCell_GET(o);
    plan_step *st = plan_record(r, PL_CELL, o, proven, 1);
    if (st != NULL)
        st->a = (uintptr_t)got;
    return fp_push(r, got != NULL ? got : Py_None);
}

/* What o holds read by its action (o entered: not an atom, not stopped, first met). */
static int
fp_read(Fingerprint *f, fp_run *r, PyObject *o, int action, int proven)
{
    r->child_proven = 0;
    switch (action) {
    case FP_DICT:
        return fp_exact_dict(r, o, proven);
    case FP_ODICT:
        return fp_odict(r, o, proven);
    case FP_DDICT:
        return fp_ddict(r, o, proven);
    case FP_SEQ:
        return fp_seq(r, o, proven);
    case FP_SET:
    case FP_ITER:
        return fp_iterable(r, o, proven);
    case FP_TENSOR:
        return fp_tensor(f, r, o);
    case FP_REFERENTS:
        if (fp_own_dict(o) < 0)
            return -1;
        return fp_referents(r, o, PL_REFS);
    case FP_FUNCTION:
        return fp_function(f, r, o);
    case FP_MODULE:
        return fp_module(f, r, o, proven);
    case FP_CELL:
        return fp_cell(r, o, proven);
    case FP_TYPE:
        return fp_type(f, r, (PyTypeObject *)o);
    }
    r->doubt = 1;
    return 0;
}

/* One object off the run's stack hashed: its action and type, then (unless an atom,
 * doubted, stopped, met before or over the limit) what it holds; -1 with an error set. */
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
            plan_record(r, PL_ATOM, o, 0, 0);
        return 0;   /* its value is never part of what a walk reads */
    }
    if (action == FP_DOUBT) {
        r->doubt = 1;
        return 0;
    }
    fp_mix_ptr(r, o);
    if (pset_has(&f->stop, o)) {
        if (!proven)
            plan_record(r, PL_STOP, o, 0, 1);
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
    return fp_read(f, r, o, action, proven);
}
