/* The simulator's replay of one step through the C-MLFQ router in C (libra.scheduling._tree_native.replay):
 * `CausalRouting._replay` of libra/sim/routing.py for a `CMLFQRouter` with the published rule, taking the same
 * paths as the router's own code, the reference and the fallback:
 *   - `Router.admit` and `CMLFQRouter._admit_bucket` (the walk from the prompt's root and the agnostic root;
 *     `admit="predicted"`: `_predict` and `_decide`);
 *   - `Router.on_progress` with `CMLFQRouter._progress` and `_overflow`;
 *   - `MeanP90Rule._published_call` (published.py), the rule's own `on_tool_return`, inline path;
 *   - `Router._move` (no ceiling and no repay: the caller checks).
 * The tree is read, never changed, but for what the reference also writes: a node's prefix sums made on first
 * need (`Node.prefix`) and a tool-return state interned by the codec on first sight (`StateCodec._intern`, called).
 * The floats are the reference's: a conditional mean is `int / int` of exact integers below 2**53 (one double
 * division, CPython's fast path), a quantile `float(int)`, both added to the integer anchor. Anything else (a
 * token count that is not a plain non-negative int, a status or tool the checks would look at twice, a sum past
 * 2**53) returns NotImplemented before a decision differs, and the caller replays in Python, which raises where
 * the router raises. tests/sim/test_replay_native.py compares both on learnt trees. */
#include "tree_native.h"

#include <math.h>

typedef struct {
    const double *limits;
    Py_ssize_t nb;
    long long m;
    int agnostic, overflow, predicted;
    double cost_ratio;
    PyObject *codes, *edges, *codec, *statuses; /* the codec's interned states, its size edges, the codec */
} Cfg;

enum { OK = 0, ERR = -1, NOT_IMPL = -2 };

/* `Router.bucket_for`: the first limit that holds `x`, else (past them all, or NaN) the last bucket */
static Py_ssize_t bucket_for(const Cfg *c, double x) {
    for (Py_ssize_t i = 0; i < c->nb; i++)
        if (x <= c->limits[i]) return i;
    return c->nb - 1;
}

static int node_count(PyObject *node, long long *out) {
    PyObject *c = SLOT(node, off_count);
    if (c == NULL) {
        PyErr_SetString(PyExc_AttributeError, "Node.count is not set");
        return ERR;
    }
    return tn_count(c, out);
}

typedef struct {
    PyObject *p_node, *p_root, *a_node; /* borrowed: the tree holds them, and nothing here removes a node */
    long long p_ctx, a_ctx;
    int p_exact, a_exact;
} Walk;

/* `Node.beyond(x)`'s conditional mean and P90 of the remaining tokens (`x` an integer); *has = 0 when none ran
   past `x`. Makes `node.prefix` as the reference does on first need. */
static int beyond(PyObject *node, long long x, int *has, double *mean, double *p90) {
    PyObject *ordered = SLOT(node, off_ordered);
    if (ordered == NULL || !PyList_CheckExact(ordered)) {
        if (ordered == NULL) PyErr_SetString(PyExc_AttributeError, "Node.ordered is not set");
        return ordered == NULL ? ERR : NOT_IMPL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ordered), i;
    int found = tn_bisect_counts(ordered, x, &i);
    if (found) return found;
    Py_ssize_t k = n - i;
    *has = k > 0;
    if (k <= 0) return OK;
    PyObject *prefix = SLOT(node, off_prefix);
    if (prefix == NULL || prefix == Py_None) { /* list(itertools.accumulate(ordered, initial=0)) */
        PyObject *made = PyList_New(n + 1);
        if (made == NULL) return ERR;
        long long acc = 0;
        for (Py_ssize_t q = 0; q <= n; q++) {
            if (q) {
                long long v;
                int rc = tn_count(PyList_GET_ITEM(ordered, q - 1), &v);
                if (rc == OK && (acc += v) >= (1LL << 53)) rc = NOT_IMPL;
                if (rc) {
                    Py_DECREF(made);
                    return rc;
                }
            }
            PyObject *s = PyLong_FromLongLong(acc);
            if (s == NULL) {
                Py_DECREF(made);
                return ERR;
            }
            PyList_SET_ITEM(made, q, s);
        }
        PyObject *old = SLOT(node, off_prefix);
        SLOT(node, off_prefix) = made;
        Py_XDECREF(old);
        prefix = made;
    }
    if (!PyList_CheckExact(prefix) || PyList_GET_SIZE(prefix) != n + 1) return NOT_IMPL;
    long long top, bottom, at90;
    int rc = tn_count(PyList_GET_ITEM(prefix, n), &top);
    if (!rc) rc = tn_count(PyList_GET_ITEM(prefix, i), &bottom);
    if (!rc) rc = tn_count(PyList_GET_ITEM(ordered, i + (Py_ssize_t)ceil(0.9 * (double)k) - 1), &at90);
    if (rc) return rc;
    *mean = (double)(top - bottom) / (double)k;
    *p90 = (double)at90;
    return OK;
}

