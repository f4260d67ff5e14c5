/* The prefix tree's step-end update in C (libra.scheduling._tree_native): `refresh_all` of
 * libra/scheduling/node.py and `PrefixTree._learn` / `_learn_agnostic` of tree.py, with the same values, for the
 * router's step-end update (issue 16 rows 5b and 5c); the eviction and the count of new prompt trees' nodes are in
 * evict_native.c.
 *
 * The Python functions are the reference and the fallback: they run when this module does not import, and
 * tests/scheduling/test_tree_native.py checks both give the same nodes (every slot, the lists element by element)
 * on random windows and the same whole trees after updates. Nothing here decides anything the Python code does
 * not: it reads and writes the same slots of `Node` (found by their member descriptors at `bind`), calls the same
 * list and dict operations (insertion after the last equal element, `list.sort`, slice deletion) and computes the
 * mean as Python's `int / int` and the quantiles as `float(int)` (exactly, for every value: see `true_mean`).
 */
#include "tree_native.h"
#include <structmember.h>

/* the slots of the bound Node class, as byte offsets into its instances */
PyTypeObject *node_type = NULL;
Py_ssize_t off_window, off_ordered, off_count, off_total, off_mean, off_p50, off_p90, off_prefix;
Py_ssize_t off_children, off_last_step;
/* attribute names read from trajectories and turns */
static PyObject *s_prompt_id, *s_turns, *s_gen_tokens, *s_tool_tokens;

int tn_count(PyObject *x, long long *out) {
    if (x == NULL || !PyLong_CheckExact(x)) return -2;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 0 || v >= (1LL << 53)) return -2;
    *out = v;
    return 0;
}

int tn_bisect_counts(PyObject *ordered, long long x, Py_ssize_t *out) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(ordered);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        long long v;
        int rc = tn_count(PyList_GET_ITEM(ordered, mid), &v);
        if (rc) return rc;
        if (x < v) hi = mid;
        else lo = mid + 1;
    }
    *out = lo;
    return 0;
}

int tn_slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out) {
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
    if (tn_slot_offset(t, "window", &off_window) || tn_slot_offset(t, "ordered", &off_ordered) ||
        tn_slot_offset(t, "count", &off_count) || tn_slot_offset(t, "total", &off_total) ||
        tn_slot_offset(t, "mean", &off_mean) || tn_slot_offset(t, "p50", &off_p50) || tn_slot_offset(t, "p90", &off_p90) ||
        tn_slot_offset(t, "prefix", &off_prefix) || tn_slot_offset(t, "children", &off_children) ||
        tn_slot_offset(t, "last_step", &off_last_step))
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
        if (!PyLong_CheckExact(x)) { exact = 0; break; }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow || v <= -limit || v >= limit) { exact = 0; break; }
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
int tn_extend_with(PyObject *dst, PyObject *src, Py_ssize_t lo, Py_ssize_t hi) {
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
                    if (at == PyList_GET_SIZE(ordered)) { /* (a value above them all, or NaN: `del ordered[at]`) */
                        PyErr_SetString(PyExc_IndexError, "list assignment index out of range");
                        at = -1;
                    }
                    failed = at < 0 || PyList_SetSlice(ordered, at, at + 1, NULL) < 0;
                }
                failed = failed || tn_extend_with(ordered, w, old, n) < 0 || PyList_Sort(ordered) < 0 ||
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
                failed = tn_extend_with(ordered, w, old, n) < 0 || PyList_Sort(ordered) < 0;
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

/* ---- learning: `PrefixTree._learn` (tree.py) ---------------------------------------------------------------- */

/* `turn.gen_tokens + turn.tool_tokens` as a C integer; -1 with an exception unless both are ints in [0, 2**40] (the
 * trace schema's bound is far below; anything else goes back to the Python code, see `learn`) */
static long long turn_tokens(PyObject *turn) {
    long long sum = 0;
    PyObject *names[2] = {s_gen_tokens, s_tool_tokens};
    for (int i = 0; i < 2; i++) {
        PyObject *v = PyObject_GetAttr(turn, names[i]);
        if (v == NULL) return -1;
        int overflow = 0;
        long long x = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : -1;
        Py_DECREF(v);
        if (x == -1 && PyErr_Occurred()) return -1;
        if (x < 0 || x > (1LL << 40) || overflow) {
            PyErr_SetString(PyExc_TypeError, "token counts must be ints in [0, 2**40]");
            return -1;
        }
        sum += x;
    }
    return sum;
}

