/* The priced rule's `on_tool_return` in C (libra.scheduling._tree_native._priced_native): `PricedRule._priced_call`
 * of libra/scheduling/priced.py on its inline path, the default preset's hot path (issue 16 row 5a). This file has
 * the entry point, the arguments, the walk and the writes; priced_shares.c the bucket shares and the decision.
 *
 * A call runs in two phases. The first only reads: the arguments, the request, the walk's next nodes, the node that
 * stands for the request and the bucket shares, then the decision (stay, or a move) and what the call writes. Where
 * anything is not what the inline path takes (an argument the checks would look at twice, a state the codec has not
 * interned, no node with observations, the root's window changed since the request's limits were placed in it, a
 * token count past 2**53, an option other than the inline path's, a NaN share), it writes nothing and hands the
 * call to `_priced_call`, which decides it (and raises where the router raises). The second phase writes what
 * `_priced_call` writes, in its order: the books, the walk, the fit's record, the decision points, the decision
 * (a first stay in a bucket made as `Router._move` makes it; `CMLFQRouter._move` called for a move).
 *
 * The floats are `_priced_call`'s: every share is `int / int` of exact integers below 2**53 (one double division,
 * CPython's fast path) and the same sums and products in the same order (no contraction: -ffp-contract=off).
 * tests/scheduling/test_priced_native.py compares every decision, point and record with `_priced_call`. */
#include "priced_native.h"

/* bound by `bind_priced` */
static PyTypeObject *walk_type, *request_type, *state_codec_type, *quantile_codec_type, *decision_type;
static PyObject *statuses;
double majority;
static PyObject *one; /* the int 1 */
Py_ssize_t w_root_ctx, w_admitted, w_price, w_ups, w_ups_of, w_ups_total, w_mean;
static Py_ssize_t w_p_node, w_p_ctx, w_p_exact, w_a_node, w_a_ctx, w_a_exact, w_points, w_calib;
static Py_ssize_t d_request_id, d_bucket, d_migrate, d_from_bucket, d_migrated_tokens, d_reason;
static Py_ssize_t r_request_id, r_bucket, r_context, r_tool_tokens, r_migrations, r_state, r_stay;
static PyObject *s_tool, *s_tool_tokens, *s_status, *s_context_tokens, *s_requests, *s_tree, *s_min_count, *s_fit,
    *s_inline, *s_fallback, *s_shrink, *s_floor_limits, *s_limits, *s_confidence, *s_overflow, *s_beyond,
    *s_context_in_flight, *s_codec, *s_agnostic, *s_codes, *s_edges, *s_pooled_edges, *s_size_edges, *s_taken,
    *s_per_step, *s_per_request, *s_bucket, *s_move, *s_priced_call, *s_stay, *s_scaled_fb, *s_agnostic_fb, *s_root;
PyObject *s_tool_return, *s_overflow_reason;
static PyObject *s_named, *s_other_tool; /* s_other_tool: the text of OTHER_TOOL (size_classes.py) */


static int node_count(PyObject *node, long long *out) {
    if (node == NULL || Py_TYPE(node) != node_type) return DECLINE;
    return tn_count(SLOT(node, off_count), out);
}

/* the code of a return's state, borrowed from the codec's table (`StateCodec.encode`, or its
   `QuantileStateCodec` override); DECLINE for a state not interned yet */
