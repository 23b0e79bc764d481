/* batch.h: many tensors of a backend's plain types at once (part of _reach.c; batch.c).
 *
 * Invariants: only a backend's own getters run (no user code): the values are of the
 * exact types the backend named, the keys are tuples of strings and integers; every
 * value, its id and its memo entry are held by the batch while getters run (a
 * collection's finalizer must not take anything from under the loop); nothing is
 * written (to memo or found) before every value's get_fn has said it has no autograd
 * graph. */

/* take_batch's arguments, as Python gives them (borrowed) */
typedef struct {
    PyObject *values, *memo, *known, *get_fn, *stamp_of, *get_held, *storages, *label;
    PyObject *found, *devices, *node_type, *node_head;
    Py_ssize_t head;     /* the length of node_head (0 where node_type is None) */
} batch_args;

/* whether a backend's record of tensor t still stands (also used by the fingerprint) */
static int batch_stamp_holds(PyObject *getters, PyObject *t, PyObject *stamp);
