/* The bucket shares and the decision of the priced rule's `on_tool_return` in C (priced_native.c has the rest):
 * `_priced_call`'s inline path from the node that stands for the request on (libra/scheduling/priced.py): the
 * majority exit on the admission bucket, the fit's record, the blend with the population, the beyond-root
 * fallback, then the rule (move or stay, and the decision points). Reads only; the same floats as the Python code
 * (every share `int / int` of exact integers, the same operations in the same order, no contraction). */
#include "priced_native.h"

#include <math.h>

/* the shares of the buckets among the `n - i` observations of a window from position `i` on, from the positions of
   the finite limits in it (`at`), as `_priced_call`'s passes without a blend make them */
static void shares_from(const Call *c, const long long *at, long long i, Py_ssize_t n, double *probs) {
    double below = (double)i / (double)n, alive = 1.0 - below;
    for (Py_ssize_t k = 0; k < c->nfin; k++) {
        if (at[k] > i) {
            double upto = (double)at[k] / (double)n;
            probs[k] = (upto - below) / alive;
            below = upto, i = at[k];
        } else {
            probs[k] = 0.0;
        }
    }
    if (c->nfin < c->nb) probs[c->nfin] = below < 1.0 ? (1.0 - below) / alive : 0.0;
}

/* `shares_from` a node's window, the limits' positions found in it for the node's `anchor` */
static int node_shares(const Call *c, PyObject *ordered, long long anchor, Py_ssize_t i, double *probs) {
    long long at[MAXB];
    for (Py_ssize_t k = 0; k < c->nfin; k++) {
        Py_ssize_t j;
        int rc = tn_bisect_counts(ordered, c->floor_limits[k] - anchor, &j);
        if (rc) return rc;
        at[k] = j;
    }
    shares_from(c, at, i, PyList_GET_SIZE(ordered), probs);
    return OK;
}

/* one bucket's share, as the full pass makes it, from the positions of its floor (`lo_at`, -1 for the first
   bucket) and of its limit (`hi_at`, -1 for an unbounded last bucket) in a window of `n` from position `i` on */
static double bucket_share(long long i, long long lo_at, long long hi_at, Py_ssize_t n, double alive) {
    long long lo = lo_at > i ? lo_at : i;
    if (hi_at >= 0) return hi_at > lo ? ((double)hi_at / (double)n - (double)lo / (double)n) / alive : 0.0;
    return lo < n ? (1.0 - (double)lo / (double)n) / alive : 0.0;
}

/* `probs` blended with the population's shares beyond `r_below` of the root's window of `r_n` (positions `ups`) */
static void blend(const Call *c, double *probs, const long long *ups, Py_ssize_t r_below, Py_ssize_t r_n, double w,
                  double v) {
    double r_alive = (double)(r_n - r_below);
    long long rb = r_below;
    for (Py_ssize_t k = 0; k < c->nfin; k++) {
        if (ups[k] > rb) {
            probs[k] = w * probs[k] + v * ((double)(ups[k] - rb) / r_alive);
            rb = ups[k];
        } else {
            probs[k] = w * probs[k] + v * 0.0;
        }
    }
    if (c->nfin < c->nb) probs[c->nfin] = w * probs[c->nfin] + v * ((double)(r_n - rb) / r_alive);
}

/* a list of floats */
static PyObject *float_list(const double *x, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject *f = PyFloat_FromDouble(x[k]);
        if (f == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, f);
    }
    return out;
}

/* the walk's positions of the limits in the root's window (`walk.ups`), as counts */
static int ups_of(const Call *c, long long *ups) {
    PyObject *list = SLOT(c->walk, w_ups);
    if (list == NULL || !PyList_CheckExact(list) || PyList_GET_SIZE(list) != c->nfin) return DECLINE;
    for (Py_ssize_t k = 0; k < c->nfin; k++) {
        int rc = tn_count(PyList_GET_ITEM(list, k), &ups[k]);
        if (rc) return rc;
    }
    return OK;
}