static int encode(PyObject *codec, PyObject *tool, long long tool_tokens, PyObject *status, PyObject **code) {
    PyObject *edges = NULL, *table = NULL, *codes = NULL;
    int rc = DECLINE;
    if (Py_TYPE(codec) == quantile_codec_type) {
        /* a tool not keyed by its name (`_named`: None keys every tool by name) is keyed OTHER_TOOL and classed by
           the pooled edges, as `QuantileStateCodec.encode` does */
        PyObject *named = PyObject_GetAttr(codec, s_named);
        if (named == NULL) return ERR;
        int by_name = 1;
        if (named != Py_None) by_name = PySet_CheckExact(named) ? PySet_Contains(named, tool) : -2;
        Py_DECREF(named);
        if (by_name == -1) return ERR;
        if (by_name == -2) return DECLINE;
        if (by_name) {
            table = PyObject_GetAttr(codec, s_edges);
            if (table == NULL) return ERR;
            if (PyDict_CheckExact(table)) {
                edges = PyDict_GetItemWithError(table, tool);
                if (edges != NULL) Py_INCREF(edges);
                else if (!PyErr_Occurred()) edges = PyObject_GetAttr(codec, s_pooled_edges);
            }
        } else {
            tool = s_other_tool;
            edges = PyObject_GetAttr(codec, s_pooled_edges);
        }
    } else if (Py_TYPE(codec) == state_codec_type) {
        edges = PyObject_GetAttr(codec, s_size_edges);
    }
    if (edges == NULL) {
        rc = PyErr_Occurred() ? ERR : DECLINE;
        goto out;
    }
    if (!PyTuple_CheckExact(edges)) goto out;
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(edges);
    while (lo < hi) { /* bisect_right(edges, tool_tokens): an int against float or int edges, exactly */
        Py_ssize_t mid = lo + (hi - lo) / 2;
        PyObject *e = PyTuple_GET_ITEM(edges, mid);
        int below;
        if (PyFloat_CheckExact(e)) {
            below = (double)tool_tokens < PyFloat_AS_DOUBLE(e);
        } else {
            long long v;
            if (!PyLong_CheckExact(e)) goto out;
            int overflow = 0;
            v = PyLong_AsLongLongAndOverflow(e, &overflow);
            if (v == -1 && PyErr_Occurred()) {
                rc = ERR;
                goto out;
            }
            below = overflow > 0 || (!overflow && tool_tokens < v);
        }
        if (below) hi = mid;
        else lo = mid + 1;
    }
    codes = PyObject_GetAttr(codec, s_codes);
    if (codes == NULL) {
        rc = ERR;
        goto out;
    }
    if (!PyDict_CheckExact(codes)) goto out;
    PyObject *size = PyLong_FromSsize_t(lo);
    PyObject *key = size ? PyTuple_Pack(3, tool, size, status) : NULL;
    Py_XDECREF(size);
    if (key == NULL) {
        rc = ERR;
        goto out;
    }
    *code = PyDict_GetItemWithError(codes, key); /* borrowed: the codec's table keeps its codes */
    Py_DECREF(key);
    rc = *code != NULL ? OK : PyErr_Occurred() ? ERR : DECLINE;
out:
    Py_XDECREF(edges);
    Py_XDECREF(table);
    Py_XDECREF(codes);
    return rc;
}

/* one walk's step (`_tool_return`'s walk): *child is the child reached (borrowed), or NULL when the walk leaves
   the tree */
static int step_down(PyObject *node, PyObject *code, long long m, PyObject **child) {
    if (node == NULL || Py_TYPE(node) != node_type) return DECLINE;
    PyObject *children = SLOT(node, off_children);
    if (children == NULL || !PyDict_CheckExact(children)) return DECLINE;
    PyObject *c = PyDict_GetItemWithError(children, code);
    *child = NULL;
    if (c == NULL) return PyErr_Occurred() ? ERR : OK;
    long long count;
    int rc = node_count(c, &count);
    if (rc) return rc;
    if (count >= m) *child = c;
    return OK;
}


/* the router's attribute from its instance dict (borrowed), DECLINE where it is not there */
static int own(PyObject *dict, PyObject *name, PyObject **out) {
    *out = PyDict_GetItemWithError(dict, name);
    if (*out == NULL) return PyErr_Occurred() ? ERR : DECLINE;
    return OK;
}

static int flag_of(PyObject *x, int *out) {
    if (x != Py_True && x != Py_False) return DECLINE;
    *out = x == Py_True;
    return OK;
}

