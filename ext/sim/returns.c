/* Tool calls that return before a slice ends: the start of `RolloutRun._returns` (libra/sim/rollout.py, the
   reference), up to the routed moves, which the caller carries out. */

#include "slice_native.h"

enum { R_LIVE, R_STATE, R_READY, R_MOVED, R_STOLEN, R_TURN, R_WHERE, R_CARRIED, R_RBUCKET, R_IBUCKET, N_RETURNS };

static const Spec RETURNS_SPEC[N_RETURNS] = {
    {'q', '*', 0}, {'b', 'n', 1}, {'d', 'n', 0}, {'?', 'n', 0}, {'?', 'n', 0}, {'q', 'n', 0}, {'q', 'n', 0},
    {'q', 'w', 0}, {'q', 'w', 0}, {'q', 'K', 0},
};

/* returns(arrays, n, S, K, slice_end) -> (touched, moving, carried): the live requests in TOOL whose tool returns
   before `slice_end` go back to WAIT; of those (ascending), the ones whose routed move before their next segment
   still applies, and the context each carries (a request moved before, or a stolen one whose instance's bucket
   already holds the target, carries nothing) */
PyObject *sn_returns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, S, K, m = -1;
    double slice_end;
    if (!PyArg_ParseTuple(args, "O!nnnd", &PyTuple_Type, &arrays, &n, &S, &K, &slice_end)) return NULL;
    Buf b[N_RETURNS];
    memset(b, 0, sizeof(b));
    IVec moving = {0}, carried = {0};
    int touched = 0;
    if (sn_acquire(arrays, RETURNS_SPEC, N_RETURNS, b, n, S, K, &m) < 0) goto fail;
    const int64_t *live = Q(R_LIVE), *turn = Q(R_TURN), *where = Q(R_WHERE), *carry = Q(R_CARRIED),
                  *rbucket = Q(R_RBUCKET), *ibucket = Q(R_IBUCKET);
    const double *ready = D(R_READY);
    const uint8_t *moved = U(R_MOVED), *stolen = U(R_STOLEN);
    int8_t *state = (int8_t *)b[R_STATE].view.buf;
    for (Py_ssize_t i = 0; i < LEN(R_LIVE); i++) {
        int64_t r = live[i];
        if (r < 0 || r >= n) {
            PyErr_SetString(PyExc_ValueError, "returns: a live request's index is out of range");
            goto fail;
        }
        if (state[r] != TOOL || !(ready[r] < slice_end)) continue;
        state[r] = WAIT;
        touched = (1 << TOOL) | (1 << WAIT);
        int64_t seg = turn[r];
        if (seg < 0 || seg >= S || where[r] < 0 || where[r] >= K) {
            PyErr_SetString(PyExc_ValueError, "returns: a returning request's turn or instance is out of range");
            goto fail;
        }
        if (moved[r]) continue;
        if (stolen[r] && rbucket[r * S + seg] <= ibucket[where[r]]) continue; /* covered by its instance */
        int64_t c = carry[r * S + seg];
        if (c > 0 && (ivec_push(&moving, r) < 0 || ivec_push(&carried, c) < 0)) goto nomem;
    }
    {
        PyObject *mv = sn_to_bytearray(moving.p, moving.n * (Py_ssize_t)sizeof(int64_t));
        PyObject *cr = sn_to_bytearray(carried.p, carried.n * (Py_ssize_t)sizeof(int64_t));
        if (mv && cr) result = Py_BuildValue("iNN", touched, mv, cr);
        else {
            Py_XDECREF(mv);
            Py_XDECREF(cr);
        }
    }
    goto out;
nomem:
    PyErr_NoMemory();
fail:
out:
    sn_release(b, N_RETURNS);
    free(moving.p);
    free(carried.p);
    return result;
}