/* the first phase after the walk: the node's (and root's) shares and the decision, from the node `node` reached
   at `anchor` */
int decide(Call *c, Plan *p, PyObject *node, long long anchor) {
    PyObject *ordered = node ? SLOT(node, off_ordered) : NULL;
    if (ordered == NULL || !PyList_CheckExact(ordered) || PyList_GET_SIZE(ordered) == 0)
        return DECLINE; /* no node, or an empty window: `_probabilities` */
    PyObject *root = c->root;
    PyObject *r_ordered = SLOT(root, off_ordered);
    if (r_ordered == NULL || !PyList_CheckExact(r_ordered)) return DECLINE;
    long long ups_total, total, root_ctx, t;
    int rc = tn_count(SLOT(c->walk, w_ups_total), &ups_total);
    if (!rc) rc = tn_count(SLOT(root, off_total), &total);
    if (!rc) rc = tn_count(SLOT(c->walk, w_root_ctx), &root_ctx);
    if (!rc) rc = tn_count(SLOT(c->walk, w_admitted), &t);
    if (rc) return rc;
    if (SLOT(c->walk, w_ups_of) != r_ordered || ups_total != total) return DECLINE; /* `_root_ups` first */
    if (t >= c->nb) return DECLINE;
    double mean, price;
    rc = double_of(SLOT(c->walk, w_mean), &mean);
    if (!rc) rc = double_of(SLOT(c->walk, w_price), &price);
    if (rc) return rc;
    long long ups[MAXB];
    rc = ups_of(c, ups);
    if (rc) return rc;
    long long ctx = c->ctx;
    double probs[MAXB];
    Py_ssize_t n = PyList_GET_SIZE(ordered), rn = PyList_GET_SIZE(r_ordered), i;
    rc = tn_bisect_counts(ordered, ctx - anchor - 1, &i);
    if (rc) return rc;
    int early = c->migrations || t == c->bucket;
    if (i < n) {
        double alive = 1.0 - (double)i / (double)n, survivors = 0.0, w = 0.0, v = 0.0, x = 0.0;
        Py_ssize_t r_below = -1, r_n = -1; /* no blend (`r_below < r_n`: a blend) */
        if (c->shrink != 0.0 && node != root) {
            r_n = rn;
            rc = tn_bisect_counts(r_ordered, ctx - root_ctx - 1, &r_below);
            if (rc) return rc;
            if (r_below < r_n) {
                survivors = alive * (double)n;
                w = survivors / (survivors + c->shrink);
                v = 1.0 - w;
            }
        }
        if (c->record) { /* the node's shares, kept whole for the fit's record */
            if ((rc = node_shares(c, ordered, anchor, i, probs))) return rc;
            int keep = 0;
            double weight = 0.0;
            if (r_below < r_n) {
                keep = 1, weight = survivors;
            } else if (node != root && c->shrink == 0.0 && rn) {
                long long last;
                if ((rc = tn_count(PyList_GET_ITEM(r_ordered, rn - 1), &last))) return rc;
                if (ctx - root_ctx - 1 < last) keep = 1, weight = alive * (double)n;
            }
            if (keep && (p->record = Py_BuildValue("(NLd)", float_list(probs, c->nb), ctx, weight)) == NULL)
                return ERR;
            x = probs[t];
        } else if (early) { /* the node's share of the admission bucket alone */
            Py_ssize_t lo_at = -1, hi_at = -1;
            if (t && (rc = tn_bisect_counts(ordered, c->floor_limits[t - 1] - anchor, &lo_at))) return rc;
            if (t < c->nfin && (rc = tn_bisect_counts(ordered, c->floor_limits[t] - anchor, &hi_at))) return rc;
            x = bucket_share(i, lo_at, hi_at, n, alive);
        }
        if (early) { /* the early exit: bucket t's blended share */
            if (r_below < r_n) {
                long long r_lo = r_below;
                if (t && ups[t - 1] > r_lo) r_lo = ups[t - 1];
                if (t < c->nfin) {
                    long long up = ups[t];
                    if (up > r_lo) x = w * x + v * ((double)(up - r_lo) / (double)(r_n - r_below));
                    else x = w * x + v * 0.0;
                } else {
                    x = w * x + v * ((double)(r_n - r_lo) / (double)(r_n - r_below));
                }
            }
            if (x > majority) return stay(c, p);
        }
        if (!c->record && (rc = node_shares(c, ordered, anchor, i, probs))) return rc;
        if (r_below < r_n) blend(c, probs, ups, r_below, r_n, w, v);
    } else if (c->beyond_root && SLOT(root, off_count) != NULL) {
        long long root_count;
        rc = tn_count(SLOT(root, off_count), &root_count);
        if (rc) return rc;
        if (!root_count) return DECLINE; /* no shares: `_priced_overflow` */
        Py_ssize_t r_i;
        rc = tn_bisect_counts(r_ordered, ctx - root_ctx - 1, &r_i);
        if (rc) return rc;
        if (r_i < rn) { /* the root's shares from the context at admission (the limits' positions: `ups`) */
            double alive = 1.0 - (double)r_i / (double)rn;
            if (early && bucket_share(r_i, t ? ups[t - 1] : -1, t < c->nfin ? ups[t] : -1, rn, alive) > majority)
                return stay(c, p);
            shares_from(c, ups, r_i, rn, probs);
        } else { /* outlived them all: the bucket of its context (`bucket_for`) */
            Py_ssize_t b = 0;
            while (b < c->nb && !((double)ctx <= c->limits[b])) b++;
            if (b == c->nb) b = c->nb - 1;
            for (Py_ssize_t k = 0; k < c->nb; k++) probs[k] = 0.0;
            probs[b] = 1.0;
        }
    } else {
        return DECLINE; /* no shares: `_priced_overflow` */
    }
    /* the rule, on the shares (the mark is taken off whatever it decides) */
    PyObject *points = c->points;
    p->pop_point = ends_in_mark(points);
    double top = probs[0];
    for (Py_ssize_t k = 1; k < c->nb; k++)
        if (probs[k] > top) top = probs[k];
    Py_ssize_t best = 0;
    while (best < c->nb && !(probs[best] == top)) best++;
    if (best == c->nb) return DECLINE; /* a NaN share */
    long long carried = ctx - c->tool_tokens, tool_tokens = c->tool_tokens;
    if (points != Py_None) { /* `_record`: the price interval in which this return would move the request */
        if (best != t) {
            double hi = carried > 0 ? (top - probs[t]) * mean / (double)carried : INFINITY;
            double need = c->confidence - top;
            double low = need <= 0 ? 0.0 : (tool_tokens > 0 ? need * mean / (double)tool_tokens : INFINITY);
            if (low <= hi) p->points[p->npoints++] = Py_BuildValue("(ddL)", low, hi, carried);
            if (c->overflow && best > t && (double)ctx > c->limits[t])
                p->points[p->npoints++] = Py_BuildValue("(ddL)", 0.0, top * mean / (double)ctx, carried);
            for (int k = 0; k < p->npoints; k++)
                if (p->points[k] == NULL) return ERR;
        }
    }
    Py_ssize_t current = (Py_ssize_t)c->bucket;
    p->carried = carried;
    if (c->migrations == 0) {
        double unit = price / mean;
        if (best != current && top - probs[current] >= unit * (double)carried &&
            top >= c->confidence - unit * (double)tool_tokens) {
            p->outcome = MOVE, p->target = best, p->reason = s_tool_return;
            return OK;
        }
    }
    if (c->migrations || (double)ctx <= c->limits[current] || !c->overflow) return stay(c, p);
    if (best > current && top >= price * (double)ctx / mean) {
        p->outcome = MOVE, p->target = best, p->reason = s_overflow_reason;
        return OK;
    }
    return stay(c, p);
}