/* the first phase: reads only; OK with the plan, DECLINE for `_priced_call`, ERR with an exception */
static int plan(Call *c, Plan *p, PyObject *router, PyObject *request_id, PyObject *tool, PyObject *tool_tokens,
                PyObject *status, PyObject *context_tokens) {
    /* `_book_tool_return`'s checks as the plain arguments pass them (the rest: `_checked_tool_return`) */
    if (!PyUnicode_CheckExact(tool) || PyUnicode_GET_LENGTH(tool) == 0 || !PyUnicode_CheckExact(status))
        return DECLINE;
    int known = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(statuses) && !known; k++) {
        PyObject *s = PyTuple_GET_ITEM(statuses, k);
        known = s == status || PyUnicode_Compare(s, status) == 0;
    }
    if (!known) return DECLINE;
    int rc = tn_count(tool_tokens, &c->tool_tokens);
    if (!rc) rc = tn_count(context_tokens, &c->ctx);
    if (rc) return rc;
    c->dict = PyObject_GenericGetDict(router, NULL);
    if (c->dict == NULL) { /* (a router without an instance dict: `_priced_call` reads its attributes) */
        PyErr_Clear();
        return DECLINE;
    }
    PyObject *requests;
    rc = own(c->dict, s_requests, &requests);
    if (rc) return rc;
    if (!PyDict_CheckExact(requests) || !(PyLong_CheckExact(request_id) || PyUnicode_CheckExact(request_id)))
        return DECLINE; /* (an id of another type may run Python code to hash or compare) */
    c->req = PyDict_GetItemWithError(requests, request_id);
    if (c->req == NULL) return PyErr_Occurred() ? ERR : DECLINE; /* (not in flight: `_priced_call` raises) */
    Py_INCREF(c->req);
    if (Py_TYPE(c->req) != request_type) return DECLINE;
    c->walk = SLOT(c->req, r_state);
    if (c->walk == NULL || Py_TYPE(c->walk) != walk_type) return DECLINE;
    Py_INCREF(c->walk);
    rc = tn_count(SLOT(c->req, r_migrations), &c->migrations);
    if (!rc) rc = tn_count(SLOT(c->req, r_bucket), &c->bucket);
    if (rc) return rc;
    /* the options */
    PyObject *x;
    int inline_;
    if ((rc = own(c->dict, s_inline, &x)) || (rc = flag_of(x, &inline_))) return rc;
    if (!inline_) return DECLINE;
    if ((rc = own(c->dict, s_fallback, &x))) return rc;
    if (!PyUnicode_CheckExact(x) || PyUnicode_Compare(x, s_scaled_fb) == 0) return DECLINE;
    c->agnostic_fb = PyUnicode_Compare(x, s_agnostic_fb) == 0;
    if ((rc = own(c->dict, s_beyond, &x))) return rc;
    if (!PyUnicode_CheckExact(x)) return DECLINE;
    c->beyond_root = PyUnicode_Compare(x, s_root) == 0;
    if ((rc = own(c->dict, s_overflow, &x)) || (rc = flag_of(x, &c->overflow))) return rc;
    if ((rc = own(c->dict, s_confidence, &x)) || (rc = double_of(x, &c->confidence))) return rc;
    if ((rc = own(c->dict, s_shrink, &x)) || (rc = double_of(x, &c->shrink))) return rc;
    if ((rc = own(c->dict, s_min_count, &x)) || (rc = tn_count(x, &c->m))) return rc;
    if ((rc = own(c->dict, s_limits, &x))) return rc;
    if (!PyTuple_CheckExact(x) || PyTuple_GET_SIZE(x) == 0 || PyTuple_GET_SIZE(x) > MAXB) return DECLINE;
    c->nb = PyTuple_GET_SIZE(x);
    for (Py_ssize_t k = 0; k < c->nb; k++)
        if ((rc = double_of(PyTuple_GET_ITEM(x, k), &c->limits[k]))) return rc;
    if (c->bucket >= c->nb) return DECLINE;
    if ((rc = own(c->dict, s_floor_limits, &x))) return rc;
    if (!PyTuple_CheckExact(x) || PyTuple_GET_SIZE(x) > c->nb) return DECLINE;
    c->nfin = PyTuple_GET_SIZE(x);
    for (Py_ssize_t k = 0; k < c->nfin; k++)
        if ((rc = tn_count(PyTuple_GET_ITEM(x, k), &c->floor_limits[k]))) return rc;
    c->points = SLOT(c->walk, w_points);
    if (c->points == NULL || (c->points != Py_None && !PyList_CheckExact(c->points))) return DECLINE;
    /* the fit's record: taken while it has room this step and for this request */
    if ((rc = own(c->dict, s_fit, &c->fit))) return rc;
    c->record = 0;
    if (c->fit != Py_None) {
        long long taken, per_step, per_request;
        PyObject *a = PyObject_GetAttr(c->fit, s_taken), *b = PyObject_GetAttr(c->fit, s_per_step),
                 *d = PyObject_GetAttr(c->fit, s_per_request);
        rc = a && b && d ? OK : ERR;
        if (!rc) rc = tn_count(a, &taken);
        if (!rc) rc = tn_count(b, &per_step);
        if (!rc) rc = tn_count(d, &per_request);
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(d);
        if (rc) return rc;
        c->calib = SLOT(c->walk, w_calib);
        if (c->calib == NULL || !PyList_CheckExact(c->calib)) return DECLINE;
        c->record = taken < per_step && PyList_GET_SIZE(c->calib) < per_request;
    }
    /* the tree, its codec and root */
    if ((rc = own(c->dict, s_tree, &x))) return rc;
    c->tree = Py_NewRef(x);
    c->codec = PyObject_GetAttr(c->tree, s_codec);
    if (c->codec == NULL) return ERR;
    c->root = PyObject_GetAttr(c->tree, s_agnostic);
    if (c->root == NULL) return ERR;
    if (Py_TYPE(c->root) != node_type) return DECLINE;
    PyObject *code = NULL;
    if ((rc = encode(c->codec, tool, c->tool_tokens, status, &code))) return rc;
    /* the walk (`_tool_return`'s) */
    int p_exact, a_exact;
    if ((rc = flag_of(SLOT(c->walk, w_p_exact), &p_exact)) || (rc = flag_of(SLOT(c->walk, w_a_exact), &a_exact)))
        return rc;
    PyObject *node = NULL;
    if (p_exact) {
        if ((rc = step_down(SLOT(c->walk, w_p_node), code, c->m, &p->p_child))) return rc;
        p->p_leaves = p->p_child == NULL;
        node = p->p_child; /* on the prompt's path and seen: `_select`'s first choice */
    }
    if (a_exact) {
        if ((rc = step_down(SLOT(c->walk, w_a_node), code, c->m, &p->a_child))) return rc;
        p->a_leaves = p->a_child == NULL;
    }
    if (!c->record && c->migrations && c->points == Py_None) return stay(c, p); /* moved, no points to keep */
    long long anchor = c->ctx;
    if (node == NULL) { /* `_select`, the prompt's path having left the tree */
        PyObject *p_node = p->p_child ? p->p_child : SLOT(c->walk, w_p_node);
        PyObject *a_node = p->a_child ? p->a_child : SLOT(c->walk, w_a_node);
        long long p_ctx = c->ctx, a_ctx = c->ctx, count;
        if (!p->p_child && p_node != Py_None && (rc = tn_count(SLOT(c->walk, w_p_ctx), &p_ctx))) return rc;
        if (!p->a_child && (rc = tn_count(SLOT(c->walk, w_a_ctx), &a_ctx))) return rc;
        if ((rc = node_count(a_node, &count))) return rc;
        int a_ok = count >= c->m;
        if (a_exact && !p->a_leaves && c->agnostic_fb && a_ok) {
            node = a_node, anchor = a_ctx;
        } else if (p_node != NULL && p_node != Py_None) {
            if ((rc = node_count(p_node, &count))) return rc;
            if (count >= c->m) node = p_node, anchor = p_ctx;
        }
        if (node == NULL && a_ok) node = a_node, anchor = a_ctx;
    }
    return decide(c, p, node, anchor);
}

