/* batch.c: take_batch, a backend's many plain tensors at once, and the stamp a backend's
 * record is checked by (part of _reach.c; invariants in batch.h). Start at
 * batch_py_take. */

/* ==== a record's stamp ============================================================= */

/* batch_stamp_holds(getters, t, stamp): whether a backend's record of tensor t still stands.
 * `stamp` is (weak ref to t's storage object, its bytes, its data pointer) as the record
 * took it; `getters` is (storage of a tensor, bytes of a storage, data pointer of a
 * storage), the backend's C methods. It stands where t's storage is that very object
 * and has those bytes at that address: a data pointer alone proves nothing (a larger
 * storage may start where a freed one did). 1, 0 (also where t has no storage of its
 * own: a sparse tensor is read the long way), or -1 with an error set. */
static int
batch_stamp_holds(PyObject *getters, PyObject *t, PyObject *stamp)
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

/* ==== a tensor's own attributes ==================================================== */

/* traverse's callback: a non-empty dict met stops the traversal (*arg set). */
static int
batch_attrs_visit(PyObject *o, void *arg)
{
    if (PyDict_CheckExact(o) && PyDict_GET_SIZE(o) != 0) {
        *(int *)arg = 1;
        return 1;
    }
    return 0;
}

/* batch_has_attrs(t): whether tensor t has attributes of its own (``t.extra = x``,
 * ``param.main_grad``: a non-empty instance dict), met through its type's traverse as
 * gc.get_referents meets it (no code runs, nothing is made). Such a tensor is taken the
 * long way (its attributes are edges of the walk: the backend's tensor_edges), and the
 * fingerprint doubts it (walked each time). */
static int
batch_has_attrs(PyObject *t)
{
    int found = 0;
    traverseproc traverse = Py_TYPE(t)->tp_traverse;
    if (traverse != NULL && PyObject_IS_GC(t))
        traverse(t, batch_attrs_visit, &found);
    return found;
}

/* ==== take_batch, step by step ======================================================
 * take_batch(values, memo, known, get_fn, stamp_of, get_held, storages, label, found,
 *            devices, node_type, node_head) -> list | None
 *
 * Many tensors of a backend's plain types at once (an optimizer's state, a model's
 * parameters): the Python walk's C-level passes over them fused into one loop.
 * `values` is a list; `memo` maps id(value) -> (storages, label, held) for the values
 * taken before in this scan. For each value not in `memo`: get_fn(value) is asked
 * first (get_fn: a getter or a tuple of getters, each asked: an autograd graph's, a
 * view's base's), for all of them (any answer other than None returns None
 * before anything is written: the caller takes those the long way; so does a tensor
 * with attributes of its own, batch_has_attrs); then its storages
 * are `known[id(value)][2]` where the stamp `known[id(value)][1]` holds
 * (batch_stamp_holds, stamp_of: its getters; the backend's own record, kept while the
 * tensor lives), else storages(value); what it holds is get_held(value) (its gradient),
 * recorded under `label`; the entry goes into `memo`. Then each storage `info` (a tuple:
 * key, bytes, device, ...) whose device is in `devices` (None: every device) and whose
 * key is not in `found` yet goes in as found[key] = (info, node, None), node made here as
 * node_type(node_head + (key,)) (a tuple subclass) or None. The first value met with a
 * key stands for it. Returns the held values that are not None, in order. */

/* The arguments parsed and checked into a; -1 with an error set. */
static int
batch_parse(PyObject *args, batch_args *a)
{
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOO!OOO:take_batch", &PyList_Type, &a->values,
                          &PyDict_Type, &a->memo, &PyDict_Type, &a->known, &a->get_fn,
                          &a->stamp_of, &a->get_held, &a->storages, &a->label, &PyDict_Type,
                          &a->found, &a->devices, &a->node_type, &a->node_head))
        return -1;
    if (a->devices != Py_None && !PyAnySet_Check(a->devices)) {
        PyErr_SetString(PyExc_TypeError, "take_batch: devices must be a set or None");
        return -1;
    }
    a->head = 0;
    if (a->node_type != Py_None) {
        if (!PyType_Check(a->node_type) ||
                !PyType_IsSubtype((PyTypeObject *)a->node_type, &PyTuple_Type) ||
                !PyTuple_Check(a->node_head)) {
            PyErr_SetString(PyExc_TypeError,
                            "take_batch: node_type must be a tuple subclass, node_head a tuple");
            return -1;
        }
        a->head = PyTuple_GET_SIZE(a->node_head);
    }
    return 0;
}

