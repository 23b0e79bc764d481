/* table.c: the one open-addressing table, and the set of addresses built on it (part of
 * _reach.c; see table.h for its invariants). */

/* ==== slots ========================================================================= */

/* The first slot a key is looked for in (Fibonacci hashing of its address). */
static inline size_t
tab_hash(const void *key, size_t mask)
{
    return (size_t)((((uintptr_t)key) >> 4) * (uint64_t)11400714819323198485ull) & mask;
}

/* The slot of `key` in a table, or the empty slot where it would go (cap > 0). */
static inline size_t
tab_find(const void *slots, size_t size, size_t cap, const void *key)
{
    size_t mask = cap - 1, h = tab_hash(key, mask);
    for (;;) {
        const void *at = *(const void *const *)((const char *)slots + h * size);
        if (at == NULL || at == key)
            return h;
        h = (h + 1) & mask;
    }
}

/* A table of `cap` empty slots; NULL with MemoryError set. */
static void *
tab_alloc(size_t cap, size_t size)
{
    void *slots = PyMem_Calloc(cap, size);
    if (slots == NULL)
        PyErr_NoMemory();
    return slots;
}

/* Every entry of `src` moved to its slot in `dst`, an empty table of room for them all. */
static void
tab_rehash(void *dst, size_t dst_cap, const void *src, size_t src_cap, size_t size)
{
    for (size_t i = 0; i < src_cap; i++) {
        const char *slot = (const char *)src + i * size;
        const void *key = *(const void *const *)slot;
        if (key != NULL)
            memcpy((char *)dst + tab_find(dst, size, dst_cap, key) * size, slot, size);
    }
}

/* ==== a set of addresses ============================================================ */

/* The set's array doubled (32 slots at first); -1 with MemoryError set. */
static int
pset_grow(pset *s)
{
    size_t cap = s->cap ? s->cap * 2 : 32;
    void **keys = tab_alloc(cap, sizeof(void *));
    if (keys == NULL)
        return -1;
    tab_rehash(keys, cap, s->keys, s->cap, sizeof(void *));
    PyMem_Free(s->keys);
    s->keys = keys;
    s->cap = cap;
    return 0;
}

/* p added to the set: 1 added, 0 there already, -1 out of memory. */
static inline __attribute__((always_inline)) int
pset_add(pset *s, void *p)
{
    if ((s->n + 1) * 2 > s->cap && pset_grow(s) < 0)
        return -1;
    void **slot = &s->keys[tab_find(s->keys, sizeof(void *), s->cap, p)];
    if (*slot == p)
        return 0;
    *slot = p;
    s->n++;
    return 1;
}

/* Whether p is in the set. */
static inline __attribute__((always_inline)) int
pset_has(const pset *s, void *p)
{
    if (s->n == 0)
        return 0;
    return s->keys[tab_find(s->keys, sizeof(void *), s->cap, p)] == p;
}

/* Every item of `items` into the set: types (`ids` 0; other objects are left out) or
 * ids (`ids` 1: ints, the addresses id() gives); -1 with an error set. */
static int
pset_fill(pset *s, PyObject *items, int ids)
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

/* The set emptied and its array freed. */
static void
pset_free(pset *s)
{
    PyMem_Free(s->keys);
    s->keys = NULL;
    s->cap = s->n = 0;
}