static void set_slot(PyObject *obj, Py_ssize_t off, PyObject *value) { /* (steals `value`) */
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
}

/* `Router._move(router, req, req.bucket, 0, "stay")`: the request's frozen "stay" decision in its bucket, made
   (as `router._decision` makes it, slot by slot) on its first stay there */
static PyObject *stay_of(PyObject *req) {
    PyObject *stay = SLOT(req, r_stay), *bucket = SLOT(req, r_bucket), *request_id = SLOT(req, r_request_id);
    if (bucket == NULL || request_id == NULL) {
        PyErr_SetString(PyExc_AttributeError, "Request.bucket or request_id is not set");
        return NULL;
    }
    if (stay != NULL && stay != Py_None) {
        PyObject *b = Py_TYPE(stay) == decision_type ? Py_XNewRef(SLOT(stay, d_bucket)) : NULL;
        if (b == NULL && (b = PyObject_GetAttr(stay, s_bucket)) == NULL) return NULL;
        int differs = b == bucket ? 0 : PyObject_RichCompareBool(b, bucket, Py_NE);
        Py_DECREF(b);
        if (differs < 0) return NULL;
        if (!differs) return Py_NewRef(stay);
    }
    PyObject *zero = PyLong_FromLong(0), *made = zero ? decision_type->tp_alloc(decision_type, 0) : NULL;
    if (made == NULL) {
        Py_XDECREF(zero);
        return NULL;
    }
    SLOT(made, d_request_id) = Py_NewRef(request_id);
    SLOT(made, d_bucket) = Py_NewRef(bucket);
    SLOT(made, d_migrate) = Py_NewRef(Py_False);
    SLOT(made, d_from_bucket) = Py_NewRef(bucket);
    SLOT(made, d_migrated_tokens) = zero;
    SLOT(made, d_reason) = Py_NewRef(s_stay);
    set_slot(req, r_stay, Py_NewRef(made));
    return made;
}

