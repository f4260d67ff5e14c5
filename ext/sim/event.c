/* When to look again: `RolloutRun.next_event` (libra/sim/rollout.py, the reference). */

#include "slice_native.h"

/* --- when to look again: `RolloutRun.next_event` ----------------------------------------------------------- */
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
    const int64_t *live = Q(E_LIVE), *where = Q(E_WHERE), *still = Q(E_STILL);
    const int8_t *state = (const int8_t *)b[E_STATE].view.buf;
    const double *ready = D(E_READY), *debt = D(E_DEBT), *rem = D(E_REM), *step = D(E_STEP), *ready_at = D(E_READY_AT);
    Py_ssize_t nlive = LEN(E_LIVE), nstill = LEN(E_STILL);
    int any_run = 0, any_tool = 0, any_later = 0, any_wait = 0;
    double tool_min = 0.0, later_min = 0.0;
    for (Py_ssize_t i = 0; i < nlive; i++) {
        int64_t r = live[i];
        if (r < 0 || r >= n) {
            PyErr_SetString(PyExc_ValueError, "next_event: a live request's index is out of range");
            goto out;
        }
        int s = state[r];
        if (s == RUN) {
            any_run = 1;
        } else if (s == TOOL) {
            tool_min = any_tool ? np_min(tool_min, ready[r]) : ready[r];
            any_tool = 1;
        } else if (s == WAIT) {
            any_wait = 1;
            int64_t w = where[r];
            if (w < 0 || w >= K) {
                PyErr_SetString(PyExc_ValueError, "next_event: a waiting request's instance is out of range");
                goto out;
            }
            if (ready_at[w] > t) {
                later_min = any_later ? np_min(later_min, ready_at[w]) : ready_at[w];
                any_later = 1;
            }
        }
    }
    double nxt = t + max_slice;
    if (have_last && nstill) { /* segment ends at the last slice's step times */
        double first = 0.0;
        for (Py_ssize_t i = 0; i < nstill; i++) {
            int64_t r = still[i];
            if (r < 0 || r >= n || where[r] < 0 || where[r] >= K || LEN(E_STEP) != K) {
                PyErr_SetString(PyExc_ValueError, "next_event: a running request's index or instance is out of range");
                goto out;
            }
            double x = debt[where[r]] + rem[r] * step[where[r]];
            first = i ? np_min(first, x) : x;
        }
        double x = t + first;
        if (x < nxt) nxt = x;
    } else if (any_run) {
        nxt = t; /* admitted in the last slice, not yet decoding */
    }
    if (any_tool && tool_min < nxt) nxt = tool_min;
    if (any_wait) {
        if (any_later) {
            if (later_min < nxt) nxt = later_min;
        } else if (!any_run) {
            nxt = t; /* admissible now */
        }
    }
    double floor_t = t + min_slice;
    result = PyFloat_FromDouble(floor_t > nxt ? floor_t : nxt);
out:
    sn_release(b, N_EVENT);
    return result;
}
