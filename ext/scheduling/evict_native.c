/* `evict_from_index_py` (libra/scheduling/eviction.py) in C: the agnostic tree's eviction through the
 * index of its nodes by last update, for the router's step-end tree update (issue 16 row 5c).
 *
 * The same victims and the same index afterwards as the Python code: older updates' live entries go whole, and
 * the update where the cut falls is split in eviction order (fewest observations, then deepest, then the walk's
 * order, `_in_walk_order`) by a stable sort of the same integer ranks. Nothing is changed until the victims are
 * known; an entry this code does not take (a total that is not an int in [0, 2**40], a depth outside [1, 2**20])
 * makes it answer NotImplemented with nothing changed, and the Python code runs instead. */
#include "tree_native.h"

#define MAX_TOTAL (1LL << 40)
#define MAX_DEPTH (1LL << 20)

/* the value of an exact int in [lo, hi] (lo >= 0), or -1 (no exception) when `v` is not one */
static long long bounded(PyObject *v, long long lo, long long hi) {
    if (v == NULL || !PyLong_CheckExact(v)) return -1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) PyErr_Clear();
    return overflow || x < lo || x > hi ? -1 : x;
}

/* an index entry (node, owner, depth, path) as this code takes it: 1, or 0 when it does not */
static int plain_entry(PyObject *e) {
    return PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 4 && Py_TYPE(PyTuple_GET_ITEM(e, 0)) == node_type &&
           PyDict_CheckExact(PyTuple_GET_ITEM(e, 1)) && bounded(PyTuple_GET_ITEM(e, 2), 1, MAX_DEPTH) >= 0;
}

/* `[e for e in entries if e[0].last_step == step]`; NULL with an exception, or NULL and *odd = 1 (no exception)
 * for an entry `plain_entry` does not take */
static PyObject *live_entries(PyObject *entries, PyObject *step, int *odd) {
    if (!PyList_CheckExact(entries)) {
        *odd = 1;
        return NULL;
    }
    PyObject *live = PyList_New(0);
    for (Py_ssize_t i = 0; live != NULL && i < PyList_GET_SIZE(entries); i++) {
        PyObject *e = PyList_GET_ITEM(entries, i);
        if (!plain_entry(e)) {
            *odd = 1;
            Py_CLEAR(live);
            break;
        }
        PyObject *last = SLOT(PyTuple_GET_ITEM(e, 0), off_last_step);
        int eq = last == step ? 1 : last == NULL ? 0 : PyObject_RichCompareBool(last, step, Py_EQ);
        if (eq < 0 || (eq && PyList_Append(live, e) < 0)) Py_CLEAR(live);
    }
    return live;
}

typedef struct {
    long long rank;
    Py_ssize_t at;
} Ranked;

static int by_rank(const void *a, const void *b) {
    const Ranked *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at; /* (the position breaks ties: a stable sort, as `sorted`) */
}

/* `_in_walk_order(entries, children, level)`: a new reference, NULL on error */
static PyObject *in_walk_order(PyObject *entries, PyObject *children, Py_ssize_t level) {
    Py_INCREF(entries);
    Py_INCREF(children);
    PyObject *groups = NULL, *keys = NULL, *out = NULL;
    while (PyList_GET_SIZE(entries) > 1 &&
           level < PyLong_AsSsize_t(PyTuple_GET_ITEM(PyList_GET_ITEM(entries, 0), 2))) {
        groups = PyDict_New();
        if (groups == NULL) goto fail;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
            PyObject *e = PyList_GET_ITEM(entries, i);
            PyObject *code = PySequence_GetItem(PyTuple_GET_ITEM(e, 3), level);
            if (code == NULL) goto fail;
            PyObject *group = PyDict_GetItemWithError(groups, code);
            if (group == NULL) {
                group = PyErr_Occurred() ? NULL : PyList_New(0);
                if (group == NULL || PyDict_SetItem(groups, code, group) < 0) {
                    Py_XDECREF(group);
                    Py_DECREF(code);
                    goto fail;
                }
                Py_DECREF(group); /* (held by `groups`) */
            }
            Py_DECREF(code);
            if (PyList_Append(group, e) < 0) goto fail;
        }
        if (PyDict_GET_SIZE(groups) > 1) {
            out = PyList_New(0);
            keys = out == NULL ? NULL : PyDict_Keys(children);
            if (keys == NULL) goto fail;
            for (Py_ssize_t k = PyList_GET_SIZE(keys) - 1; k >= 0; k--) {
                PyObject *code = PyList_GET_ITEM(keys, k);
                PyObject *group = PyDict_GetItemWithError(groups, code);
                if (group == NULL) {
                    if (PyErr_Occurred()) goto fail;
                    continue;
                }
                PyObject *child = PyDict_GetItemWithError(children, code);
                if (child == NULL || Py_TYPE(child) != node_type || SLOT(child, off_children) == NULL) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "children must be Node objects");
                    goto fail;
                }
                PyObject *part = in_walk_order(group, SLOT(child, off_children), level + 1);
                Py_ssize_t end = PyList_GET_SIZE(out);
                int rc = part == NULL ? -1 : PyList_SetSlice(out, end, end, part);
                Py_XDECREF(part);
                if (rc < 0) goto fail;
            }
            Py_DECREF(keys);
            Py_DECREF(groups);
            Py_DECREF(entries);
            Py_DECREF(children);
            return out;
        }
        Py_CLEAR(groups);
        PyObject *code = PySequence_GetItem(PyTuple_GET_ITEM(PyList_GET_ITEM(entries, 0), 3), level);
        if (code == NULL) goto fail;
        PyObject *child = PyObject_GetItem(children, code); /* (a KeyError as `children[code]`) */
        Py_DECREF(code);
        if (child == NULL) goto fail;
        if (Py_TYPE(child) != node_type || SLOT(child, off_children) == NULL) {
            Py_DECREF(child);
            PyErr_SetString(PyExc_TypeError, "children must be Node objects");
            goto fail;
        }
        Py_INCREF(SLOT(child, off_children));
        Py_SETREF(children, SLOT(child, off_children));
        Py_DECREF(child);
        level += 1;
    }
    if (PyErr_Occurred()) goto fail;
    Py_DECREF(children);
    return entries;