/* `_select` (no `scaled` fallback): the node standing for the request and the context it was reached at */
static int select_node(const Cfg *c, const Walk *w, PyObject **node, long long *anchor) {
    long long pc = 0, ac;
    int rc = w->p_node ? node_count(w->p_node, &pc) : OK;
    if (!rc) rc = node_count(w->a_node, &ac);
    if (rc) return rc;
    int p_ok = w->p_node != NULL && pc >= c->m, a_ok = ac >= c->m;
    *node = NULL;
    if (p_ok && w->p_exact) *node = w->p_node, *anchor = w->p_ctx;
    else if (c->agnostic && a_ok && w->a_exact) *node = w->a_node, *anchor = w->a_ctx;
    else if (p_ok) *node = w->p_node, *anchor = w->p_ctx;
    else if (a_ok) *node = w->a_node, *anchor = w->a_ctx;
    return OK;
}

/* `_predict`: the predicted final length's mean and P90 at context `ctx`; *has = 0 without a prediction */
static int predict(const Cfg *c, const Walk *w, long long ctx, int *has, double *mean, double *p90) {
    PyObject *node;
    long long anchor = 0;
    *has = 0;
    int rc = select_node(c, w, &node, &anchor);
    if (rc || node == NULL) return rc;
    double m, q;
    rc = beyond(node, ctx - anchor - 1, has, &m, &q);
    if (rc || !*has) return rc;
    *mean = (double)anchor + m;
    *p90 = (double)anchor + q;
    return OK;
}

/* `StateCodec.encode` of a plain non-negative token count: the interned code, interning a new state */
static int encode(const Cfg *c, PyObject *tool, long long tool_tokens, PyObject *status, PyObject **code) {
    Py_ssize_t ne = PyTuple_GET_SIZE(c->edges), lo = 0, hi = ne;
    while (lo < hi) { /* bisect_right(size_edges, tool_tokens) */
        Py_ssize_t mid = lo + (hi - lo) / 2;
        long long e;
        int rc = tn_count(PyTuple_GET_ITEM(c->edges, mid), &e);
        if (rc) return rc;
        if (tool_tokens < e) hi = mid;
        else lo = mid + 1;
    }
    PyObject *size = PyLong_FromSsize_t(lo);
    if (size == NULL) return ERR;
    PyObject *key = PyTuple_Pack(3, tool, size, status);
    Py_DECREF(size);
    if (key == NULL) return ERR;
    PyObject *got = PyDict_GetItemWithError(c->codes, key); /* borrowed */
    if (got != NULL) {
        Py_INCREF(got);
    } else if (!PyErr_Occurred()) {
        got = PyObject_CallMethod(c->codec, "_intern", "(O)", key);
    }
    Py_DECREF(key);
    if (got == NULL) return ERR;
    *code = got;
    return OK;
}

/* one step of a walk down its tree with a tool return's `code` (`_tool_return`'s walk): to the child, reached at
   `ctx`, when it exists and has `m` observations; else the walk is no longer exact */
static int walk_step(PyObject **node, long long *at, int *exact, PyObject *code, long long ctx, long long m) {
    PyObject *children = SLOT(*node, off_children);
    PyObject *child = children ? PyDict_GetItemWithError(children, code) : NULL;
    long long count = 0;
    if (child == NULL && PyErr_Occurred()) return ERR;
    int rc = child ? node_count(child, &count) : OK;
    if (rc) return rc;
    if (child == NULL || count < m) *exact = 0;
    else *node = child, *at = ctx;
    return OK;
}