/* the second phase: `_priced_call`'s writes, in its order, and the decision */
static PyObject *apply(Call *c, Plan *p, PyObject *router, PyObject *tool_tokens, PyObject *context_tokens) {
    PyObject *req = c->req, *walk = c->walk;
    /* the books (`_book_tool_return`) */
    PyObject *in_flight = PyObject_GetAttr(router, s_context_in_flight);
    if (in_flight == NULL) return NULL;
    PyObject *old = SLOT(req, r_context);
    PyObject *diff = old ? PyNumber_Subtract(context_tokens, old) : NULL;
    if (old == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "Request.context is not set");
    PyObject *sum = diff ? PyNumber_InPlaceAdd(in_flight, diff) : NULL;
    Py_DECREF(in_flight);
    Py_XDECREF(diff);
    if (sum == NULL) return NULL;
    int rc = PyObject_SetAttr(router, s_context_in_flight, sum);
    Py_DECREF(sum);
    if (rc) return NULL;
    set_slot(req, r_context, Py_NewRef(context_tokens));
    old = SLOT(req, r_tool_tokens);
    if (old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "Request.tool_tokens is not set");
        return NULL;
    }
    sum = PyNumber_InPlaceAdd(old, tool_tokens);
    if (sum == NULL) return NULL;
    set_slot(req, r_tool_tokens, sum);
    /* the walk */
    if (p->p_leaves) set_slot(walk, w_p_exact, Py_NewRef(Py_False));
    if (p->p_child) {
        set_slot(walk, w_p_node, Py_NewRef(p->p_child));
        set_slot(walk, w_p_ctx, Py_NewRef(context_tokens));
    }
    if (p->a_leaves) set_slot(walk, w_a_exact, Py_NewRef(Py_False));
    if (p->a_child) {
        set_slot(walk, w_a_node, Py_NewRef(p->a_child));
        set_slot(walk, w_a_ctx, Py_NewRef(context_tokens));
    }
    /* the fit's record */
    if (p->record) {
        if (PyList_Append(c->calib, p->record)) return NULL;
        PyObject *taken = PyObject_GetAttr(c->fit, s_taken);
        PyObject *more = taken ? PyNumber_InPlaceAdd(taken, one) : NULL;
        Py_XDECREF(taken);
        if (more == NULL) return NULL;
        rc = PyObject_SetAttr(c->fit, s_taken, more);
        Py_DECREF(more);
        if (rc) return NULL;
    }
    /* the decision points */
    if (p->pop_point && PyList_SetSlice(c->points, PyList_GET_SIZE(c->points) - 1, PyList_GET_SIZE(c->points), NULL))
        return NULL;
    for (int k = 0; k < p->npoints; k++)
        if (PyList_Append(c->points, p->points[k])) return NULL;
    /* the decision */
    if (p->outcome == MOVE) {
        PyObject *target = PyLong_FromSsize_t(p->target), *carried = PyLong_FromLongLong(p->carried);
        PyObject *got = NULL;
        if (target && carried) {
            PyObject *argv[] = {router, req, target, carried, p->reason};
            got = PyObject_VectorcallMethod(s_move, argv, 5, NULL);
        }
        Py_XDECREF(target);
        Py_XDECREF(carried);
        return got;
    }
    return stay_of(req);
}

