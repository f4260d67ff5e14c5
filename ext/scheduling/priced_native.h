/* What the two parts of the priced rule's `on_tool_return` in C share: priced_native.c (the entry point, the
 * arguments, the walk, the writes) and priced_shares.c (the bucket shares and the rule's decision). */
#ifndef LIBRA_PRICED_NATIVE_H
#define LIBRA_PRICED_NATIVE_H
#include "tree_native.h"

enum { OK = 0, ERR = -1, DECLINE = -2 };
#define MAXB 64 /* buckets the C path takes (more: `_priced_call`) */

/* bound by `bind_priced` (priced_native.c): the walk's slots the shares read, the majority exit's threshold, the
   reasons of a move */
extern Py_ssize_t w_root_ctx, w_admitted, w_price, w_ups, w_ups_of, w_ups_total, w_mean;
extern double majority;
extern PyObject *s_tool_return, *s_overflow_reason;

enum { STAY, MOVE };

/* what the first phase decided, for the second to write */
typedef struct {
    int p_leaves, a_leaves; /* the walk leaves its tree */
    PyObject *p_child, *a_child; /* or goes down to this node (borrowed) */
    int pop_point;              /* the points end in a None, taken off */
    PyObject *points[2];        /* decision points to add (owned) */
    int npoints;
    PyObject *record; /* the fit's record (owned) */
    int outcome;
    Py_ssize_t target;
    long long carried;
    PyObject *reason;
} Plan;

/* what the first phase read before the shares: the call's request, walk and tree, and the router's options */
typedef struct {
    PyObject *dict, *req, *walk, *tree, *codec, *root, *fit, *points, *calib;
    long long ctx, tool_tokens, m, migrations, bucket;
    double confidence, shrink;
    int overflow, agnostic_fb, beyond_root, record;
    double limits[MAXB];
    long long floor_limits[MAXB];
    Py_ssize_t nb, nfin;
} Call;

/* a plain float, or an int below 2**53 in size, as a double (what Python's arithmetic converts it to) */
static inline int double_of(PyObject *x, double *out) {
    if (x == NULL) return DECLINE;
    if (PyFloat_CheckExact(x)) {
        *out = PyFloat_AS_DOUBLE(x);
        return OK;
    }
    if (!PyLong_CheckExact(x)) return DECLINE;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (v == -1 && PyErr_Occurred()) return ERR;
    if (overflow || v <= -(1LL << 53) || v >= (1LL << 53)) return DECLINE;
    *out = (double)v;
    return OK;
}

/* the decision points end in the mark `_progress` leaves (None), which a tool return takes off */
static inline int ends_in_mark(PyObject *points) {
    Py_ssize_t n = points == Py_None ? 0 : PyList_GET_SIZE(points);
    return n && PyList_GET_ITEM(points, n - 1) == Py_None;
}

/* the decision: stay (the mark taken off the points) */
static inline int stay(const Call *c, Plan *p) {
    p->pop_point = ends_in_mark(c->points);
    p->outcome = STAY;
    return OK;
}

/* priced_shares.c: the first phase after the walk, from the node that stands for the request */
int decide(Call *c, Plan *p, PyObject *node, long long anchor);

#endif