/* Each value's id and its memo entry where it has one (new references into ids and
 * entries); for the others get_fn asked: 1 none has a graph, 0 one has (nothing
 * written), -1 with an error set. */
static int
batch_look_up(const batch_args *a, PyObject **vals, PyObject **ids, PyObject **entries,
              Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        ids[i] = PyLong_FromVoidPtr(vals[i]);
        if (ids[i] == NULL)
            return -1;
        PyObject *entry = PyDict_GetItemWithError(a->memo, ids[i]);
        if (entry != NULL) {
            entries[i] = Py_NewRef(entry);
            continue;
        }
        if (PyErr_Occurred())
            return -1;
        /* get_fn: a getter, or a tuple of them (a graph's, a view's base's) */
        int tuple = PyTuple_Check(a->get_fn);
        Py_ssize_t n_get = tuple ? PyTuple_GET_SIZE(a->get_fn) : 1;
        for (Py_ssize_t g = 0; g < n_get; g++) {
            PyObject *get = tuple ? PyTuple_GET_ITEM(a->get_fn, g) : a->get_fn;
            PyObject *fn = PyObject_CallOneArg(get, vals[i]);
            if (fn == NULL)
                return -1;
            int other_way = fn != Py_None;
            Py_DECREF(fn);
            if (other_way)
                return 0;
        }
        if (batch_has_attrs(vals[i]))
            return 0;
    }
    return 1;
}

/* The memo entry (storages, label, held) of value t, read and put in the memo (a new
 * reference; NULL with an error set): its storages from the backend's record where its
 * stamp holds, else asked. */
static PyObject *
batch_read(const batch_args *a, PyObject *t, PyObject *id)
{
    PyObject *infos = NULL;
    PyObject *rec = PyDict_GetItemWithError(a->known, id);
    if (rec == NULL && PyErr_Occurred())
        return NULL;
    if (rec != NULL && PyTuple_Check(rec) && PyTuple_GET_SIZE(rec) >= 3) {
        Py_INCREF(rec);
        int same = batch_stamp_holds(a->stamp_of, t, PyTuple_GET_ITEM(rec, 1));
        if (same > 0)
            infos = Py_NewRef(PyTuple_GET_ITEM(rec, 2));
        Py_DECREF(rec);
        if (same < 0)
            return NULL;
    }
    if (infos == NULL) {
        infos = PyObject_CallOneArg(a->storages, t);   /* first met, or moved */
        if (infos == NULL)
            return NULL;
    }
    PyObject *held = PyObject_CallOneArg(a->get_held, t);
    if (held == NULL) {
        Py_DECREF(infos);
        return NULL;
    }
    PyObject *entry = PyTuple_Pack(3, infos, a->label, held);
    Py_DECREF(infos);
    Py_DECREF(held);
    return entry;
}

/* The node of a storage's key: node_type(node_head + (key,)), or None (a new
 * reference; NULL with an error set). */
static PyObject *
batch_node(const batch_args *a, PyObject *key)
{
    if (a->node_type == Py_None)
        return Py_NewRef(Py_None);
    PyObject *node = ((PyTypeObject *)a->node_type)->tp_alloc((PyTypeObject *)a->node_type,
                                                              a->head + 1);
    if (node == NULL)
        return NULL;
    for (Py_ssize_t h = 0; h < a->head; h++)
        PyTuple_SET_ITEM(node, h, Py_NewRef(PyTuple_GET_ITEM(a->node_head, h)));
    PyTuple_SET_ITEM(node, a->head, Py_NewRef(key));
    return node;
}

/* One memo entry's storages filed into found (those on the devices asked, the first met
 * standing for its key), and its held value appended to out where not None; -1 with an
 * error set. */
