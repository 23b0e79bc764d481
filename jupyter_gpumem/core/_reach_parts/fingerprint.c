/* fingerprint.c: the Fingerprint type, what Python calls (part of _reach.c; its
 * invariants are in fingerprint.h). The Fingerprint is kept from scan to scan (begin()
 * starts one, forget() ends it), with the backend's record of each plain tensor it
 * proved (fp_tensor.c). Start at fp_py_of. */

/* ==== hashing a root, checking a plan ================================================ */

/* Whether f was initialised (a Fingerprint made without its __init__ has no judge nor
 * getters); 0 with TypeError set. */
static int
fp_ready(Fingerprint *f)
{
    if (f->judge != NULL && f->fn.obj != NULL)
        return 1;
    PyErr_SetString(PyExc_TypeError, "Fingerprint: not initialised");
    return 0;
}

/* Fingerprint.of(obj, keep=None, plan=0) -> (h1, h2, objects[, plan]) | None; plan 1:
 * with its plan (None where it could not be kept), 2: a plan or nothing (None as soon
 * as the plan would not be kept: a hash without it is of no use to the caller) */
PyDoc_STRVAR(fp_of_doc,
    "of(obj, keep=None, plan=0) -> (h1, h2, objects[, plan]) | None: what obj holds, "
    "hashed (None: it cannot be proved, walk it); keep (a list) gets the records hashed by "
    "address; plan 1: with what was read as checks (None where it could not be kept), 2: "
    "None as soon as the plan could not be kept");

static PyObject *
fp_py_of(Fingerprint *f, PyObject *args)
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
        r.plan = PyObject_New(FingerprintPlan, &FingerprintPlanType);
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

/* Fingerprint.check(plan, obj) -> bool */
PyDoc_STRVAR(fp_check_doc,
    "check(plan, obj) -> bool: whether what the plan checks holds still of obj, the root "
    "it was taken of (True: of(obj) would give the fingerprint taken with it)");

static PyObject *
fp_py_check(Fingerprint *f, PyObject *args)
{
    PyObject *plan, *obj;
    if (!fp_ready(f) || !PyArg_ParseTuple(args, "O!O:check", &FingerprintPlanType, &plan, &obj))
        return NULL;
    int got = plan_holds(f, (FingerprintPlan *)plan, obj);
    if (got < 0)
        return NULL;
    return PyBool_FromLong(got);
}

/* ==== the Fingerprint's life: made, scans begun and ended ============================ */

/* What this scan read is let go: the tensors and gradients (read again if asked), the
 * walk's record, and the types judged (none is held while no scan runs: a class of the
 * user's can hold what a purge frees, and the fingerprint is kept from scan to scan). */
static void
fp_forget(Fingerprint *f)
{
    fp_tensors_clear(&f->tensors);
    Py_CLEAR(f->taken);
    fp_types_clear(f);
}

/* Fingerprint(judge, libs, is_lib, stop_ids, known, get_fn, get_ptr, get_held,
 * skip_keys, limit): made (again), nothing of an earlier making kept. get_fn is a
 * tensor's graph getter, or a pair (graph getter, base getter): a tensor with either is
 * walked each time (fp_tensor_read). */
static int
fp_py_init(Fingerprint *f, PyObject *args, PyObject *kwds)
{
    PyObject *judge, *libs, *is_lib, *stop, *known, *get_fn, *get_ptr, *get_held, *skip_keys;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OO!OOO!OOOO!n:Fingerprint", &judge, &PyDict_Type, &libs,
                          &is_lib, &stop, &PyDict_Type, &known, &get_fn, &get_ptr, &get_held,
                          &PyFrozenSet_Type, &skip_keys, &limit))
        return -1;
    /* (made again: nothing of its last making stays) */
    pset_free(&f->stop);
    fp_forget(f);
    fp_records_clear(&f->records);
    if (pset_fill(&f->stop, stop, 1) < 0)
        return -1;
    Py_XSETREF(f->judge, Py_NewRef(judge));
    Py_XSETREF(f->libs, Py_NewRef(libs));
    Py_XSETREF(f->is_lib, Py_NewRef(is_lib));
    Py_XSETREF(f->known, Py_NewRef(known));
    PyObject *get_base = NULL;
    if (PyTuple_Check(get_fn)) {
        if (PyTuple_GET_SIZE(get_fn) != 2) {
            PyErr_SetString(PyExc_TypeError, "Fingerprint: get_fn: a getter or a pair");
            return -1;
        }
        get_base = PyTuple_GET_ITEM(get_fn, 1);
        get_fn = PyTuple_GET_ITEM(get_fn, 0);
    }
    PyObject *getters[4] = {get_fn, get_base, get_ptr, get_held};
    fp_getter *slots[4] = {&f->fn, &f->base, &f->ptr, &f->held};
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(slots[i]->obj);
        slots[i]->obj = NULL;
        if (getters[i] != NULL)
            fp_getter_set(slots[i], Py_NewRef(getters[i]));
    }
    Py_XSETREF(f->skip_keys, Py_NewRef(skip_keys));
    f->limit = limit;
    return 0;
}

