/* The prefix tree's step-end refresh in C (libra.scheduling._tree_native): `refresh_all` of
 * libra/scheduling/node.py, with the same values, for the router's step-end update (issue 16 row 5b).
 *
 * The Python function is the reference and the fallback: node.py uses this module only when it imports, and
 * tests/scheduling/test_tree_native.py checks both give the same nodes (every slot, the lists element by element)
 * on random windows. Nothing here decides anything the Python code does not: it reads and writes the same slots of
 * `Node` (found by their member descriptors at `bind`), calls the same list operations (insertion after the last
 * equal element, `list.sort`, slice deletion) and computes the mean as Python's `int / int` and the quantiles as
 * `float(int)` (exactly, for every value: see `true_mean`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* the slots of the bound Node class, as byte offsets into its instances */
static PyTypeObject *node_type = NULL;
static Py_ssize_t off_window, off_ordered, off_count, off_total, off_mean, off_p50, off_p90, off_prefix;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL) return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return 0;
}

static PyObject *bind(PyObject *Py_UNUSED(self), PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the Node class");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)type;
    if (slot_offset(t, "window", &off_window) || slot_offset(t, "ordered", &off_ordered) ||
        slot_offset(t, "count", &off_count) || slot_offset(t, "total", &off_total) ||
        slot_offset(t, "mean", &off_mean) || slot_offset(t, "p50", &off_p50) || slot_offset(t, "p90", &off_p90) ||
        slot_offset(t, "prefix", &off_prefix))
        return NULL;
    Py_INCREF(type);
    Py_XSETREF(node_type, t);
    Py_RETURN_NONE;
}

/* replace a slot's value (steals `value`) */
static inline void set_slot(PyObject *obj, Py_ssize_t off, PyObject *value) {
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
}

/* a slot's value, borrowed; NULL with AttributeError if unset */
static inline PyObject *get_slot(PyObject *obj, Py_ssize_t off, const char *name) {
    PyObject *v = SLOT(obj, off);
    if (v == NULL) PyErr_Format(PyExc_AttributeError, "Node.%s is not set", name);
    return v;
}

/* `bisect.bisect_right(a, x)` / `bisect_left` over a list: -1 on error */
static Py_ssize_t bisect(PyObject *a, PyObject *x, int right) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(a);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        /* bisect_right: x < a[mid] goes left; bisect_left: a[mid] < x goes right */
        int lt = right ? PyObject_RichCompareBool(x, PyList_GET_ITEM(a, mid), Py_LT)
                       : PyObject_RichCompareBool(PyList_GET_ITEM(a, mid), x, Py_LT);
        if (lt < 0) return -1;
        if (right ? lt : !lt) hi = mid; else lo = mid + 1;
    }
    return lo;
}

/* `sum(ordered) / n` as Python computes it: `sum` of the ints, then `int / int`. Below 2**53 both are exact
 * doubles and CPython's true division is then one double division (its fast path); otherwise it is asked. */
static PyObject *true_mean(PyObject *ordered, Py_ssize_t n) {
    long long acc = 0;
    int exact = 1;
    const long long limit = 1LL << 53;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ordered); i++) {
        PyObject *x = PyList_GET_ITEM(ordered, i);
        int overflow = 0;
        long long v = PyLong_CheckExact(x) ? PyLong_AsLongLongAndOverflow(x, &overflow) : 0;
        if (!PyLong_CheckExact(x) || overflow || v <= -limit || v >= limit) { exact = 0; break; }
        acc += v;
        if (acc <= -limit || acc >= limit) { exact = 0; break; }
    }
    if (exact) return PyFloat_FromDouble((double)acc / (double)n);
    PyObject *builtins = PyEval_GetBuiltins(); /* borrowed */
    PyObject *sum_fn = PyDict_GetItemString(builtins, "sum");
    if (sum_fn == NULL) return NULL;
    PyObject *total = PyObject_CallOneArg(sum_fn, ordered);
    if (total == NULL) return NULL;
    PyObject *count = PyLong_FromSsize_t(n);
    if (count == NULL) { Py_DECREF(total); return NULL; }
    PyObject *mean = PyNumber_TrueDivide(total, count);
    Py_DECREF(total);
    Py_DECREF(count);
    return mean;
}

/* a sorted copy of a list (`sorted(w)`) */
static PyObject *sorted_copy(PyObject *w) {
    PyObject *out = PyList_GetSlice(w, 0, PyList_GET_SIZE(w));
    if (out == NULL) return NULL;
    if (PyList_Sort(out) < 0) { Py_DECREF(out); return NULL; }
    return out;
}

/* `float(ordered[table[n]])`: a quantile by its position in the sorted window (`_rank_positions`) */
static PyObject *quantile(PyObject *ordered, PyObject *table, Py_ssize_t n) {
    Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(table, n));
    if (at == -1 && PyErr_Occurred()) return NULL;
    if (at < 0 || at >= PyList_GET_SIZE(ordered)) {
        PyErr_SetString(PyExc_IndexError, "rank table position outside the window");
        return NULL;
    }
    return PyNumber_Float(PyList_GET_ITEM(ordered, at));
}