static int
batch_file(const batch_args *a, PyObject *entry, PyObject *out)
{
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 3) {
        PyErr_SetString(PyExc_TypeError, "take_batch: a memo entry is not (storages, label, held)");
        return -1;
    }
    PyObject *infos = PySequence_Fast(PyTuple_GET_ITEM(entry, 0),
                                      "take_batch: storages must be a sequence");
    if (infos == NULL)
        return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(infos);
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *info = PySequence_Fast_GET_ITEM(infos, j);
        if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) < 3) {
            PyErr_SetString(PyExc_TypeError, "take_batch: a storage is not (key, bytes, device, ...)");
            Py_DECREF(infos);
            return -1;
        }
        PyObject *key = PyTuple_GET_ITEM(info, 0);
        if (a->devices != Py_None) {
            int on = PySet_Contains(a->devices, PyTuple_GET_ITEM(info, 2));
            if (on < 0) {
                Py_DECREF(infos);
                return -1;
            }
            if (!on)
                continue;
        }
        /* one look-up where the key is new (the common case): the entry is made first
           and set only if the key is not there (the first met stands) */
        PyObject *node = batch_node(a, key);
        if (node == NULL) {
            Py_DECREF(infos);
            return -1;
        }
        PyObject *value = PyTuple_Pack(3, info, node, Py_None);
        Py_DECREF(node);
        PyObject *have = value == NULL ? NULL : PyDict_SetDefault(a->found, key, value);
        if (have == NULL) {
            Py_XDECREF(value);
            Py_DECREF(infos);
            return -1;
        }
        /* one allocation, one key: where two storages start at one address, the larger
           stands for the key, whichever came first (tensors.py, _stands) */
        if (have != value && PyTuple_Check(have) && PyTuple_GET_SIZE(have) == 3) {
            PyObject *had = PyTuple_GET_ITEM(have, 0);
            int larger = PyTuple_Check(had) && PyTuple_GET_SIZE(had) > 1 ?
                PyObject_RichCompareBool(PyTuple_GET_ITEM(had, 1), PyTuple_GET_ITEM(info, 1),
                                         Py_LT) : 0;
            if (larger < 0 || (larger && PyDict_SetItem(a->found, key, value) < 0)) {
                Py_DECREF(value);
                Py_DECREF(infos);
                return -1;
            }
        }
        Py_DECREF(value);
    }
    Py_DECREF(infos);
    PyObject *held = PyTuple_GET_ITEM(entry, 2);
    if (held != Py_None && PyList_Append(out, held) < 0)
        return -1;
    return 0;
}

/* take_batch(...) -> list | None: see above. */
static PyObject *
batch_py_take(PyObject *self, PyObject *args)
{
    batch_args a;
    if (batch_parse(args, &a) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(a.values);
    /* each value, its id and its memo entry, held here: the getters may allocate, and
       a collection's finalizer must not take anything from under the loop */
    PyObject **vals = PyMem_Calloc(3 * (size_t)(n ? n : 1), sizeof(PyObject *));
    if (vals == NULL)
        return PyErr_NoMemory();
    PyObject **ids = vals + n, **entries = vals + 2 * n;
    PyObject *result = NULL, *out = NULL;
    Py_ssize_t i;
    for (i = 0; i < n && i < PyList_GET_SIZE(a.values); i++) {
        vals[i] = Py_NewRef(PyList_GET_ITEM(a.values, i));
    }
    n = i;
    int none_graph = batch_look_up(&a, vals, ids, entries, n);
    if (none_graph <= 0) {
        if (none_graph == 0)
            result = Py_NewRef(Py_None);   /* nothing written yet */
        goto done;
    }
    for (i = 0; i < n; i++) {
        if (entries[i] != NULL)
            continue;
        entries[i] = batch_read(&a, vals[i], ids[i]);
        if (entries[i] == NULL || PyDict_SetItem(a.memo, ids[i], entries[i]) < 0)
            goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        if (batch_file(&a, entries[i], out) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
    result = out;
done:
    for (i = 0; i < n; i++) {
        Py_XDECREF(vals[i]);
        Py_XDECREF(ids[i]);
        Py_XDECREF(entries[i]);
    }
    PyMem_Free(vals);
    return result;
}
