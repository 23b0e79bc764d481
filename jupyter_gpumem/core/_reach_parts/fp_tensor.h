/* fp_tensor.h: the fingerprint's two tables of plain tensors (part of _reach.c;
 * fp_tensor.c). Both are tables of table.h, keyed by the tensor's address.
 *
 * Invariants:
 *   - fp_tensors lives one scan (Fingerprint.begin/forget empty it): no other code runs
 *     while it is read, so a tensor found in it reads as it read earlier in the scan;
 *   - fp_records lives from scan to scan and holds no reference to a tensor: a record
 *     stands only while its weak ref still gives that very tensor and its stamp holds
 *     (batch_stamp_holds: the same storage, bytes and address); records of tensors gone
 *     are dropped when the table is rebuilt (fp_records_sweep). */
/* what one plain tensor's reading gave, kept for the rest of the scan (a model's
 * parameters are its optimizer's too): each pointer a strong reference */
typedef struct {
    PyObject *tensor;   /* NULL: an empty slot */
    PyObject *infos;    /* borrowed: the record table (or the walk's record) holds it, and
                           neither lets go of it while the memo has the tensor */
    PyObject *held;
} fp_seen_tensor;

typedef struct {
    fp_seen_tensor *slots;
    size_t cap, n;      /* cap: a power of two, or 0 */
    size_t last;        /* tensors read by the last scan: the next one's first room */
} fp_tensors;

/* the backend's record of one plain tensor, kept from scan to scan so that proving the
 * tensor unchanged asks no dict: by the tensor's address (no reference to it), the
 * record (a strong reference: a weak ref, the storage's stamp, the storages), and the
 * record's weak ref, stamp and storages read out of it */
typedef struct {
    PyObject *tensor;   /* NULL: an empty slot */
    PyObject *rec;
    PyObject *ref;
    PyObject *stamp;
    PyObject *infos;
} fp_record;

typedef struct {
    fp_record *slots;
    size_t cap, n;      /* cap: a power of two, or 0 */
    size_t live;        /* entries at the last sweep */
} fp_records;

static fp_seen_tensor *fp_tensor_slot(fp_tensors *m, PyObject *t);
static int fp_tensors_add(fp_tensors *m, PyObject *t, PyObject *infos, PyObject *held);
static void fp_tensors_clear(fp_tensors *m);
static fp_record *fp_record_slot(fp_records *m, PyObject *t);
static int fp_records_put(fp_records *m, PyObject *t, PyObject *rec);
static int fp_records_sweep(fp_records *m, size_t room);
static void fp_records_clear(fp_records *m);
