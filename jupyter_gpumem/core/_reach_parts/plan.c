/* plan.c: plans, what one fingerprint read kept as checks: recorded while a root is
 * hashed, checked at the next scan (part of _reach.c; invariants in plan.h). Start at
 * plan_holds. */


/* ==== recording ================================================================== */

/* a check of o appended to the plan being recorded (NULL: none recorded, or it broke) */
static plan_step *
plan_record(fp_run *r, int kind, PyObject *o, int proven, int visited)
{
    FingerprintPlan *p = r->plan;
    if (p == NULL || p->broken)
        return NULL;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        if (cap > PLAN_MAX_STEPS) {
            p->broken = 1;
            return NULL;
        }
        plan_step *steps = PyMem_Realloc(p->steps, cap * sizeof(plan_step));
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
    plan_step *st = &p->steps[p->n++];
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
plan_record_word(fp_run *r, plan_step *st, uintptr_t w)
{
    FingerprintPlan *p = r->plan;
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
plan_trim(FingerprintPlan *p)
{
    if (p->cap > p->n) {
        plan_step *steps = PyMem_Realloc(p->steps, (p->n ? p->n : 1) * sizeof(plan_step));
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

/* words of the last check's: the addresses of `items` */
static void
plan_record_words(fp_run *r, plan_step *st, PyObject *const *items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        plan_record_word(r, st, (uintptr_t)items[i]);
}
/* the check of a child hashed where it is met (see fp_inline): an empty table's
 * version or length, a short list's (or an unproven tuple's) length and item types */
static void
plan_record_inline(fp_run *r, PyObject *o, PyTypeObject *tp, int proven)
{
    if (tp == &PyDict_Type || tp == &PyODict_Type) {
        plan_step *st = plan_record(r, PL_DICT, o, proven, 0);
        if (st != NULL)
            st->a = fp_version(o);
    } else if (tp == &PySet_Type || tp == &PyFrozenSet_Type) {
        if (!(proven && tp == &PyFrozenSet_Type))
            plan_record(r, PL_EMPTY_SET, o, proven, 0);
    } else if (!(proven && tp == &PyTuple_Type)) {   /* a proven tuple: as it was */
        plan_step *st = plan_record(r, PL_ATOMS, o, proven, 0);
        Py_ssize_t n = Py_SIZE(o);
        PyObject *const *items = tp == &PyList_Type ? ((PyListObject *)o)->ob_item :
            ((PyTupleObject *)o)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++)
            plan_record_word(r, st, (uintptr_t)Py_TYPE(items[i]));
    }
}

/* ==== checking ===================================================================== */

/* Whether a list made of o's C iteration (an OrderedDict's order, a set's or a deque's
 * items) is the `n` addresses at w: 1, 0, -1 with an error set. */
static int
plan_iteration_same(PyObject *o, const uintptr_t *w, size_t n)
{
    PyObject *items = PySequence_List(o);
    if (items == NULL)
        return -1;
    int same = (size_t)PyList_GET_SIZE(items) == n && (n == 0 ||
        memcmp(((PyListObject *)items)->ob_item, w, n * sizeof(uintptr_t)) == 0);
    Py_DECREF(items);
    return same;
}

/* Whether what o's tp_traverse visits (its dict made first) is the `n` addresses at w:
 * 1, 0, -1 with an error set. */
static int
plan_referents_same(PyObject *o, const uintptr_t *w, size_t n)
{
    if (fp_own_dict(o) < 0)
        return -1;
    fp_found got;
    int rc = fp_collect_referents(o, &got);
    int same = rc == 0 && (size_t)got.n == n &&
        (n == 0 || memcmp(got.items, w, n * sizeof(uintptr_t)) == 0);
    if (got.items != got.small)
        PyMem_Free(got.items);
    if (rc < 0)
        return -1;
    return same;
}

/* Whether function o has the code and module name s recorded and (unless a library's)
 * the same parts: 1, 0, -1 with an error set. */
static int
plan_function_same(const plan_step *s, PyObject *o, const uintptr_t *w)
{
    if ((uintptr_t)PyFunction_GetCode(o) != s->a)
        return 0;
    Py_hash_t name = fp_name_hash(PyFunction_GetModule(o));
    if (name == -1)
        return -1;
    if ((uint64_t)name != s->b)
        return 0;
    if (s->kind == PL_LIBFUNC)
        return 1;
    PyObject *parts[4];
    if (fp_function_parts(o, parts) < 0)
        return -1;
    Py_DECREF(parts[3]);   /* (the function holds it) */
    for (int j = 0; j < 4; j++)
        if ((uintptr_t)parts[j] != w[j])
            return 0;
    return 1;
}

/* Whether one check of o, by its kind, holds (its type and stop-set membership are
 * checked by the caller): 1, 0, -1 with an error set. */
static inline int
plan_step_holds(Fingerprint *f, const plan_step *s, PyObject *o, const uintptr_t *w)
{
    switch (s->kind) {
    case PL_ATOM:
    case PL_STOP:
    case PL_STATIC:
        return 1;
    case PL_DICT:
        return fp_version(o) == s->a;
    case PL_ODICT:
        if (fp_version(o) != s->a)
            return 0;
        return s->n == 0 ? 1 : plan_iteration_same(o, w, s->n);
    case PL_DDICT: {
        if (fp_version(o) != s->a)
            return 0;
        PyObject *factory = fp_factory(o);
        if (factory == NULL && PyErr_Occurred())
            return -1;
        Py_XDECREF(factory);   /* (the defaultdict holds it) */
        return (uintptr_t)factory == s->b;
    }
    case PL_SEQ: {
        PyObject *const *items = PyList_CheckExact(o) ? ((PyListObject *)o)->ob_item :
            ((PyTupleObject *)o)->ob_item;
        return (size_t)Py_SIZE(o) == s->n &&
            (s->n == 0 || memcmp(items, w, s->n * sizeof(uintptr_t)) == 0);
    }
    case PL_ITER:
        return plan_iteration_same(o, w, s->n);
    case PL_EMPTY_SET:
        return PySet_GET_SIZE(o) == 0;
    case PL_ATOMS: {
        PyObject *const *items = PyList_CheckExact(o) ? ((PyListObject *)o)->ob_item :
            ((PyTupleObject *)o)->ob_item;
        if ((size_t)Py_SIZE(o) != s->n)
            return 0;
        for (size_t j = 0; j < s->n; j++)
            if ((uintptr_t)Py_TYPE(items[j]) != w[j])
                return 0;
        return 1;
    }
    case PL_TENSOR: {
        PyObject *infos, *held;
        int got = fp_tensor_read(f, o, &infos, &held, 1);
        if (got <= 0)
            return got;
        Py_DECREF(held);   /* (the tensor holds it: the next checks read it) */
        return (uintptr_t)infos == s->a && (uintptr_t)held == s->b;
    }
    case PL_REFS:
        return plan_referents_same(o, w, s->n);
    case PL_FUNC:
    case PL_LIBFUNC:
        return plan_function_same(s, o, w);
    case PL_CELL:
        return (uintptr_t)PyCell_GET(o) == s->a;
    case PL_TYPE: {
        PyObject *d = ((PyTypeObject *)o)->tp_dict;
        return d != NULL && fp_version(d) == s->a;
    }
    case PL_MODULE: {
        PyObject *d = PyModule_GetDict(o);
        return d != NULL && fp_version(d) == s->a;
    }
    }
    return 0;
}

/* Whether what plan p checks still holds of root (see plan.h): 1, 0, -1 with an
 * error. Its first check is of the root it was recorded from: another root (a name bound
 * to another object since) fails there, before any address of the plan is read. */
static int
plan_holds(Fingerprint *f, FingerprintPlan *p, PyObject *root)
{
    if (p->broken || p->n == 0 || p->steps[0].obj != root)
        return 0;
    /* the heap types its checks compare are the ones it met: none gone (so none's
       address is another's since) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(p->types); i++)
        if (fp_referent(PyList_GET_ITEM(p->types, i)) == Py_None)
            return 0;
    const plan_step *steps = p->steps;
    for (size_t i = 0; i < p->n; i++) {
        const plan_step *s = &steps[i];
        if (i + 8 < p->n) {
            __builtin_prefetch(steps[i + 8].obj);   /* its header, asked for ahead */
            if (steps[i + 8].kind == PL_TENSOR && f->records.cap)   /* and its record */
                __builtin_prefetch(&f->records.slots[tab_hash(steps[i + 8].obj,
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
        int holds = plan_step_holds(f, s, o, p->aux + s->aux);
        if (holds <= 0)
            return holds;
    }
    return 1;
}

/* ==== the FingerprintPlan type ======================================================= */

/* The plan freed. */
static void
plan_dealloc(FingerprintPlan *p)
{
    pset_free(&p->typeset);
    PyMem_Free(p->steps);
    PyMem_Free(p->aux);
    Py_XDECREF(p->types);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* len(plan): its number of checks. */
static Py_ssize_t
plan_py_len(FingerprintPlan *p)
{
    return (Py_ssize_t)p->n;
}

static PySequenceMethods plan_sequence = {.sq_length = (lenfunc)plan_py_len};

static PyTypeObject FingerprintPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jupyter_gpumem.core._reach.FingerprintPlan",
    .tp_basicsize = sizeof(FingerprintPlan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_as_sequence = &plan_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What one fingerprint read, as checks (Fingerprint.of(..., plan=1), "
              "Fingerprint.check): see core/_reach_parts/plan.h. len() is its number of checks.",
};