/* Spare nodes: evicted nodes that nothing else held (`tn_keep_spare`, called by evict_native.c once a victim's
 * entry is gone), kept to be built again as the next update's new leaves (`new_leaf`). A full tree's update makes
 * tens of thousands of leaves and evicts as many made a few updates before; a node built again in the memory of one
 * that left skips its deallocation (the collector's unlinking, its dict, window list and item array freed) and the
 * allocation of the new one. Bounded; per process, shared by every tree (GIL-held). */
#define SPARE_MAX 65536
static PyObject *spare[SPARE_MAX];
static Py_ssize_t n_spare = 0;

void tn_keep_spare(PyObject *node) {
    if (n_spare < SPARE_MAX && node_type != NULL && Py_TYPE(node) == node_type && Py_REFCNT(node) == 1)
        spare[n_spare++] = node;
    else
        Py_DECREF(node);
}

/* spare() -> the number of spare nodes held; drop_spare() frees them */
static PyObject *spare_count(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
    return PyLong_FromSsize_t(n_spare);
}

static PyObject *drop_spare(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
    while (n_spare > 0) Py_DECREF(spare[--n_spare]);
    Py_RETURN_NONE;
}

/* `leaf(first, step)` of node.py: a node that recorded one observation at update `step`, already refreshed. Built
 * in a spare node where there is one (its children dict and window list reused where nothing else holds them),
 * else in a new node (whose slots are all NULL: each gets a new object); NULL on error */
static PyObject *new_leaf(PyObject *first, PyObject *step) {
    PyObject *node = n_spare > 0 ? spare[--n_spare] : node_type->tp_alloc(node_type, 0);
    if (node == NULL) return NULL;
    PyObject *value = PyNumber_Float(first);
    if (value == NULL) goto fail;
    PyObject *children = SLOT(node, off_children);
    if (children != NULL && PyDict_CheckExact(children) && Py_REFCNT(children) == 1) {
        PyDict_Clear(children); /* (nothing to do for a dict that never held a key) */
    } else {
        PyObject *fresh = PyDict_New();
        if (fresh == NULL) goto fail;
        set_slot(node, off_children, fresh);
    }
    PyObject *window = SLOT(node, off_window), *ordered = SLOT(node, off_ordered);
    Py_ssize_t holders = 1 + (ordered == window);
    if (window != NULL && PyList_CheckExact(window) && Py_REFCNT(window) == holders && Py_SIZE(window) >= 1 &&
        ((PyListObject *)window)->allocated <= 8) {
        PyObject **items = ((PyListObject *)window)->ob_item;
        Py_ssize_t n = Py_SIZE(window);
        PyObject *old = items[0];
        Py_INCREF(first);
        items[0] = first;
        Py_SET_SIZE(window, 1);
        for (Py_ssize_t i = 1; i < n; i++) Py_DECREF(items[i]);
        Py_DECREF(old);
        Py_INCREF(window);
    } else {
        window = PyList_New(1);
        if (window == NULL) goto fail;
        Py_INCREF(first);
        PyList_SET_ITEM(window, 0, first);
        Py_INCREF(window);
        set_slot(node, off_window, window);
    }
    set_slot(node, off_ordered, window); /* (a window of one is its own sorted copy) */
    Py_INCREF(step);
    set_slot(node, off_last_step, step);
    set_slot(node, off_total, PyLong_FromLong(1));
    set_slot(node, off_count, PyLong_FromLong(1));
    Py_INCREF(value);
    Py_INCREF(value);
    set_slot(node, off_mean, value);
    set_slot(node, off_p50, value);
    set_slot(node, off_p90, value);
    Py_INCREF(Py_None);
    set_slot(node, off_prefix, Py_None);
    return node;
fail:
    Py_XDECREF(value);
    Py_DECREF(node);
    return NULL;
}

