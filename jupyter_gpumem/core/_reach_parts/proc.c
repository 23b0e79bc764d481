/* proc.c: small /proc files read and written with the interpreter lock held (part of
 * _reach.c).
 *
 * Such a read never waits on a disk, and each time the main thread lets go of the lock a
 * kernel's busy I/O thread may take it for as long as a message takes to send, several
 * times per cell's footer; so these calls keep it (jupyter_gpumem.core.devices reads
 * /proc through os.pread where the C core is not built). Not built on Windows. */
#ifndef _WIN32

/* pread_held(fd, size): up to size bytes of fd from its start, the lock held. */
static PyObject *
proc_py_pread_held(PyObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "in:pread_held", &fd, &size))
        return NULL;
    if (size < 0 || size > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "pread_held reads at most 1 MiB");
        return NULL;
    }
    PyObject *buf = PyBytes_FromStringAndSize(NULL, size);
    if (buf == NULL)
        return NULL;
    ssize_t n;
    do {
        n = pread(fd, PyBytes_AS_STRING(buf), (size_t)size, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        Py_DECREF(buf);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (_PyBytes_Resize(&buf, n) < 0)
        return NULL;
    return buf;
}

/* write_held(fd, data): write data to fd, the lock held; the bytes written. */
static PyObject *
proc_py_write_held(PyObject *self, PyObject *args)
{
    int fd;
    const char *data;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "iy#:write_held", &fd, &data, &len))
        return NULL;
    ssize_t n;
    do {
        n = write(fd, data, (size_t)len);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromSsize_t(n);
}
#endif