/* `_priced_native(router, request_id, *, tool, tool_tokens, status, context_tokens)`: the router's
   `on_tool_return` (bound to it) */
PyObject *tn_priced_call(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "_priced_native() takes the router first");
        return NULL;
    }
    PyObject *router = args[0];
    PyObject *kw[4] = {NULL, NULL, NULL, NULL}; /* tool, tool_tokens, status, context_tokens */
    int plain = walk_type != NULL && nargs == 2 && kwnames != NULL && PyTuple_GET_SIZE(kwnames) == 4;
    for (Py_ssize_t k = 0; plain && k < 4; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        PyObject *const names[4] = {s_tool, s_tool_tokens, s_status, s_context_tokens};
        int slot = -1;
        for (int q = 0; q < 4 && slot < 0; q++)
            if (name == names[q] || PyUnicode_Compare(name, names[q]) == 0) slot = q;
        if (slot < 0 || kw[slot] != NULL) plain = 0;
        else kw[slot] = args[nargs + k];
    }
    Call c = {0};
    Plan p = {0};
    PyObject *result = NULL;
    int rc = plain ? plan(&c, &p, router, args[1], kw[0], kw[1], kw[2], kw[3]) : DECLINE;
    if (rc == OK) {
        result = apply(&c, &p, router, kw[1], kw[3]);
    } else if (rc == DECLINE) { /* `_priced_call` decides (and raises where the router raises) */
        PyObject *fn = PyObject_GetAttr(router, s_priced_call);
        if (fn != NULL) result = PyObject_Vectorcall(fn, args + 1, nargs - 1, kwnames);
        Py_XDECREF(fn);
    }
    for (int k = 0; k < p.npoints; k++) Py_XDECREF(p.points[k]);
    Py_XDECREF(p.record);
    Py_XDECREF(c.dict);
    Py_XDECREF(c.req);
    Py_XDECREF(c.walk);
    Py_XDECREF(c.tree);
    Py_XDECREF(c.codec);
    Py_XDECREF(c.root);
    return result;
}

static int intern_all(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_tool, "tool"}, {&s_tool_tokens, "tool_tokens"}, {&s_status, "status"},
        {&s_context_tokens, "context_tokens"}, {&s_requests, "_requests"}, {&s_tree, "tree"},
        {&s_min_count, "min_count"}, {&s_fit, "_fit"}, {&s_inline, "_inline"}, {&s_fallback, "fallback"},
        {&s_shrink, "shrink"}, {&s_floor_limits, "_floor_limits"}, {&s_limits, "limits"},
        {&s_confidence, "confidence"}, {&s_overflow, "overflow"}, {&s_beyond, "beyond"},
        {&s_context_in_flight, "_context_in_flight"}, {&s_codec, "codec"}, {&s_agnostic, "agnostic"},
        {&s_codes, "_codes"}, {&s_edges, "_edges"}, {&s_pooled_edges, "_pooled_edges"},
        {&s_size_edges, "size_edges"}, {&s_taken, "taken"}, {&s_per_step, "per_step"},
        {&s_per_request, "per_request"}, {&s_bucket, "bucket"}, {&s_move, "_move"},
        {&s_priced_call, "_priced_call"}, {&s_stay, "stay"}, {&s_tool_return, "tool-return"},
        {&s_overflow_reason, "overflow"}, {&s_scaled_fb, "scaled"}, {&s_agnostic_fb, "agnostic"},
        {&s_root, "root"}, {&s_named, "_named"}, {&s_other_tool, "*"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (*names[k].slot == NULL && (*names[k].slot = PyUnicode_InternFromString(names[k].text)) == NULL)
            return -1;
    return 0;
}

