/* plan.h: plans, what one fingerprint read kept as checks (part of _reach.c; plan.c).
 *
 * A plan is what one fingerprint read, kept as checks in the order it read them: the
 * next scan proves the root unchanged by running them (Fingerprint.check), which reads
 * far less than hashing it all again.
 *
 * Invariants:
 *   - each check is of one object by its address, and holds no reference to it: the
 *     checks run in the order the fingerprint read, a parent before what it holds, and
 *     stop at the first that fails, so each object checked is one that a checked parent
 *     holds now, alive (no code runs meanwhile: no collection, and no Python code in the
 *     tensor getters: the caller checks first that no torch function mode is on);
 *   - a dict with the same address and version is the same dict with the same keys and
 *     values (versions are unique), so what it holds is "proven": the same objects as
 *     before, whose immutable parts (a tuple's items, an atom) need no check at all;
 *   - a list's items are compared by address, and an address can be another object's
 *     since, so what a list (a set, a cell, a function's parts, an instance's referents,
 *     a gradient) holds is not proven: its type is checked, and whether the stop set
 *     holds it;
 *   - a plan reads what the hash reads; where it cannot say (a check failed), the caller
 *     hashes; a broken plan (out of memory, too long) proves nothing. */
enum {
    PL_ATOM, PL_STOP, PL_DICT, PL_ODICT, PL_DDICT, PL_SEQ, PL_ITER, PL_TENSOR, PL_REFS,
    PL_FUNC, PL_LIBFUNC, PL_CELL, PL_TYPE, PL_STATIC, PL_MODULE, PL_EMPTY_SET, PL_ATOMS
};

typedef struct {
    PyObject *obj;          /* an address (no reference: see the top) */
    PyTypeObject *type;     /* its exact type then */
    uint8_t kind;
    uint8_t proven;         /* the same object as when recorded (see the top) */
    uint8_t visited;        /* read as itself (its stop-set membership is part of it) */
    uint32_t n;             /* words in aux */
    size_t aux;             /* where they start */
    uint64_t a, b;          /* a version, a pointer... (per kind) */
} plan_step;

typedef struct {
    PyObject_HEAD
    plan_step *steps;
    size_t n, cap;
    uintptr_t *aux;
    size_t naux, capaux;
    PyObject *types;        /* a list of weak refs: the heap types its checks compare */
    pset typeset;           /* (while it is recorded) the heap types in types */
    int broken;             /* recording failed (out of memory): it proves nothing */
} FingerprintPlan;

static PyTypeObject FingerprintPlanType;

/* a plan of more checks (or words) than these is not kept: its root is hashed each time,
 * as without plans (a plan costs about 48 bytes a check) */
#define PLAN_MAX_STEPS (1 << 18)
#define PLAN_MAX_WORDS (1 << 20)

/* the hashing run a plan is recorded by (fingerprint.h) */
typedef struct fp_run fp_run;

/* recording (plan.c; each does nothing where no plan is recorded, or it broke) */
static plan_step *plan_record(fp_run *r, int kind, PyObject *o, int proven, int visited);
static void plan_record_word(fp_run *r, plan_step *st, uintptr_t w);
static void plan_record_words(fp_run *r, plan_step *st, PyObject *const *items,
                              Py_ssize_t n);
static void plan_record_inline(fp_run *r, PyObject *o, PyTypeObject *tp, int proven);
static void plan_trim(FingerprintPlan *p);