/* a node the update reaches: marked with `step` and listed in `touched` the first time (returns 1 then, 0 if it
 * was marked already), and the observation appended to its window; -1 on error */
static int observe(PyObject *node, PyObject *step, PyObject *touched, PyObject *value) {
    PyObject *last = SLOT(node, off_last_step);
    int first_touch = 0;
    if (last != step) {
        int ne = last == NULL ? 1 : PyObject_RichCompareBool(last, step, Py_NE);
        if (ne < 0) return -1;
        if (ne) {
            Py_INCREF(step);
            set_slot(node, off_last_step, step);
            if (PyList_Append(touched, node) < 0) return -1;
            first_touch = 1;
        }
    }
    PyObject *window = SLOT(node, off_window);
    if (window == NULL || !PyList_CheckExact(window)) {
        PyErr_SetString(PyExc_TypeError, "Node.window must be a list");
        return -1;
    }
    return PyList_Append(window, value) < 0 ? -1 : first_touch;
}

/* the node's child for `code`, made as a leaf when missing (*made = 1); a new reference, NULL on error */
static PyObject *child_of(PyObject *node, PyObject *code, PyObject *value, PyObject *step, int *made) {
    PyObject *owner = SLOT(node, off_children);
    if (owner == NULL || !PyDict_CheckExact(owner)) {
        PyErr_SetString(PyExc_TypeError, "Node.children must be a dict");
        return NULL;
    }
    PyObject *child = PyDict_GetItemWithError(owner, code);
    if (child != NULL) {
        *made = 0;
        Py_INCREF(child);
        return child;
    }
    if (PyErr_Occurred()) return NULL;
    child = new_leaf(value, step);
    if (child == NULL || PyDict_SetItem(owner, code, child) < 0) {
        Py_XDECREF(child);
        return NULL;
    }
    *made = 1;
    return child;
}

/* a batch's token counts, read and checked before anything is written: turn k of trajectory i holds
 * tokens[start[i] + k] (generated plus tool tokens); start[size] is the batch's number of turns */
typedef struct {
    long long *tokens;
    Py_ssize_t *start;
} Counts;

static void counts_free(Counts *c) {
    PyMem_Free(c->tokens);
    PyMem_Free(c->start);
}

/* 0, or -1 with an exception (a TypeError when a count is not an int in [0, 2**40]) */
static int read_counts(PyObject *batch, Counts *c) {
    Py_ssize_t size = PyList_GET_SIZE(batch), capacity = 4 * size + 16, used = 0;
    c->tokens = PyMem_New(long long, capacity);
    c->start = PyMem_New(Py_ssize_t, size + 1);
    if (c->tokens == NULL || c->start == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        c->start[i] = used;
        PyObject *turns = PyObject_GetAttr(PyList_GET_ITEM(batch, i), s_turns);
        PyObject *seq = turns == NULL ? NULL : PySequence_Fast(turns, "Trajectory.turns must be a sequence");
        Py_XDECREF(turns);
        if (seq == NULL) goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (used + n > capacity) {
            capacity = 2 * (used + n);
            long long *more = PyMem_Resize(c->tokens, long long, capacity);
            if (more == NULL) {
                Py_DECREF(seq);
                PyErr_NoMemory();
                goto fail;
            }
            c->tokens = more;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            long long t = turn_tokens(PySequence_Fast_GET_ITEM(seq, k));
            if (t < 0) {
                Py_DECREF(seq);
                goto fail;
            }
            c->tokens[used++] = t;
        }
        Py_DECREF(seq);
    }
    c->start[size] = used;
    return 0;
fail:
    counts_free(c);
    c->tokens = NULL;
    c->start = NULL;
    return -1;
}

/* a trajectory's tokens in all: the remaining tokens at its prompt root */
static long long total_of(const long long *tokens, Py_ssize_t n) {
    long long total = 0;
    for (Py_ssize_t k = 0; k < n; k++) total += tokens[k];
    return total;
}

/* `entries.append((node, owner, depth, path))`: eviction's index entry (the dict holding the node, its depth) */
static int add_entry(PyObject *entries, PyObject *node, PyObject *owner, Py_ssize_t depth, PyObject *path) {
    PyObject *entry = Py_BuildValue("(OOnO)", node, owner, depth, path);
    if (entry == NULL) return -1;
    int rc = PyList_Append(entries, entry);
    Py_DECREF(entry);
    return rc;
}