fail:
    Py_XDECREF(groups);
    Py_XDECREF(keys);
    Py_XDECREF(out);
    Py_DECREF(entries);
    Py_DECREF(children);
    return NULL;
}

/* `dst += [src[order[j].at] for j in range(lo, hi)]` */
static int extend_ranked(PyObject *dst, PyObject *src, const Ranked *order, Py_ssize_t lo, Py_ssize_t hi) {
    for (Py_ssize_t j = lo; j < hi; j++)
        if (PyList_Append(dst, PyList_GET_ITEM(src, order[j].at)) < 0) return -1;
    return 0;
}

/* `_split_in_eviction_order(live, count, root)`: *first and *rest new lists; 1, 0 when a total is not an int this
 * code takes (no exception), -1 on error */
static int split(PyObject *live, Py_ssize_t count, PyObject *root_children, PyObject **first, PyObject **rest) {
    Py_ssize_t n = PyList_GET_SIZE(live);
    if (count <= 0 || count >= n) {
        PyErr_SetString(PyExc_SystemError, "split: the cut must fall inside the update's entries");
        return -1;
    }
    long long span = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long depth = PyLong_AsLongLong(PyTuple_GET_ITEM(PyList_GET_ITEM(live, i), 2));
        if (depth + 1 > span) span = depth + 1;
    }
    Ranked *order = PyMem_New(Ranked, n);
    if (order == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(live, i);
        long long total = bounded(SLOT(PyTuple_GET_ITEM(e, 0), off_total), 0, MAX_TOTAL);
        if (total < 0) {
            PyMem_Free(order);
            return 0;
        }
        order[i].rank = total * span - PyLong_AsLongLong(PyTuple_GET_ITEM(e, 2)); /* (observations, -depth) */
        order[i].at = i;
    }
    qsort(order, (size_t)n, sizeof(Ranked), by_rank);
    long long cut = order[count - 1].rank;
    Py_ssize_t lo = count - 1, hi = count;
    while (lo > 0 && order[lo - 1].rank == cut) lo--;
    while (hi < n && order[hi].rank == cut) hi++;
    PyObject *tied = PyList_New(0), *walked = NULL;
    *first = PyList_New(0);
    *rest = PyList_New(0);
    Py_ssize_t head = count - lo; /* the tied entries that go */
    int ok = tied != NULL && *first != NULL && *rest != NULL && extend_ranked(tied, live, order, lo, hi) == 0 &&
             (walked = in_walk_order(tied, root_children, 0)) != NULL &&
             extend_ranked(*first, live, order, 0, lo) == 0 && tn_extend_with(*first, walked, 0, head) == 0 &&
             tn_extend_with(*rest, walked, head, PyList_GET_SIZE(walked)) == 0 &&
             extend_ranked(*rest, live, order, hi, n) == 0;
    Py_XDECREF(tied);
    Py_XDECREF(walked);
    PyMem_Free(order);
    if (!ok) {
        Py_CLEAR(*first);
        Py_CLEAR(*rest);
        return -1;
    }
    return 1;
}

/* `owner.pop(path[depth - 1], None)` of every victim */
static int pop_victims(PyObject *victims) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(victims); i++) {
        PyObject *e = PyList_GET_ITEM(victims, i);
        PyObject *key = PySequence_GetItem(PyTuple_GET_ITEM(e, 3), PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 2)) - 1);
        if (key == NULL) return -1;
        int rc = PyDict_DelItem(PyTuple_GET_ITEM(e, 1), key);
        Py_DECREF(key);
        if (rc < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
            PyErr_Clear();
        }
    }
    return 0;
}

/* evict(index, excess, root_children) -> the number of victims: `evict_from_index_py`'s loop over the index and its
 * pops (the caller counts them and the index's entries), or NotImplemented with nothing changed */