/* `_overflow`: the bucket of a request in bucket `b` at context `ctx` that outgrew it, given the predicted mean
   (`has`) and the tokens a move would carry */
static Py_ssize_t overflow_target(const Cfg *c, Py_ssize_t b, long long ctx, int has, double mean, long long carried) {
    if (!c->overflow || (double)ctx <= c->limits[b]) return b;
    Py_ssize_t target = bucket_for(c, (double)ctx);
    if (has) {
        Py_ssize_t tm = bucket_for(c, mean);
        if (tm > target) target = tm;
        if (mean - (double)ctx < c->cost_ratio * (double)carried) return b;
    }
    return target;
}

/* one trajectory: its buckets and carried tokens from segment 1 on (`row_b`, `row_c`); `o` the flat index of its
   first segment */
static int replay_one(const Cfg *c, PyObject *agnostic, PyObject *prompts, PyObject *traj, long long nseg,
                      Py_ssize_t o, const int64_t *gen_ctx, const int64_t *tool_ctx, const uint8_t *tool_end,
                      const int64_t *turn_of, int64_t *row_b, int64_t *row_c) {
    static PyObject *s_prompt_id, *s_prompt_tokens, *s_turns, *s_tool, *s_tool_tokens, *s_tool_status;
    if (s_prompt_id == NULL) {
        s_prompt_id = PyUnicode_InternFromString("prompt_id");
        s_prompt_tokens = PyUnicode_InternFromString("prompt_tokens");
        s_turns = PyUnicode_InternFromString("turns");
        s_tool = PyUnicode_InternFromString("tool");
        s_tool_tokens = PyUnicode_InternFromString("tool_tokens");
        s_tool_status = PyUnicode_InternFromString("tool_status");
        if (!s_prompt_id || !s_prompt_tokens || !s_turns || !s_tool || !s_tool_tokens || !s_tool_status) return ERR;
    }
    int rc = ERR;
    PyObject *pid = NULL, *pid_str = NULL, *ptok = NULL, *turns = NULL;
    long long prompt_tokens;
    if (!(pid = PyObject_GetAttr(traj, s_prompt_id)) || !(ptok = PyObject_GetAttr(traj, s_prompt_tokens)) ||
        !(turns = PyObject_GetAttr(traj, s_turns)))
        goto out;
    if ((rc = tn_count(ptok, &prompt_tokens)) != OK) goto out;
    rc = ERR;
    if (!(pid_str = PyObject_Str(pid))) goto out;
    /* `Router.admit`, `_admit_bucket` */
    Walk w;
    w.p_node = w.p_root = PyDict_GetItemWithError(prompts, pid_str);
    if (w.p_node == NULL && PyErr_Occurred()) goto out;
    w.a_node = agnostic;
    w.p_ctx = w.a_ctx = prompt_tokens;
    w.p_exact = w.p_node != NULL;
    w.a_exact = 1;
    Py_ssize_t b = 0;
    if (c->predicted) { /* `_decide(walk, prompt_tokens, 0, _predict(...))`: mean-p90 */
        int has;
        double mean, p90;
        if ((rc = predict(c, &w, prompt_tokens, &has, &mean, &p90)) != OK) goto out;
        rc = ERR;
        if (has) {
            Py_ssize_t target = bucket_for(c, mean);
            if (target == bucket_for(c, p90)) b = target;
        }
    }
    for (long long s = 0; s < nseg - 1; s++, o++) {
        long long moved = 0;
        if ((double)gen_ctx[o] > c->limits[b]) { /* `on_progress`: `_progress`, `_overflow` (carrying the context) */
            long long ctx = gen_ctx[o];
            int has;
            double mean = 0.0, p90;
            if ((rc = predict(c, &w, ctx, &has, &mean, &p90)) != OK) goto out;
            rc = ERR;
            Py_ssize_t target = overflow_target(c, b, ctx, has, mean, ctx);
            if (target != b) b = target, moved = ctx; /* (max(0, ctx): ctx >= 0) */
        }
        if (tool_end[o]) { /* `_published_call` */
            PyObject *turn = PySequence_GetItem(turns, (Py_ssize_t)turn_of[o]);
            if (turn == NULL) goto out;
            PyObject *tool = PyObject_GetAttr(turn, s_tool), *tt = PyObject_GetAttr(turn, s_tool_tokens),
                     *status = PyObject_GetAttr(turn, s_tool_status);
            Py_DECREF(turn);
            PyObject *code = NULL;
            long long tool_tokens = 0, ctx = tool_ctx[o];
            int step = (tool && tt && status) ? OK : ERR;
            /* `_book_tool_return`'s checks, for plain arguments only: the rest is the reference's */
            if (step == OK) step = tn_count(tt, &tool_tokens);
            if (step == OK && (!PyUnicode_CheckExact(tool) || PyUnicode_GET_LENGTH(tool) == 0 ||
                               !PyUnicode_CheckExact(status) || ctx < 0))
                step = NOT_IMPL;
            if (step == OK) {
                int known = PySequence_Contains(c->statuses, status);
                step = known < 0 ? ERR : known ? OK : NOT_IMPL;
            }
            if (step == OK) step = encode(c, tool, tool_tokens, status, &code);
            Py_XDECREF(tool);
            Py_XDECREF(tt);
            Py_XDECREF(status);
            if (step == OK && w.p_exact) step = walk_step(&w.p_node, &w.p_ctx, &w.p_exact, code, ctx, c->m);
            if (step == OK && w.a_exact) step = walk_step(&w.a_node, &w.a_ctx, &w.a_exact, code, ctx, c->m);
            Py_XDECREF(code);
            if (step != OK) {
                rc = step;
                goto out;
            }
            /* the rule: a move to the bucket of the predicted mean when the P90's agrees and the remaining tokens
               pay for the carried context; a stay when they do not (`_overflow` would stay too); else `_overflow`
               (a prompt node just reached exactly is `_select`'s first choice, anchored at this context) */
            long long carried = ctx - tool_tokens;
            int has;
            double mean = 0.0, p90 = 0.0;
            if ((rc = predict(c, &w, ctx, &has, &mean, &p90)) != OK) goto out;
            rc = ERR;
            Py_ssize_t target;
            if (!has) {
                target = overflow_target(c, b, ctx, 0, 0.0, carried);
            } else if (mean - (double)ctx >= c->cost_ratio * (double)carried) {
                Py_ssize_t t = bucket_for(c, mean);
                target = t != b && t == bucket_for(c, p90) ? t : overflow_target(c, b, ctx, 1, mean, carried);
            } else {
                target = b;
            }
            if (target != b) b = target, moved = carried > 0 ? carried : 0;
        }
        row_b[s + 1] = b;
        row_c[s + 1] = moved;
    }
    rc = OK;
out:
    Py_XDECREF(pid);
    Py_XDECREF(pid_str);
    Py_XDECREF(ptok);
    Py_XDECREF(turns);
    return rc;
}