/* one step down the agnostic tree: *node becomes its child for `code` (made as a leaf when missing), observed,
 * and recorded in eviction's index the first time the update reaches it; returns 1 if made, 0 if not, -1 on error */
static int agnostic_step(PyObject **node, PyObject *code, PyObject *value, PyObject *step, PyObject *touched,
                         PyObject *entries, Py_ssize_t depth, PyObject *path) {
    PyObject *owner = SLOT(*node, off_children);
    int made;
    PyObject *next = child_of(*node, code, value, step, &made);
    if (next == NULL) return -1;
    Py_SETREF(*node, next);
    int record = made;
    if (made) {
        if (PyList_Append(touched, next) < 0) return -1;
    } else {
        record = observe(next, step, touched, value);
        if (record < 0) return -1;
    }
    if (record && add_entry(entries, next, owner, depth, path) < 0) return -1;
    return made;
}

/* one trajectory into both trees; returns the nodes created, -1 on error */
static Py_ssize_t learn_one(PyObject *traj, PyObject *path, const long long *tokens, Py_ssize_t n_turns,
                            PyObject *step, PyObject *touched, PyObject *entries, PyObject *agnostic, PyObject *prompts,
                            PyObject *sizes) {
    Py_ssize_t created = 0, grown = 0;
    PyObject *pid = NULL, *codes = NULL, *value = NULL, *p_node = NULL, *a_node = NULL;
    long long remaining = total_of(tokens, n_turns);
    pid = PyObject_GetAttr(traj, s_prompt_id);
    codes = pid == NULL ? NULL : PySequence_Fast(path, "a path must be a sequence");
    value = codes == NULL ? NULL : PyLong_FromLongLong(remaining);
    if (value == NULL) goto fail;
    p_node = PyDict_GetItemWithError(prompts, pid);
    if (p_node != NULL) {
        Py_INCREF(p_node);
        if (Py_TYPE(p_node) != node_type) {
            PyErr_SetString(PyExc_TypeError, "prompt roots must be Node objects");
            goto fail;
        }
        if (observe(p_node, step, touched, value) < 0) goto fail;
    } else {
        if (PyErr_Occurred()) goto fail;
        p_node = new_leaf(value, step);
        PyObject *one = PyLong_FromLong(1);
        int bad = p_node == NULL || one == NULL || PyDict_SetItem(prompts, pid, p_node) < 0 ||
                  PyList_Append(touched, p_node) < 0 || PyDict_SetItem(sizes, pid, one) < 0;
        Py_XDECREF(one);
        if (bad) goto fail;
        created += 1;
    }
    a_node = agnostic;
    Py_INCREF(a_node);
    if (observe(a_node, step, touched, value) < 0) goto fail;
    Py_ssize_t n_codes = PySequence_Fast_GET_SIZE(codes);
    if (n_codes > n_turns) {
        PyErr_SetString(PyExc_ValueError, "a path holds more codes than its trajectory has turns");
        goto fail;
    }
    for (Py_ssize_t depth = 0; depth < n_codes; depth++) {
        PyObject *code = PySequence_Fast_GET_ITEM(codes, depth);
        remaining -= tokens[depth];
        Py_SETREF(value, PyLong_FromLongLong(remaining));
        if (value == NULL) goto fail;
        int made;
        PyObject *next = child_of(p_node, code, value, step, &made);
        if (next == NULL) goto fail;
        Py_SETREF(p_node, next);
        if (made) {
            if (PyList_Append(touched, p_node) < 0) goto fail;
            grown += 1;
        } else if (observe(p_node, step, touched, value) < 0) {
            goto fail;
        }
        made = agnostic_step(&a_node, code, value, step, touched, entries, depth + 1, path);
        if (made < 0) goto fail;
        created += made;
    }
    if (grown) {
        PyObject *size = PyDict_GetItemWithError(sizes, pid);
        if (size == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, pid);
            goto fail;
        }
        PyObject *more = PyLong_FromSsize_t(grown);
        PyObject *sum = more == NULL ? NULL : PyNumber_Add(size, more);
        Py_XDECREF(more);
        if (sum == NULL || PyDict_SetItem(sizes, pid, sum) < 0) {
            Py_XDECREF(sum);
            goto fail;
        }
        Py_DECREF(sum);
        created += grown;
    }
    Py_DECREF(pid);
    Py_DECREF(codes);
    Py_DECREF(value);
    Py_DECREF(p_node);
    Py_DECREF(a_node);
    return created;