PyObject *tn_evict(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *index, *root_children;
    Py_ssize_t excess;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyDict_Type, &index, &excess, &PyDict_Type, &root_children)) return NULL;
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() the Node class first");
        return NULL;
    }
    if (excess <= 0) Py_RETURN_NOTIMPLEMENTED;
    PyObject *steps = PyDict_Keys(index), *victims = NULL, *done = NULL, *cut = NULL, *rest = NULL;
    int odd = 0;
    if (steps == NULL || PyList_Sort(steps) < 0) goto fail;
    victims = PyList_New(0);
    done = victims == NULL ? NULL : PyList_New(0); /* the steps whose live entries all go */
    if (done == NULL) goto fail;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(steps); k++) {
        PyObject *step = PyList_GET_ITEM(steps, k);
        PyObject *entries = PyDict_GetItemWithError(index, step);
        if (entries == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, step);
            goto fail;
        }
        PyObject *live = live_entries(entries, step, &odd);
        if (live == NULL) goto fail;
        Py_ssize_t need = excess - PyList_GET_SIZE(victims), size = PyList_GET_SIZE(live);
        if (size <= need) {
            int rc = tn_extend_with(victims, live, 0, size) < 0 || PyList_Append(done, step) < 0 ? -1 : 0;
            Py_DECREF(live);
            if (rc < 0) goto fail;
            if (size == need) break;
            continue;
        }
        PyObject *chosen = NULL;
        int rc = split(live, need, root_children, &chosen, &rest);
        Py_DECREF(live);
        if (rc <= 0) {
            odd = rc == 0;
            goto fail;
        }
        rc = tn_extend_with(victims, chosen, 0, PyList_GET_SIZE(chosen));
        Py_DECREF(chosen);
        if (rc < 0) goto fail;
        cut = step;
        break;
    }
    /* nothing was changed before this line */
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(done); k++)
        if (PyDict_DelItem(index, PyList_GET_ITEM(done, k)) < 0) goto fail;
    if (cut != NULL && PyDict_SetItem(index, cut, rest) < 0) goto fail;
    if (pop_victims(victims) < 0) goto fail;
    Py_ssize_t evicted = PyList_GET_SIZE(victims);
    /* the victims' nodes, held here while their entries go; those nothing else holds then are kept as spares */
    PyObject **nodes = PyMem_New(PyObject *, evicted > 0 ? evicted : 1);
    if (nodes == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < evicted; i++) {
        nodes[i] = PyTuple_GET_ITEM(PyList_GET_ITEM(victims, i), 0);
        Py_INCREF(nodes[i]);
    }
    Py_DECREF(steps);
    Py_DECREF(victims);
    for (Py_ssize_t i = 0; i < evicted; i++) tn_keep_spare(nodes[i]);
    PyMem_Free(nodes);
    Py_DECREF(done);
    Py_XDECREF(rest);
    return PyLong_FromSsize_t(evicted);
fail:
    Py_XDECREF(steps);
    Py_XDECREF(victims);
    Py_XDECREF(done);
    Py_XDECREF(rest);
    if (odd && !PyErr_Occurred()) Py_RETURN_NOTIMPLEMENTED;
    return NULL;
}

/* distinct_prefixes(paths) -> int: tree.py's `_distinct_prefixes`, the nodes of a tree made from nothing by these
 * paths (its root included): sorted as `sorted` sorts them, each path adds the codes past its common prefix with
 * the one before it. Codes are compared as Python compares them. */
PyObject *tn_distinct_prefixes(PyObject *Py_UNUSED(self), PyObject *paths) {
    PyObject *sorted = PySequence_List(paths);
    if (sorted == NULL) return NULL;
    if (PyList_Sort(sorted) < 0) goto fail;
    Py_ssize_t n = PyList_GET_SIZE(sorted), count = 1;
    PyObject *before = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *path = PySequence_Fast(PyList_GET_ITEM(sorted, i), "a path must be a sequence");
        if (path == NULL) goto fail;
        Py_ssize_t len = PySequence_Fast_GET_SIZE(path), shared = 0;
        if (before != NULL) {
            Py_ssize_t common = PySequence_Fast_GET_SIZE(before) < len ? PySequence_Fast_GET_SIZE(before) : len;
            for (; shared < common; shared++) {
                PyObject *a = PySequence_Fast_GET_ITEM(before, shared), *b = PySequence_Fast_GET_ITEM(path, shared);
                int ne = a == b ? 0 : PyObject_RichCompareBool(a, b, Py_NE);
                if (ne < 0) {
                    Py_DECREF(path);
                    Py_DECREF(before);
                    goto fail;
                }
                if (ne) break;
            }
        }
        count += len - shared;
        Py_XSETREF(before, path);
    }
    Py_XDECREF(before);
    Py_DECREF(sorted);
    if (n == 0) {
        PyErr_SetString(PyExc_IndexError, "no paths"); /* (as `paths[0]` of an empty list) */
        return NULL;
    }
    return PyLong_FromSsize_t(count);
fail:
    Py_DECREF(sorted);
    return NULL;
}