/* a C-contiguous buffer of `count` items of 8-byte ints (or bytes, `bytes_ok`); -1 with an exception */
static int get_buf(PyObject *obj, Py_buffer *v, Py_ssize_t count, int writable, int bytes_ok, const char *name) {
    if (PyObject_GetBuffer(obj, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ints = v->itemsize == 8 && (!strcmp(f, "l") || !strcmp(f, "q"));
    int bytes = bytes_ok && v->itemsize == 1 && (!strcmp(f, "?") || !strcmp(f, "b") || !strcmp(f, "B"));
    if (!(ints || bytes) || v->len / v->itemsize != count) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_ValueError, "replay: %s must hold %zd %s", name, count,
                     bytes_ok ? "bools" : "int64 values");
        return -1;
    }
    return 0;
}

/* replay(trajectories, agnostic, prompts, codec, statuses, limits, min_count, agnostic_fallback, overflow,
          predicted, cost_ratio, nseg, gen_ctx, tool_ctx, tool_end, turn_of, bucket, carried): fills `bucket` and
   `carried` (n x width, zeroed) and returns None; NotImplemented where the reference must decide (nothing else
   is meaningful in the outputs then). */
PyObject *tn_replay(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *trajs, *agnostic, *prompts, *codec, *statuses, *limits_t, *objs[7];
    long long m;
    int agn, overflow, predicted;
    double cost_ratio;
    if (!PyArg_ParseTuple(args, "OOO!OO!O!LpppdOOOOOOO", &trajs, &agnostic, &PyDict_Type, &prompts,
                          &codec, &PyTuple_Type, &statuses, &PyTuple_Type, &limits_t, &m, &agn, &overflow,
                          &predicted, &cost_ratio, &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                          &objs[6]))
        return NULL;
    Py_ssize_t nb = PyTuple_GET_SIZE(limits_t);
    if (node_type == NULL || !PyObject_TypeCheck(agnostic, node_type) || nb < 1) {
        PyErr_SetString(PyExc_TypeError, "replay: bind(Node) first, and give the agnostic root and the limits");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(trajs, "replay: the trajectories must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    double *limits = PyMem_Malloc((size_t)nb * sizeof(double));
    if (limits == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; j < nb; j++) {
        limits[j] = PyFloat_AsDouble(PyTuple_GET_ITEM(limits_t, j));
        if (limits[j] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(limits);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Cfg c = {limits, nb, m, agn, overflow, predicted, cost_ratio, NULL, NULL, codec, statuses};
    PyObject *result = NULL;
    Py_buffer v[7];
    int held = 0;
    c.codes = PyObject_GetAttrString(codec, "_codes");
    c.edges = PyObject_GetAttrString(codec, "size_edges");
    if (c.codes == NULL || c.edges == NULL) goto out;
    if (!PyDict_CheckExact(c.codes) || !PyTuple_CheckExact(c.edges)) {
        result = Py_NewRef(Py_NotImplemented);
        goto out;
    }
    if (get_buf(objs[0], &v[0], n, 0, 0, "nseg") < 0) goto out;
    held = 1;
    const int64_t *nseg = v[0].buf;
    Py_ssize_t used = 0, width = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (nseg[i] > 1) used += (Py_ssize_t)nseg[i] - 1; /* all segments but the last can move a request */
        if (nseg[i] > width) width = (Py_ssize_t)nseg[i];
    }
    const char *names[7] = {"nseg", "gen_ctx", "tool_ctx", "tool_end", "turn_of", "bucket", "carried"};
    for (int q = 1; q < 7; q++) {
        Py_ssize_t count = q < 5 ? used : -1;
        if (q >= 5) { /* (n, width) with width >= every nseg */
            if (PyObject_GetBuffer(objs[q], &v[q], PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto out;
            Py_ssize_t items = v[q].len / (v[q].itemsize ? v[q].itemsize : 1);
            PyBuffer_Release(&v[q]);
            if (n == 0 || items % n || items / n < width) {
                PyErr_SetString(PyExc_ValueError, "replay: bucket and carried must be n x width, width >= every nseg");
                goto out;
            }
            count = items;
        }
        if (get_buf(objs[q], &v[q], count, q >= 5, q == 3, names[q]) < 0) goto out;
        held = q + 1;
    }
    Py_ssize_t S = v[5].len / 8 / n;
    if (v[6].len != v[5].len) {
        PyErr_SetString(PyExc_ValueError, "replay: bucket and carried differ in shape");
        goto out;
    }
    const int64_t *gen_ctx = v[1].buf, *tool_ctx = v[2].buf, *turn_of = v[4].buf;
    const uint8_t *tool_end = v[3].buf;
    int64_t *bucket = v[5].buf, *carried = v[6].buf;
    Py_ssize_t o = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = replay_one(&c, agnostic, prompts, PySequence_Fast_GET_ITEM(fast, i), nseg[i], o, gen_ctx, tool_ctx, tool_end,
                            turn_of, bucket + i * S, carried + i * S);
        if (rc == ERR) goto out;
        if (rc == NOT_IMPL) {
            result = Py_NewRef(Py_NotImplemented);
            goto out;
        }
        if (nseg[i] > 1) o += (Py_ssize_t)nseg[i] - 1;
    }
    result = Py_NewRef(Py_None);
out:
    for (int q = 0; q < held; q++) PyBuffer_Release(&v[q]);
    Py_XDECREF(c.codes);
    Py_XDECREF(c.edges);
    PyMem_Free(limits);
    Py_DECREF(fast);
    return result;
}