fail:
    Py_XDECREF(pid);
    Py_XDECREF(codes);
    Py_XDECREF(value);
    Py_XDECREF(p_node);
    Py_XDECREF(a_node);
    return -1;
}

/* what both learners check first: a bound Node class, a Node as the agnostic root, one path per trajectory, and
 * every token count (`read_counts`, before the trees are touched). 1 when ready; 0 when a count does not fit (no
 * exception: the caller answers NotImplemented and the batch goes back to the Python code whole); -1 on error */
static int begin_learning(PyObject *batch, PyObject *paths, PyObject *agnostic, Counts *counts) {
    if (node_type == NULL || Py_TYPE(agnostic) != node_type) {
        PyErr_SetString(PyExc_TypeError, "learning needs bind(Node) and a Node as the agnostic root");
        return -1;
    }
    if (PyList_GET_SIZE(paths) != PyList_GET_SIZE(batch)) {
        PyErr_SetString(PyExc_ValueError, "one path per trajectory");
        return -1;
    }
    if (read_counts(batch, counts) == 0) return 1;
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
    PyErr_Clear();
    return 0;
}

/* one trajectory into the agnostic tree; returns the nodes created, -1 on error */
static Py_ssize_t learn_agnostic_one(PyObject *path, const long long *tokens, Py_ssize_t n_turns, PyObject *step,
                                     PyObject *touched, PyObject *entries, PyObject *agnostic) {
    Py_ssize_t created = 0;
    long long remaining = total_of(tokens, n_turns);
    PyObject *codes = PySequence_Fast(path, "a path must be a sequence");
    PyObject *value = codes == NULL ? NULL : PyLong_FromLongLong(remaining);
    PyObject *node = agnostic;
    Py_INCREF(node);
    if (value == NULL || observe(node, step, touched, value) < 0) goto fail;
    Py_ssize_t n_codes = PySequence_Fast_GET_SIZE(codes);
    if (n_codes > n_turns) {
        PyErr_SetString(PyExc_ValueError, "a path holds more codes than its trajectory has turns");
        goto fail;
    }
    for (Py_ssize_t depth = 0; depth < n_codes; depth++) {
        remaining -= tokens[depth];
        Py_SETREF(value, PyLong_FromLongLong(remaining));
        if (value == NULL) goto fail;
        int made = agnostic_step(&node, PySequence_Fast_GET_ITEM(codes, depth), value, step, touched, entries,
                                 depth + 1, path);
        if (made < 0) goto fail;
        created += made;
    }
    Py_DECREF(codes);
    Py_DECREF(value);
    Py_DECREF(node);
    return created;
fail:
    Py_XDECREF(codes);
    Py_XDECREF(value);
    Py_DECREF(node);
    return -1;
}

/* both learners' batch: every trajectory into both trees (`learn_one`), or into the agnostic tree only when
 * `prompts` is NULL (`learn_agnostic_one`); the nodes created, NotImplemented (`begin_learning`), or NULL on error */
static PyObject *learn_batch(PyObject *batch, PyObject *paths, PyObject *step, PyObject *touched, PyObject *entries,
                             PyObject *agnostic, PyObject *prompts, PyObject *sizes) {
    Counts c;
    int ready = begin_learning(batch, paths, agnostic, &c);
    if (ready <= 0) {
        if (ready == 0) Py_RETURN_NOTIMPLEMENTED;
        return NULL;
    }
    Py_ssize_t created = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        const long long *tokens = c.tokens + c.start[i];
        Py_ssize_t n_turns = c.start[i + 1] - c.start[i];
        PyObject *path = PyList_GET_ITEM(paths, i);
        Py_ssize_t made =
            prompts == NULL
                ? learn_agnostic_one(path, tokens, n_turns, step, touched, entries, agnostic)
                : learn_one(PyList_GET_ITEM(batch, i), path, tokens, n_turns, step, touched, entries, agnostic,
                            prompts, sizes);
        if (made < 0) {
            counts_free(&c);
            return NULL;
        }
        created += made;
    }
    counts_free(&c);
    return PyLong_FromSsize_t(created);
}

