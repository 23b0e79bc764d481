/* dict.c: a dict's entry table read in place, items_except and str_keys (part of
 * _reach.c; the layout read and its invariants are in dict.h). Start at
 * dict_py_items_except. */

/* ==== the table ===================================================================== */
#ifdef DICT_TABLE
/* The entries of a combined table of str keys, and their count; NULL for any other. */
static dict_entry *
dict_table(PyObject *dict, Py_ssize_t *count)
{
    PyDictObject *mp = (PyDictObject *)dict;
    dict_keys *keys = (dict_keys *)mp->ma_keys;
    if (mp->ma_values != NULL || keys == NULL || keys->dk_kind != 1)
        return NULL;
    *count = keys->dk_nentries;
    return (dict_entry *)(&keys->dk_indices[(size_t)1 << keys->dk_log2_index_bytes]);
}
#endif

/* Whether reading tables in place gives what PyDict_Next gives, on dicts of several
 * sizes with deleted entries (then in place reading is used: dict_table_ok); -1 with an
 * error set. */
static int
dict_table_check(void)
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
        dict_entry *e = dict_table(d, &count);
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

/* ==== items_except, step by step ====================================================
 * items_except(dict, types[, memo, judge]): the (key, value) pairs of a dict whose
 * value's exact type is not one of `types` (a frozenset of at most 64 types), in the
 * dict's order. Types are compared by address: no Python code runs while the table is
 * read (a metaclass's __hash__ or __eq__ is never asked, as `type(v) in types` would).
 *
 * With `memo` (a list of two lists, [out, kept], that the caller keeps from call to
 * call) and `judge` (a callable that says of an exact str key whether the caller leaves
 * its name out, whatever its value): out[i] holds the key found at position i of the
 * table when judge left it out, kept[i] the key found there when judge did not. A later
 * call that finds that same key object there in `out` skips the entry without reading
 * its key or its value (with the table read in place, see dict.h): IPython's `_iN`
 * names, one more every cell, then cost no cache miss apiece after every cell; one found
 * in `kept` is not judged again. The memo holds its keys (strings) by strong references,
 * so a key found at its position is the very object judged, and the verdict holds (it
 * depends on the name alone); a table rebuilt, or another dict, only costs the memo its
 * hits. judge is asked after the table is read, for the str keys the memo did not know. */

/* One entry taken (its key and value held) unless its value's type is skipped and it
 * has no name to judge; `judging`: 1 where this key is to be judged, 0 where it is
 * known to stay in. */
static inline void
dict_take_entry(dict_taking *t, PyObject *key, PyObject *value, Py_ssize_t at,
                PyObject *const *skip, Py_ssize_t nskip, int judging)
{
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
    t->flags[t->n] = (i < nskip ? DICT_LEFT_OUT : 0) |
        (judging && PyUnicode_CheckExact(key) ? DICT_TO_JUDGE : 0);
    t->n++;
}

/* list[at] = item, the list first grown with None as far as `at` (it lets go of what was
 * there); -1 with an error set. */
static int
dict_note_key(PyObject *list, Py_ssize_t at, PyObject *item)
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

/* The memo's two lists (both NULL without a memo); -1 with TypeError set where memo is
 * not a list of two lists given with judge. */
static int
dict_memo_lists(PyObject *memo, PyObject *judge, PyObject **out_memo, PyObject **kept_memo)
{
    *out_memo = *kept_memo = NULL;
    if (memo == Py_None)
        return 0;
    if (!PyList_CheckExact(memo) || PyList_GET_SIZE(memo) != 2
            || !PyList_CheckExact(PyList_GET_ITEM(memo, 0))
            || !PyList_CheckExact(PyList_GET_ITEM(memo, 1)) || judge == Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "items_except: memo is a list of two lists, given with judge");
        return -1;
    }
    *out_memo = PyList_GET_ITEM(memo, 0);
    *kept_memo = PyList_GET_ITEM(memo, 1);
    return 0;
}

/* The types of the frozenset into skip (borrowed: the frozenset holds them), their
 * count; -1 with an error set (ValueError beyond DICT_SKIP_MAX). */