/* `bind_priced(Walk, Request, RouteDecision, StateCodec, QuantileStateCodec, statuses, majority)`: the classes and
   values `_priced_native` reads (after `bind(Node)`) */
PyObject *tn_bind_priced(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *walk, *request, *decision, *plain_codec, *quantile_codec, *status_tuple;
    double maj;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!d", &PyType_Type, &walk, &PyType_Type, &request, &PyType_Type,
                          &decision, &PyType_Type, &plain_codec, &PyType_Type, &quantile_codec, &PyTuple_Type,
                          &status_tuple, &maj))
        return NULL;
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_priced() needs bind(Node) first");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(status_tuple); k++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(status_tuple, k))) {
            PyErr_SetString(PyExc_TypeError, "bind_priced(): the statuses must be str");
            return NULL;
        }
    if (intern_all()) return NULL;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return NULL;
    PyTypeObject *w = (PyTypeObject *)walk, *r = (PyTypeObject *)request, *d = (PyTypeObject *)decision;
    if (tn_slot_offset(w, "p_node", &w_p_node) || tn_slot_offset(w, "p_ctx", &w_p_ctx) ||
        tn_slot_offset(w, "p_exact", &w_p_exact) || tn_slot_offset(w, "a_node", &w_a_node) ||
        tn_slot_offset(w, "a_ctx", &w_a_ctx) || tn_slot_offset(w, "a_exact", &w_a_exact) ||
        tn_slot_offset(w, "root_ctx", &w_root_ctx) || tn_slot_offset(w, "admitted", &w_admitted) ||
        tn_slot_offset(w, "points", &w_points) || tn_slot_offset(w, "price", &w_price) ||
        tn_slot_offset(w, "calib", &w_calib) || tn_slot_offset(w, "ups", &w_ups) ||
        tn_slot_offset(w, "ups_of", &w_ups_of) || tn_slot_offset(w, "ups_total", &w_ups_total) ||
        tn_slot_offset(w, "mean", &w_mean) || tn_slot_offset(r, "bucket", &r_bucket) ||
        tn_slot_offset(r, "context", &r_context) || tn_slot_offset(r, "tool_tokens", &r_tool_tokens) ||
        tn_slot_offset(r, "migrations", &r_migrations) || tn_slot_offset(r, "state", &r_state) ||
        tn_slot_offset(r, "stay", &r_stay) || tn_slot_offset(r, "request_id", &r_request_id) ||
        tn_slot_offset(d, "request_id", &d_request_id) || tn_slot_offset(d, "bucket", &d_bucket) ||
        tn_slot_offset(d, "migrate", &d_migrate) || tn_slot_offset(d, "from_bucket", &d_from_bucket) ||
        tn_slot_offset(d, "migrated_tokens", &d_migrated_tokens) || tn_slot_offset(d, "reason", &d_reason))
        return NULL;
    Py_XSETREF(walk_type, (PyTypeObject *)Py_NewRef(walk));
    Py_XSETREF(request_type, (PyTypeObject *)Py_NewRef(request));
    Py_XSETREF(state_codec_type, (PyTypeObject *)Py_NewRef(plain_codec));
    Py_XSETREF(quantile_codec_type, (PyTypeObject *)Py_NewRef(quantile_codec));
    Py_XSETREF(decision_type, (PyTypeObject *)Py_NewRef(decision));
    Py_XSETREF(statuses, Py_NewRef(status_tuple));
    majority = maj;
    Py_RETURN_NONE;
}