/* `dst += src[lo:hi]` */
static int extend_with(PyObject *dst, PyObject *src, Py_ssize_t lo, Py_ssize_t hi) {
    PyObject *part = PyList_GetSlice(src, lo, hi);
    if (part == NULL) return -1;
    Py_ssize_t end = PyList_GET_SIZE(dst);
    int rc = PyList_SetSlice(dst, end, end, part);
    Py_DECREF(part);
    return rc;
}

/* `node.ordered = sorted(w)`, and `*ordered` (a reference held by the caller) becomes it */
static int sort_anew(PyObject *node, PyObject *w, PyObject **ordered) {
    PyObject *fresh = sorted_copy(w);
    if (fresh == NULL) return -1;
    Py_INCREF(fresh);
    set_slot(node, off_ordered, fresh);
    Py_SETREF(*ordered, fresh);
    return 0;
}

static PyObject *refresh_all(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *nodes, *at50, *at90;
    Py_ssize_t limit, incremental;
    if (!PyArg_ParseTuple(args, "O!nO!O!n", &PyList_Type, &nodes, &limit, &PyTuple_Type, &at50, &PyTuple_Type,
                          &at90, &incremental))
        return NULL;
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() the Node class first");
        return NULL;
    }
    if (PyTuple_GET_SIZE(at50) <= limit || PyTuple_GET_SIZE(at90) <= limit) {
        PyErr_SetString(PyExc_ValueError, "rank tables shorter than the window");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(nodes); k++) {
        PyObject *node = PyList_GET_ITEM(nodes, k);
        if (Py_TYPE(node) != node_type) {
            PyErr_Format(PyExc_TypeError, "refresh_all takes Node objects, got %.100s", Py_TYPE(node)->tp_name);
            return NULL;
        }
        PyObject *w = get_slot(node, off_window, "window");
        PyObject *count_obj = get_slot(node, off_count, "count");
        PyObject *ordered = get_slot(node, off_ordered, "ordered");
        PyObject *total = get_slot(node, off_total, "total");
        if (w == NULL || count_obj == NULL || ordered == NULL || total == NULL) return NULL;
        if (!PyList_CheckExact(w) || !PyList_CheckExact(ordered)) {
            PyErr_SetString(PyExc_TypeError, "Node.window and Node.ordered must be lists");
            return NULL;
        }
        Py_ssize_t n = PyList_GET_SIZE(w);
        Py_ssize_t old = PyLong_AsSsize_t(count_obj);
        if (old == -1 && PyErr_Occurred()) return NULL;
        if (n == old) continue; /* built refreshed (`Node(first, step)`) and not observed again */
        PyObject *added = PyLong_FromSsize_t(n - old);
        if (added == NULL) return NULL;
        PyObject *new_total = PyNumber_Add(total, added);
        Py_DECREF(added);
        if (new_total == NULL) return NULL;
        set_slot(node, off_total, new_total);
        Py_INCREF(w);
        Py_INCREF(ordered); /* held while the slots may change */
        int failed = 0;
        if (n > limit) {
            Py_ssize_t drop = n - limit;
            if (drop < old && drop <= incremental) {
                for (Py_ssize_t i = 0; i < drop && !failed; i++) {
                    Py_ssize_t at = bisect(ordered, PyList_GET_ITEM(w, i), 0);
                    failed = at < 0 || PyList_SetSlice(ordered, at, at + 1, NULL) < 0;
                }
                failed = failed || extend_with(ordered, w, old, n) < 0 || PyList_Sort(ordered) < 0 ||
                         PyList_SetSlice(w, 0, drop, NULL) < 0;
            } else { /* (most or all of the old window left) */
                failed = PyList_SetSlice(w, 0, drop, NULL) < 0 || sort_anew(node, w, &ordered) < 0;
            }
            n = limit;
        } else if (old > 1) { /* (a window of one is its own sorted copy) */
            if (n - old == 1) { /* one insertion after the equal ones: `bisect.insort` */
                PyObject *x = PyList_GET_ITEM(w, old);
                Py_ssize_t at = bisect(ordered, x, 1);
                failed = at < 0 || PyList_Insert(ordered, at, x) < 0;
            } else {
                failed = extend_with(ordered, w, old, n) < 0 || PyList_Sort(ordered) < 0;
            }
        } else {
            failed = sort_anew(node, w, &ordered) < 0;
        }
        PyObject *count = failed ? NULL : PyLong_FromSsize_t(n);
        PyObject *mean = count == NULL ? NULL : true_mean(ordered, n);
        PyObject *p50 = mean == NULL ? NULL : quantile(ordered, at50, n);
        PyObject *p90 = p50 == NULL ? NULL : quantile(ordered, at90, n);
        Py_DECREF(w);
        Py_DECREF(ordered);
        if (p90 == NULL) {
            Py_XDECREF(count);
            Py_XDECREF(mean);
            Py_XDECREF(p50);
            return NULL;
        }
        set_slot(node, off_count, count);
        Py_INCREF(Py_None);
        set_slot(node, off_prefix, Py_None);
        set_slot(node, off_mean, mean);
        set_slot(node, off_p50, p50);
        set_slot(node, off_p90, p90);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(Node): the class whose slots refresh_all reads and writes."},
    {"refresh_all", refresh_all, METH_VARARGS,
     "refresh_all(nodes, limit, at50, at90, incremental): node.py's refresh_all, same values."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tree_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tree_native(void) { return PyModule_Create(&module); }
