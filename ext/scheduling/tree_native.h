/* What the parts of libra.scheduling._tree_native share: the bound Node class and its slots (tree_native.c), and
 * the functions the other parts add to the module (evict_native.c). */
#ifndef LIBRA_TREE_NATIVE_H
#define LIBRA_TREE_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* the slots of the bound Node class, as byte offsets into its instances (`bind`) */
extern PyTypeObject *node_type;
extern Py_ssize_t off_window, off_ordered, off_count, off_total, off_mean, off_p50, off_p90, off_prefix;
extern Py_ssize_t off_children, off_last_step;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* a plain int in [0, 2**53) (a count of tokens or observations, exact as a double): 0 with its value in *out, -1
 * with an exception, -2 (no exception) for anything else (NULL included): the caller's Python code decides then */
int tn_count(PyObject *x, long long *out);

/* `bisect_right(ordered, x)` over a list of counts (`tn_count`): 0 with the position in *out, or what `tn_count`
 * returned for an item it does not take */
int tn_bisect_counts(PyObject *ordered, long long x, Py_ssize_t *out);

/* a slot's byte offset in the instances of `type`: 0, or -1 with TypeError where `name` is not a slot */
int tn_slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out);

/* `dst += src[lo:hi]` of two lists: 0, or -1 on error */
int tn_extend_with(PyObject *dst, PyObject *src, Py_ssize_t lo, Py_ssize_t hi);

/* keep an evicted node (a reference the caller gives up) to be built again as a new leaf, where nothing else holds
 * it and there is room; else release it */
void tn_keep_spare(PyObject *node);

/* evict_native.c: `evict_from_index_py` (eviction.py) and `_distinct_prefixes` (tree.py) */
PyObject *tn_evict(PyObject *self, PyObject *args);
PyObject *tn_distinct_prefixes(PyObject *self, PyObject *paths);

/* replay_native.c: the simulator's C-MLFQ replay of a step (libra/sim/routing.py, `CausalRouting._replay`) */
PyObject *tn_replay(PyObject *self, PyObject *args);

/* priced_native.c: the priced rule's `on_tool_return` (libra/scheduling/priced.py, `PricedRule._priced_call`) */
PyObject *tn_bind_priced(PyObject *self, PyObject *args);
PyObject *tn_priced_call(PyObject *self, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames);

#endif
