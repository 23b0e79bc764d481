/* walk.h: the Walker, the reach walk's core (part of _reach.c; walk.c).
 *
 * Invariants:
 *   - every object on the stack, and every object in `seen`, is held by a strong
 *     reference (the frame's, or `held`'s) until the walk is cleared: an object that goes
 *     while the walk waits between two runs cannot be mistaken for a new one;
 *   - only objects held more than once go into `seen` (one that only its parent holds
 *     cannot be met again);
 *   - no user code runs inside a run: only tp_traverse of plain types, and the clock;
 *   - an object of a type not in `known` is handed back to Python, and the run pauses
 *     until Python has classified it (learn()).
 * The types in the sets are held by the caller (the scan), not by the Walker. */

typedef struct {
    PyObject *obj;    /* a strong reference */
    Py_ssize_t pos;   /* where reading a list, tuple or dict goes on */
    int depth;
} walk_frame;

typedef struct {
    PyObject_HEAD
    pset plain;        /* types walked here */
    pset known;        /* types Python has classified (the plain ones among them) */
    pset watch;        /* types the collector does not track whose instances matter */
    pset stop;         /* objects not to enter (their ids) */
    pset seen;         /* objects held more than once, met already (each held) */
    PyObject *held;    /* a list holding the remembered objects */
    walk_frame *stack;
    size_t top, cap;
    PyObject *out;     /* what this run hands back to Python */
    PyObject *clock;   /* a callable giving the time, compared with run()'s deadline */
    int check_singles; /* look objects only their parent holds up in stop too */
    int max_depth;
    int deep;          /* a structure deeper than max_depth was cut */
    int failed;        /* out of memory inside a visit */
    int paused;        /* an object of a type not classified yet was handed back */
    Py_ssize_t count;  /* objects entered */
    int depth;         /* of the object whose referents a tp_traverse visits */
} Walker;

/* the clock is asked once every this many steps of a run */
#define WALK_CHECK_EVERY 1024
#define WALK_AHEAD 8            /* roots read ahead of the one picked (a prefetch) */
/* pick's marks, one per root (walk.c; the same values in core/scan/reach.py) */
#define WALK_NOT_PICKED 0
#define WALK_PICKED 1           /* walked together */
#define WALK_ATOMS 2            /* an untracked dict or tuple: atoms only */
#define WALK_UNKNOWN 3          /* of a type not classified yet */

static PyTypeObject WalkerType;