static PyObject *learn(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *batch, *paths, *step, *touched, *entries, *agnostic, *prompts, *sizes;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!OO!O!", &PyList_Type, &batch, &PyList_Type, &paths, &step, &PyList_Type,
                          &touched, &PyList_Type, &entries, &agnostic, &PyDict_Type, &prompts, &PyDict_Type, &sizes))
        return NULL;
    return learn_batch(batch, paths, step, touched, entries, agnostic, prompts, sizes);
}

static PyObject *learn_agnostic(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *batch, *paths, *step, *touched, *entries, *agnostic;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!O", &PyList_Type, &batch, &PyList_Type, &paths, &step, &PyList_Type,
                          &touched, &PyList_Type, &entries, &agnostic))
        return NULL;
    return learn_batch(batch, paths, step, touched, entries, agnostic, NULL, NULL);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(Node): the class whose slots the functions below read and write."},
    {"refresh_all", refresh_all, METH_VARARGS,
     "refresh_all(nodes, limit, at50, at90, incremental): node.py's refresh_all, same values."},
    {"learn", learn, METH_VARARGS,
     "learn(batch, paths, step, touched, entries, agnostic, prompts, sizes): tree.py's PrefixTree._learn, the same "
     "trees; NotImplemented (nothing written) when a token count is not an int in [0, 2**40]."},
    {"learn_agnostic", learn_agnostic, METH_VARARGS,
     "learn_agnostic(batch, paths, step, touched, entries, agnostic): tree.py's PrefixTree._learn_agnostic, the "
     "nodes created; NotImplemented as learn."},
    {"evict", tn_evict, METH_VARARGS,
     "evict(index, excess, root_children): eviction.py's evict_from_index_py, the same victims and index; returns "
     "their number, or NotImplemented (nothing changed) for an entry it does not take."},
    {"replay", tn_replay, METH_VARARGS,
     "replay(trajectories, agnostic, prompts, codec, statuses, limits, min_count, agnostic_fallback, overflow, "
     "predicted, cost_ratio, nseg, gen_ctx, tool_ctx, tool_end, turn_of, bucket, carried): the simulator's replay of "
     "a step through a published-rule CMLFQRouter (libra/sim/routing.py), the same buckets and carried tokens; "
     "NotImplemented where the router's own code must decide."},
    {"bind_priced", tn_bind_priced, METH_VARARGS,
     "bind_priced(Walk, Request, RouteDecision, StateCodec, QuantileStateCodec, statuses, majority): the classes and "
     "values _priced_native reads (after bind(Node))."},
    {"_priced_native", (PyCFunction)(void (*)(void))tn_priced_call, METH_FASTCALL | METH_KEYWORDS,
     "_priced_native(router, request_id, *, tool, tool_tokens, status, context_tokens): priced.py's _priced_call on "
     "its inline path, the same decisions and writes; the router's on_tool_return, bound to it."},
    {"spare", spare_count, METH_NOARGS, "spare(): the number of evicted nodes kept to be built again as new leaves."},
    {"drop_spare", drop_spare, METH_NOARGS, "drop_spare(): free the spare nodes."},
    {"distinct_prefixes", tn_distinct_prefixes, METH_O,
     "distinct_prefixes(paths): tree.py's _distinct_prefixes, the nodes of a tree made from nothing by the paths."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tree_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__tree_native(void) {
    s_prompt_id = PyUnicode_InternFromString("prompt_id");
    s_turns = PyUnicode_InternFromString("turns");
    s_gen_tokens = PyUnicode_InternFromString("gen_tokens");
    s_tool_tokens = PyUnicode_InternFromString("tool_tokens");
    if (!s_prompt_id || !s_turns || !s_gen_tokens || !s_tool_tokens) return NULL;
    return PyModule_Create(&module);
}
