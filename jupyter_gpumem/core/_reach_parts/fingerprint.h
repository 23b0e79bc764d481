/* fingerprint.h: the Fingerprint, what proves that a root's walk would read again what
 * it read last time (part of _reach.c; fp_hash.c, fp_tensor.c, fp_kinds.c, fingerprint.c).
 *
 * Invariants:
 *   - it reads more than any walk reads (a superset is safe: more can only say
 *     "changed"), never less, and it runs no user code;
 *   - a kind it cannot prove (an autograd graph, a frame, a numpy array, a type it was
 *     not told about...) or a structure of more than `limit` objects gives None at once
 *     (fp_run.doubt): the caller walks that root again;
 *   - an object met again hashes as its address; every object in fp_run.seen is held by
 *     fp_run.held, so no address is another object's during a run;
 *   - the type cache holds each type by a strong reference while a scan runs, and none
 *     between scans (forget()): a class of the user's can hold what a purge frees.
 * Built only under DICT_TABLE (dict.h): elsewhere the scan always walks every root. */
/* actions, as the caller's judge gives them for a type (see core/scan/warm.py) */
enum {
    FP_DOUBT = 0, FP_ATOM = 1, FP_DICT = 2, FP_ODICT = 3, FP_DDICT = 4, FP_SEQ = 5,
    FP_SET = 6, FP_ITER = 7, FP_TENSOR = 8, FP_REFERENTS = 9,
    FP_FUNCTION = 10, FP_CELL = 11, FP_TYPE = 12, FP_MODULE = 13, FP_ACTIONS = 14
};

/* a backend's getter (a getset or no-argument method descriptor, called through its C
 * function; anything else through a call) */
typedef struct {
    PyObject *obj;
    PyTypeObject *owner;   /* the descriptor's type: the tensor must be one */
    getter get;
    void *closure;
    PyCFunction meth;
} fp_getter;

/* the type cache: an action per type, judged once in Python (a table of table.h) */
#define FP_TYPE_CACHE 512   /* a power of two; emptied when half full */
typedef struct {
    PyTypeObject *type;     /* a strong reference; NULL: an empty slot */
    unsigned char action;
} fp_type_slot;

typedef struct {
    PyObject_HEAD
    PyObject *judge;     /* judge(type) -> action */
    fp_type_slot types[FP_TYPE_CACHE];
    int ntypes;
    fp_getter fn, base, held;  /* base: a view's (obj NULL where none was given) */
    fp_getter ptr;             /* its obj is the stamp's getters (batch_stamp_holds) */
    fp_tensors tensors;  /* read in this scan (forget() empties it) */
    fp_records records;  /* the backend's records met in earlier scans (see fp_record) */
    PyObject *taken;     /* a dict or NULL: id -> (storages, label, gradient) of the tensors
                            this scan's walk took (use_taken), read instead of the tensor */
    PyObject *libs;      /* dict: module name -> whether it is a library's (through is_lib) */
    PyObject *is_lib;    /* is_lib(name) -> bool */
    pset stop;           /* objects never entered (their ids) */
    PyObject *known;     /* the backend's record: id(tensor) -> (weak ref, stamp, storages) */
    PyObject *skip_keys; /* a class's entries that are not what it holds (a frozenset) */
    Py_ssize_t limit;
} Fingerprint;

/* one hashing run, Fingerprint.of: two 64-bit sums over what a root holds */
struct fp_run {
    uint64_t h1, h2;
    Py_ssize_t count;
    PyObject **stack;    /* strong references */
    uint8_t *proven;     /* per stack entry: reached from a parent that proves it */
    uint8_t child_proven;   /* for what is pushed now */
    uint8_t cur_proven;     /* of the object being read */
    FingerprintPlan *plan;   /* NULL: none recorded */
    size_t top, cap;
    pset seen;
    PyObject *held;      /* a list: what seen holds, so no address is reused meanwhile */
    PyObject *keep;      /* a list or NULL: the records and code objects hashed by address */
    const pset *stop;
    int doubt;
};

static int fp_tensor_read(Fingerprint *f, PyObject *t, PyObject **infos_out,
                          PyObject **held_out, Py_ssize_t refs);
static int plan_holds(Fingerprint *f, FingerprintPlan *p, PyObject *root);