static Py_ssize_t
dict_skip_types(PyObject *types, PyObject *skip[DICT_SKIP_MAX])
{
    Py_ssize_t nskip = 0;
    PyObject *it = PyObject_GetIter(types);
    if (it == NULL)
        return -1;
    PyObject *t;
    while ((t = PyIter_Next(it)) != NULL) {
        if (nskip == DICT_SKIP_MAX) {
            Py_DECREF(t);
            Py_DECREF(it);
            PyErr_SetString(PyExc_ValueError, "items_except takes at most 64 types");
            return -1;
        }
        skip[nskip++] = t;      /* the frozenset keeps it alive */
        Py_DECREF(t);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return -1;
    return nskip;
}

/* Every entry to look at taken into tk (new references) while the table is read:
 * nothing here allocates an object, so no collection can run a finalizer that changes
 * the dict. An entry whose key the memo's `out` holds at its position is skipped unread;
 * one whose key its `kept` holds there is not judged again. */
static void
dict_take_all(PyObject *dict, dict_taking *tk, PyObject *const *skip, Py_ssize_t nskip,
              PyObject *out_memo, PyObject *kept_memo)
{
    Py_ssize_t size = PyDict_GET_SIZE(dict);
    Py_ssize_t nout = out_memo != NULL ? PyList_GET_SIZE(out_memo) : 0;
    Py_ssize_t nkept = kept_memo != NULL ? PyList_GET_SIZE(kept_memo) : 0;
    PyObject **outs = out_memo != NULL ? ((PyListObject *)out_memo)->ob_item : NULL;
    PyObject **keeps = kept_memo != NULL ? ((PyListObject *)kept_memo)->ob_item : NULL;
    int judging = out_memo != NULL;
    PyObject *key, *value;
#ifdef DICT_TABLE
    Py_ssize_t count = 0;
    dict_entry *entries = dict_table_ok ? dict_table(dict, &count) : NULL;
    if (entries != NULL) {
        for (Py_ssize_t at = 0; at < count && tk->n < size; at++) {
            if (at + DICT_AHEAD < count && entries[at + DICT_AHEAD].me_value != NULL) {
                /* the value read (its type) and both taken (a count written) a few
                   entries on: a long notebook's names are spread over a heap that
                   outgrows the caches, and the fetches then overlap */
                __builtin_prefetch(entries[at + DICT_AHEAD].me_value, 1);
                __builtin_prefetch(entries[at + DICT_AHEAD].me_key, 1);
            }
            key = entries[at].me_key;
            value = entries[at].me_value;
            if (value == NULL)
                continue;       /* a deleted entry */
            if (at < nout && outs[at] == key)
                continue;       /* the same key object the memo judged: left out */
            dict_take_entry(tk, key, value, at, skip, nskip,
                            judging && !(at < nkept && keeps[at] == key));
        }
        return;
    }
#endif
    Py_ssize_t pos = 0;
    while (tk->n < size && PyDict_Next(dict, &pos, &key, &value)) {
        Py_ssize_t at = pos - 1;
        if (at < nout && outs[at] == key)
            continue;
        dict_take_entry(tk, key, value, at, skip, nskip,
                        judging && !(at < nkept && keeps[at] == key));
    }
}

/* judge asked of each key taken to be judged, its verdict noted in the memo (whose lists
 * grow from here on) and DICT_LEFT_OUT set where it leaves the name out; -1 with an
 * error set. */
static int
dict_judge_taken(dict_taking *tk, PyObject *judge, PyObject *out_memo, PyObject *kept_memo)
{
    for (Py_ssize_t j = 0; j < tk->n; j++) {
        if (!(tk->flags[j] & DICT_TO_JUDGE))
            continue;           /* no name, or known to stay in */
        PyObject *k = tk->taken[2 * j];
        Py_ssize_t at = tk->where[j];
        PyObject *verdict = PyObject_CallOneArg(judge, k);
        int out_of_it = verdict == NULL ? -1 : PyObject_IsTrue(verdict);
        Py_XDECREF(verdict);
        if (out_of_it < 0
                || dict_note_key(out_memo, at, out_of_it ? k : Py_None) < 0
                || dict_note_key(kept_memo, at, out_of_it ? Py_None : k) < 0)
            return -1;
        if (out_of_it)
            tk->flags[j] |= DICT_LEFT_OUT;
    }
    return 0;
}

/* The (key, value) pairs of the entries taken and not left out, or with `split` the
 * two lists (keys, values) (their references move in; NULL where `failed` or with an
 * error set); tk's arrays are freed either way. */
static PyObject *
dict_pairs(dict_taking *tk, int failed, int split)
{
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < tk->n; j++)
        kept += !(tk->flags[j] & DICT_LEFT_OUT);
    PyObject *out = NULL, *keys = NULL, *values = NULL;
    if (!failed) {
        if (split) {
            keys = PyList_New(kept);
            values = PyList_New(kept);
            if (keys != NULL && values != NULL)
                out = PyTuple_Pack(2, keys, values);
        }
        else
            out = PyList_New(kept);
    }
    Py_ssize_t made = 0;
    for (Py_ssize_t j = 0; out != NULL && j < tk->n; j++) {
        if (tk->flags[j] & DICT_LEFT_OUT)
            continue;
        if (split) {            /* the references move in */
            PyList_SET_ITEM(keys, made, tk->taken[2 * j]);
            PyList_SET_ITEM(values, made++, tk->taken[2 * j + 1]);
        }
        else {
            PyObject *pair = PyTuple_New(2);
            if (pair == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(pair, 0, tk->taken[2 * j]);
            PyTuple_SET_ITEM(pair, 1, tk->taken[2 * j + 1]);
            PyList_SET_ITEM(out, made++, pair);
        }
        tk->taken[2 * j] = tk->taken[2 * j + 1] = NULL;
    }
    Py_XDECREF(keys);           /* (the tuple holds them) */
    Py_XDECREF(values);
    for (Py_ssize_t j = 0; j < tk->n; j++) {     /* what was not moved out */
        Py_XDECREF(tk->taken[2 * j]);
        Py_XDECREF(tk->taken[2 * j + 1]);
    }
    PyMem_Free(tk->taken);
    PyMem_Free(tk->where);
    PyMem_Free(tk->flags);
    return out;
}

/* items_except(dict, types[, memo, judge, split]) -> list (or two lists): see above. */
static PyObject *
dict_py_items_except(PyObject *self, PyObject *args)
{
    PyObject *dict, *types, *memo = Py_None, *judge = Py_None;
    int split = 0;
    if (!PyArg_ParseTuple(args, "O!O!|OOp:items_except", &PyDict_Type, &dict,
                          &PyFrozenSet_Type, &types, &memo, &judge, &split))
        return NULL;
    PyObject *out_memo, *kept_memo;
    if (dict_memo_lists(memo, judge, &out_memo, &kept_memo) < 0)
        return NULL;
    PyObject *skip[DICT_SKIP_MAX];
    Py_ssize_t nskip = dict_skip_types(types, skip);
    if (nskip < 0)
        return NULL;
    /* first the entries to look at, taken; judge is asked and the pairs are made
       afterwards, from what was taken */
    Py_ssize_t size = PyDict_GET_SIZE(dict);
    dict_taking tk = {PyMem_Malloc(sizeof(PyObject *) * 2 * (size ? size : 1)),
                      PyMem_Malloc(sizeof(Py_ssize_t) * (size ? size : 1)),
                      PyMem_Malloc(size ? size : 1), 0};
    if (tk.taken == NULL || tk.where == NULL || tk.flags == NULL) {
        PyMem_Free(tk.taken);
        PyMem_Free(tk.where);
        PyMem_Free(tk.flags);
        return PyErr_NoMemory();
    }
    dict_take_all(dict, &tk, skip, nskip, out_memo, kept_memo);
    int failed = out_memo != NULL && dict_judge_taken(&tk, judge, out_memo, kept_memo) < 0;
    return dict_pairs(&tk, failed, split);
}

/* ==== str_keys ====================================================================== */
PyDoc_STRVAR(dict_str_keys_doc,
"str_keys(dict) -> bool: whether every key is proven a str, in one read of the table's\n"
"kind (a table that holds only str keys); False where that is not proven, and the\n"
"caller looks at each key.");

static PyObject *
dict_py_str_keys(PyObject *self, PyObject *arg)
{
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "str_keys takes a dict");
        return NULL;
    }
#ifdef DICT_TABLE
    Py_ssize_t count = 0;
    if (dict_table_ok && dict_table(arg, &count) != NULL)
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}
