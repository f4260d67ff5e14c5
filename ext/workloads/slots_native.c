/* Values of a slotted class made from columns, for the synthetic generators' ~100K turns a step: the same objects
   as `object.__new__(cls)` and each slot's setter (libra/workloads/trace.py `trusted_values`, the reference and the
   fallback), without a Python call per slot. Only for a class whose fields are plain object slots (member
   descriptors) and that keeps `object`'s allocation: anything else is refused, and the caller uses the reference. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

enum { MAX_FIELDS = 16 };

/* Whether `object.__new__(cls)` makes a plain `cls` with object's allocation, as it decides: past the classes whose
   `__new__` is written in Python (a heap class's own `__new__`, which `object.__new__` does not call), the first
   class must take object's `tp_new` (else "object.__new__(X) is not safe"), and the allocation must be object's. */
static int object_new_applies(PyTypeObject *cls) {
    PyTypeObject *base = cls;
    while (base != NULL && (base->tp_flags & Py_TPFLAGS_HEAPTYPE) && base->tp_new != PyBaseObject_Type.tp_new) {
        PyObject *own = PyDict_GetItemString(base->tp_dict, "__new__"); /* borrowed */
        int inherited = own == NULL && base->tp_base != NULL && base->tp_new == base->tp_base->tp_new;
        if (!inherited && (own == NULL || !Py_IS_TYPE(own, &PyStaticMethod_Type))) return 0; /* (a C `tp_new`) */
        base = base->tp_base;
    }
    return base != NULL && base->tp_new == PyBaseObject_Type.tp_new && cls->tp_alloc == PyType_GenericAlloc &&
           cls->tp_itemsize == 0;
}

/* make(cls, fields, columns) -> list: one `cls` per row, slot `fields[j]` set to `columns[j][row]` */
static PyObject *make(PyObject *Py_UNUSED(self), PyObject *args) {
    PyTypeObject *cls;
    PyObject *fields, *columns, *out = NULL;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &cls, &PyTuple_Type, &fields, &PyTuple_Type, &columns))
        return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(fields);
    if (nf != PyTuple_GET_SIZE(columns) || nf > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "make: one column per field, at most 16");
        return NULL;
    }
    if (!object_new_applies(cls)) {
        PyErr_SetString(PyExc_TypeError, "make: the class must keep object's allocation");
        return NULL;
    }
    if (cls->tp_flags & Py_TPFLAGS_IS_ABSTRACT) { /* (`object.__new__` refuses it, and so does this) */
        PyErr_Format(PyExc_TypeError, "make: %s is abstract; it has no instances", cls->tp_name);
        return NULL;
    }
    Py_ssize_t offset[MAX_FIELDS], rows = -1;
    PyObject *seq[MAX_FIELDS] = {NULL};
    for (Py_ssize_t j = 0; j < nf; j++) {
        PyObject *descr = _PyType_Lookup(cls, PyTuple_GET_ITEM(fields, j)); /* borrowed */
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) {
            PyErr_Format(PyExc_TypeError, "make: %R is not a slot of the class", PyTuple_GET_ITEM(fields, j));
            goto out;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0 ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "make: %R is not a plain object slot", PyTuple_GET_ITEM(fields, j));
            goto out;
        }
        offset[j] = m->offset;
        seq[j] = PySequence_Fast(PyTuple_GET_ITEM(columns, j), "make: a column must be a sequence");
        if (seq[j] == NULL) goto out;
        Py_ssize_t len = PySequence_Fast_GET_SIZE(seq[j]);
        if (rows >= 0 && len != rows) {
            PyErr_SetString(PyExc_ValueError, "make: the columns differ in length");
            goto out;
        }
        rows = len;
    }
    if (rows < 0) rows = 0;
    out = PyList_New(rows);
    if (out == NULL) goto out;
    for (Py_ssize_t i = 0; i < rows; i++) {
        PyObject *obj = cls->tp_alloc(cls, 0);
        if (obj == NULL) {
            Py_CLEAR(out);
            goto out;
        }
        for (Py_ssize_t j = 0; j < nf; j++) {
            PyObject **slot = (PyObject **)((char *)obj + offset[j]);
            Py_XSETREF(*slot, Py_NewRef(PySequence_Fast_GET_ITEM(seq[j], i)));
        }
        PyList_SET_ITEM(out, i, obj);
    }
out:
    for (Py_ssize_t j = 0; j < nf; j++) Py_XDECREF(seq[j]);
    return out;
}

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS,
     "make(cls, fields, columns) -> list\n\nOne `cls` per row with slot fields[j] = columns[j][row], as "
     "object.__new__ and the slots' setters make it (libra/workloads/trace.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slots_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__slots_native(void) { return PyModule_Create(&module); }