/* The Fingerprint freed, with everything it holds. */
static void
fp_dealloc(Fingerprint *f)
{
    Py_CLEAR(f->judge);
    Py_CLEAR(f->libs);
    Py_CLEAR(f->is_lib);
    Py_CLEAR(f->known);
    Py_CLEAR(f->fn.obj);
    Py_CLEAR(f->base.obj);
    Py_CLEAR(f->ptr.obj);
    Py_CLEAR(f->held.obj);
    fp_forget(f);
    fp_records_clear(&f->records);
    Py_CLEAR(f->skip_keys);
    pset_free(&f->stop);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* forget(): see fp_forget. */
PyDoc_STRVAR(fp_forget_doc,
    "forget(): the tensors and types read so far are read again, and what the walk took "
    "is not used (other code ran meanwhile, or the scan is over)");

static PyObject *
fp_py_forget(Fingerprint *f, PyObject *unused)
{
    fp_forget(f);
    Py_RETURN_NONE;
}

/* A new scan: as after forget(); the records of tensors are kept, those of tensors gone
 * dropped once they outnumber the rest. */
PyDoc_STRVAR(fp_begin_doc,
    "begin(): a new scan, as after forget() (the backend's records of tensors are kept)");

static PyObject *
fp_py_begin(Fingerprint *f, PyObject *unused)
{
    fp_forget(f);
    if (f->records.n > 2 * f->records.live + 1024 && fp_records_sweep(&f->records, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* use_taken(dict | None): what this scan's walk took, read instead of each tensor (the
 * tensors read so far are let go: their entries can borrow from the last record). */
PyDoc_STRVAR(fp_use_taken_doc,
    "use_taken(dict | None): id -> (storages, label, gradient) of the tensors this scan's "
    "walk took, read instead of asking each tensor (valid while no other code runs)");

static PyObject *
fp_py_use_taken(Fingerprint *f, PyObject *taken)
{
    if (taken != Py_None && !PyDict_Check(taken)) {
        PyErr_SetString(PyExc_TypeError, "use_taken: a dict or None");
        return NULL;
    }
    fp_tensors_clear(&f->tensors);   /* (its entries can borrow from the last record) */
    Py_XSETREF(f->taken, taken == Py_None ? NULL : Py_NewRef(taken));
    Py_RETURN_NONE;
}

static PyMethodDef fp_methods[] = {
    {"forget", (PyCFunction)fp_py_forget, METH_NOARGS, fp_forget_doc},
    {"begin", (PyCFunction)fp_py_begin, METH_NOARGS, fp_begin_doc},
    {"use_taken", (PyCFunction)fp_py_use_taken, METH_O, fp_use_taken_doc},
    {"check", (PyCFunction)fp_py_check, METH_VARARGS, fp_check_doc},
    {"of", (PyCFunction)fp_py_of, METH_VARARGS, fp_of_doc},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject FingerprintType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jupyter_gpumem.core._reach.Fingerprint",
    .tp_basicsize = sizeof(Fingerprint),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Fingerprint(judge, libs, is_lib, stop_ids, known, get_fn, get_ptr, "
              "get_held, skip_keys, limit): see core/_reach_parts/plan.h",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fp_py_init,
    .tp_dealloc = (destructor)fp_dealloc,
    .tp_methods = fp_methods,
};
