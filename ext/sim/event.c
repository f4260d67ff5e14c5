/* When to look again: `RolloutRun.next_event` (libra/sim/rollout.py, the reference), as its own call and at the
   end of a slice's decoding (slice.c), which hands the time on for the next boundary. */

#include "slice_native.h"

/* --- when to look again: `RolloutRun.next_event` ----------------------------------------------------------- */
int sn_event_time(EventScan scan, EventIn at, double *out) {
    const EventScan *e = &scan;
    const EventIn *in = &at;
    if (e->bad) {
        PyErr_SetString(PyExc_ValueError, "next_event: a waiting request's instance is out of range");
        return -1;
    }
    double nxt = in->t + in->max_slice;
    if (in->have_last && in->nstill) { /* segment ends at the last slice's step times (of the instances it had) */
        double first = 0.0;
        for (Py_ssize_t i = 0; i < in->nstill; i++) {
            int64_t r = in->still[i];
            if (r < 0 || r >= in->n || in->where[r] < 0 || in->where[r] >= in->K || in->where[r] >= in->nstep) {
                PyErr_SetString(PyExc_ValueError, "next_event: a running request's index or instance is out of range");
                return -1;
            }
            double x = in->debt[in->where[r]] + in->rem[r] * in->step[in->where[r]];
            first = i ? np_min(first, x) : x;
        }
        double x = in->t + first;
        if (x < nxt) nxt = x;
    } else if (e->any_run) {
        nxt = in->t; /* admitted in the last slice, not yet decoding */
    }
    if (e->any_tool && e->tool_min < nxt) nxt = e->tool_min;
    if (e->any_wait) {
        if (e->any_later) {
            if (e->later_min < nxt) nxt = e->later_min;
        } else if (!e->any_run) {
            nxt = in->t; /* admissible now */
        }
    }
    double floor_t = in->t + in->min_slice;
    *out = floor_t > nxt ? floor_t : nxt;
    return 0;
}

enum { E_LIVE, E_STATE, E_READY, E_WHERE, E_DEBT, E_REM, E_STILL, E_STEP, E_READY_AT, N_EVENT };

static const Spec EVENT_SPEC[N_EVENT] = {
    {'q', '*', 0}, {'b', 'n', 0}, {'d', 'n', 0}, {'q', 'n', 0}, {'d', 'K', 0},
    {'d', 'n', 0}, {'q', '*', 0}, {'d', '*', 0}, {'d', 'K', 0},
};

PyObject *sn_next_event(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, K, m = -1;
    double t, min_slice, max_slice;
    int have_last;
    if (!PyArg_ParseTuple(args, "O!nndddp", &PyTuple_Type, &arrays, &n, &K, &t, &min_slice, &max_slice, &have_last))
        return NULL;
    Buf b[N_EVENT];
    memset(b, 0, sizeof(b));
    if (sn_acquire(arrays, EVENT_SPEC, N_EVENT, b, n, 1, K, &m) < 0) goto out;
    EventIn in = {
        .n = n, .K = K, .state = (const int8_t *)b[E_STATE].view.buf, .ready = D(E_READY), .where = Q(E_WHERE),
        .ready_at = D(E_READY_AT), .debt = D(E_DEBT), .rem = D(E_REM), .still = Q(E_STILL), .nstill = LEN(E_STILL),
        .step = D(E_STEP), .nstep = LEN(E_STEP), .t = t, .min_slice = min_slice, .max_slice = max_slice,
        .have_last = have_last, .starting = sn_starting(D(E_READY_AT), K, t), .checked = 0,
    };
    EventScan e = {0};
    const int64_t *live = Q(E_LIVE);
    for (Py_ssize_t i = 0; i < LEN(E_LIVE); i++) {
        if (live[i] < 0 || live[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "next_event: a live request's index is out of range");
            goto out;
        }
        sn_event_note(&e, &in, live[i]);
    }
    double nxt;
    if (sn_event_time(e, in, &nxt) == 0) result = PyFloat_FromDouble(nxt);
out:
    sn_release(b, N_EVENT);
    return result;
}
