/* table.h: the one open-addressing table of the C core (part of _reach.c).
 *
 * Every table here is an array of `cap` slots of `size` bytes each whose FIRST member
 * is a pointer, the slot's key (an object's or a type's address); the rest of a slot
 * is its entry. Invariants, kept by every user of the table:
 *   - cap is 0 (no array yet) or a power of two;
 *   - a NULL key marks an empty slot (NULL is never a key);
 *   - a key is in one slot at most, found by linear probing from tab_hash(key);
 *   - at least half the slots are empty (a table grows, or is emptied, before that), so a
 *     probe always ends;
 *   - nothing is ever removed from a table: it is rebuilt (tab_rehash) or emptied whole.
 * A table holds no reference by itself: where a slot holds a strong reference its user
 * says so, and releases it before the array is freed.
 *
 * pset, a set of addresses, is the table with slots of a key alone. */

/* ==== the table's operations (table.c) ============================================ */
static inline size_t tab_hash(const void *key, size_t mask);
static inline size_t tab_find(const void *slots, size_t size, size_t cap, const void *key);
static void *tab_alloc(size_t cap, size_t size);
static void tab_rehash(void *dst, size_t dst_cap, const void *src, size_t src_cap,
                       size_t size);

/* ==== a set of addresses ============================================================ */
typedef struct {
    void **keys;
    size_t cap;   /* a power of two, or 0 */
    size_t n;
} pset;

static int pset_add(pset *s, void *p);
static int pset_has(const pset *s, void *p);
static int pset_fill(pset *s, PyObject *items, int ids);
static void pset_free(pset *s);
