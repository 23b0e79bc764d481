/* _reach.c: the scan's C core, the module jupyter_gpumem.core._reach (optional: where it
 * is not built, jupyter_gpumem.core.scan.reach walks in Python, with the same objects and
 * the same answers, and jupyter_gpumem.core.devices reads /proc through os.pread).
 *
 * This is the one file compiled; its parts, in _reach_parts/, are #included below in
 * order, each header before any part (one translation unit: every helper is static).
 * The same layout as guppy3's heapyc: a module file that lists what it exports and
 * includes its parts.
 *
 * Exported to Python                      where (in _reach_parts/)
 *   Walker         type: the reach walk over plain containers and instances
 *                  (learn, push, run, clear, pick; pending, count, deep) walk.c
 *   items_except   a dict's pairs but those of some value types, read in
 *                  place, with a memo of the names left out             dict.c
 *   str_keys       whether a dict's keys are all str, from its table    dict.c
 *   take_batch     many tensors of a backend's plain types at once      batch.c
 *   pread_held     read the start of a small /proc file, the lock held  proc.c
 *   write_held     write to a file, the lock held                       proc.c
 *                  (these two are not built on Windows)
 *   Fingerprint    type: proves a root unchanged since the last scan
 *                  (of, check, begin, forget, use_taken)     fingerprint.c, fp_*.c
 *   FingerprintPlan  type: what one fingerprint read, kept as checks    plan.c
 *   DICT_TABLE     1 where dict tables are read in place (dict.h); the
 *                  Fingerprint types exist only where it is defined
 *
 * The parts, in the order they are included, with the prefix of their helpers:
 *   table   tab_, pset_  the one open-addressing table, and the set of addresses
 *   walk    walk_        the Walker
 *   dict    dict_        a dict's entry table read in place; items_except, str_keys
 *   proc    proc_        /proc reads and writes
 *   batch   batch_       take_batch, and the stamp a backend's record is checked by
 *   fp_hash, fp_tensor, fp_kinds   fp_   the Fingerprint's run, tensors, kinds
 *   plan    plan_        plans: recorded by the fingerprint, checked at the next scan
 *   fingerprint   fp_    the Fingerprint type
 * A function Python calls is named <prefix>_py_<its name>; each header states its part's
 * types and invariants, once.
 *
 * Where to start reading: walk.h, then walk_py_run (walk.c) for the walk; fingerprint.h,
 * then fp_py_of (fingerprint.c) and fp_visit (fp_kinds.c) for the fingerprint; plan.h,
 * then plan_holds (plan.c) for plans. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifndef _WIN32
#include <errno.h>
#include <unistd.h>
#endif
#include <stdint.h>
#include <string.h>

/* ==== declarations: types, invariants, the parts' faces ============================= */
#include "_reach_parts/table.h"
#include "_reach_parts/walk.h"
#include "_reach_parts/dict.h"
#include "_reach_parts/batch.h"
#ifdef DICT_TABLE
#define HAVE_FINGERPRINT 1
#include "_reach_parts/plan.h"
#include "_reach_parts/fp_tensor.h"
#include "_reach_parts/fingerprint.h"
#endif

/* ==== the parts ===================================================================== */
#include "_reach_parts/table.c"
#include "_reach_parts/walk.c"
#include "_reach_parts/dict.c"
#include "_reach_parts/proc.c"
#include "_reach_parts/batch.c"
#ifdef HAVE_FINGERPRINT
#include "_reach_parts/fp_hash.c"
#include "_reach_parts/fp_tensor.c"
#include "_reach_parts/fp_kinds.c"
#include "_reach_parts/plan.c"
#include "_reach_parts/fingerprint.c"
#endif

/* ==== the module ==================================================================== */
static PyMethodDef reach_functions[] = {
    {"items_except", dict_py_items_except, METH_VARARGS,
     "items_except(dict, types[, memo, judge, split]) -> list: the (key, value) pairs whose value's "
     "type is not in types (and whose name judge does not leave out); with split, (keys, values)"},
    {"str_keys", dict_py_str_keys, METH_O, dict_str_keys_doc},
    {"take_batch", batch_py_take, METH_VARARGS,
     "take_batch(values, memo, known, get_fn, stamp_of, get_held, storages, label, found, "
     "devices, node_type, node_head) -> list | None: many plain tensors at once"},
#ifndef _WIN32
    {"pread_held", proc_py_pread_held, METH_VARARGS,
     "pread_held(fd, size) -> bytes: read from the start of fd without releasing the GIL"},
    {"write_held", proc_py_write_held, METH_VARARGS,
     "write_held(fd, data) -> int: write to fd without releasing the GIL"},
#endif
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef reach_module = {
    PyModuleDef_HEAD_INIT, "_reach",
    "The reach walk's core at C speed (optional; see jupyter_gpumem.core.scan.reach).", -1,
    reach_functions,
};

PyMODINIT_FUNC
PyInit__reach(void)
{
    if (dict_table_check() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&reach_module);
    if (m == NULL)
        return NULL;
    /* each type under its own name (PyModule_AddType readies it) */
    if (PyModule_AddIntConstant(m, "DICT_TABLE", dict_table_ok) < 0 ||
            PyModule_AddType(m, &WalkerType) < 0
#ifdef HAVE_FINGERPRINT
            || PyModule_AddType(m, &FingerprintType) < 0
            || PyModule_AddType(m, &FingerprintPlanType) < 0
#endif
            ) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
