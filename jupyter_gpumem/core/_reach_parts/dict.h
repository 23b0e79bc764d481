/* dict.h: a dict's entry table, read in place (part of _reach.c; dict.c).
 *
 * PyDict_Next reads each key's hash from the key object itself, so a pass over a table
 * touches every key: a cache miss apiece once the table is cold (a notebook's namespace
 * after a cell), and a namespace gains IPython's `_iN` names every cell. For the
 * interpreters whose table layout is known (CPython 3.11 to 3.13 with the GIL; the same
 * in all three, Include/internal/pycore_dict.h), a combined table of str keys is read in
 * place instead, its key and value pointers only.
 *
 * Invariants: DICT_TABLE is defined only for those interpreters, and a table is read in
 * place only where dict_table_ok is 1: the module checks at import that this reading
 * gives what PyDict_Next gives (dict_table_check); elsewhere PyDict_Next is used. The
 * fingerprint (which also needs each dict's version) is built only under DICT_TABLE. */
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
} dict_keys;
typedef struct {                /* PyDictUnicodeEntry */
    PyObject *me_key;
    PyObject *me_value;         /* NULL: a deleted entry */
} dict_entry;

static dict_entry *dict_table(PyObject *dict, Py_ssize_t *count);
#endif

static int dict_table_ok = 0;   /* set by dict_table_check() at import */
static int dict_table_check(void);

/* items_except's entries taken while a table is read (see dict.c) */
#define DICT_SKIP_MAX 64        /* types items_except leaves out, at most */
#define DICT_AHEAD 8            /* entries read ahead of the one taken (a prefetch) */
#define DICT_LEFT_OUT 1         /* by its value's type, or later by judge */
#define DICT_TO_JUDGE 2         /* an exact str key judge is to be asked about */
typedef struct {
    PyObject **taken;           /* key, value (new references) per entry taken */
    Py_ssize_t *where;          /* its position in the table */
    char *flags;                /* DICT_LEFT_OUT, DICT_TO_JUDGE */
    Py_ssize_t n;
} dict_taking;
