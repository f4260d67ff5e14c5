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

/* --- the routed moves: the rest of `RolloutRun._returns` with `_assign` (rollout.py) ----------------------- */
/* `water_fill(load, count)` (rollout.py) over the members' loads: how many of `count` each one gets, the most
   loaded ending as low as possible, ties to lower positions; the loads are counts (integers held in doubles), so
   every step below is exact, as numpy's is */
typedef struct {
    double v;
    Py_ssize_t i;
} Keyed;

static inline int keyed_less(const Keyed *a, const Keyed *b) { return a->v < b->v || (a->v == b->v && a->i < b->i); }

DEFINE_STABLE_SORT(sort_keyed, Keyed, keyed_less)

static int water_fill(const double *load, Py_ssize_t n, int64_t count, int64_t *out) {
    for (Py_ssize_t q = 0; q < n; q++) out[q] = 0;
    if (count <= 0 || n == 0) return 0;
    Keyed *o = malloc((size_t)n * sizeof(Keyed));
    double *fill = malloc((size_t)n * sizeof(double));
    if (!o || !fill) {
        free(o);
        free(fill);
        return -1;
    }
    for (Py_ssize_t q = 0; q < n; q++) o[q] = (Keyed){load[q], q};
    if (sort_keyed(o, n) < 0) { /* np.argsort(load, kind="stable") */
        free(o);
        free(fill);
        return -1;
    }
    double cs = 0.0;
    Py_ssize_t j = -1;
    for (Py_ssize_t q = 0; q < n; q++) {
        cs += o[q].v;
        fill[q] = (double)(q + 1) * o[q].v - cs;
        if (fill[q] <= (double)count) j = q; /* searchsorted(fill, count, "right") - 1: fill is nondecreasing */
    }
    double level_base = o[j].v;
    int64_t spare = count - (int64_t)fill[j], width = (int64_t)j + 1;
    double level = level_base + (double)(spare / width);
    int64_t extra = spare % width;
    for (int64_t q = 0; q < width; q++) {
        double g = floor(level - o[q].v);
        out[o[q].i] = (g > 0 ? (int64_t)g : 0) + (q < extra);
    }
    free(o);
    free(fill);
    return 0;
}

enum {
    M_MOVING, M_CARRIED, M_LIVE, M_STATE, M_WHERE, M_MOVED, M_READY, M_PENDING, M_TURN, M_RBUCKET, M_IBUCKET,
    M_ACTIVE, M_ITP, M_DEGREES, N_MOVES
};

static const Spec MOVES_SPEC[N_MOVES] = {
    {'q', '*', 0}, {'q', '*', 0}, {'q', '*', 0}, {'b', 'n', 1}, {'q', 'n', 1}, {'?', 'n', 1}, {'d', 'n', 1},
    {'d', 'n', 1}, {'q', 'n', 0}, {'q', 'w', 0}, {'q', 'K', 0}, {'?', 'K', 0}, {'q', 'K', 0}, {'d', '*', 0},
};

/* moves(arrays, n, S, K, slice_end, interleaved, kv_bytes, bandwidth, work0, attn) -> touched: the requests
   `moving` (ascending, from `returns`) go to the active instances of their routed bucket (`_assign`: least loaded
   first by water-filling, in blocks or dealt out in turn; a bucket without an active instance falls back to the
   nearest larger one, then smaller), each carrying `carried` tokens by KV transfer or by prefilling them again at
   its new instance, whichever is sooner; one still receiving its KV at `slice_end` waits in TOOL. */
PyObject *sn_moves(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, S, K, m = -1;
    double slice_end, kv_bytes, bandwidth, work0, attn;
    int interleaved;
    if (!PyArg_ParseTuple(args, "O!nnndpdddd", &PyTuple_Type, &arrays, &n, &S, &K, &slice_end, &interleaved,
                          &kv_bytes, &bandwidth, &work0, &attn))
        return NULL;
    Buf b[N_MOVES];
    memset(b, 0, sizeof(b));
    Degree deg[MAX_DEG];
    double *load = NULL, *mload = NULL;
    int64_t *bk = NULL, *members = NULL, *counts = NULL, *mine = NULL;
    Keyed *dealt = NULL;
    int64_t *slot_of = NULL;
    int touched = 0;
    if (sn_acquire(arrays, MOVES_SPEC, N_MOVES, b, n, S, K, &m) < 0) goto fail;
    Py_ssize_t nm = LEN(M_MOVING), ndeg = sn_degrees(D(M_DEGREES), LEN(M_DEGREES), deg);
    const int64_t *moving = Q(M_MOVING), *carried = Q(M_CARRIED), *live = Q(M_LIVE), *turn = Q(M_TURN),
                  *rbucket = Q(M_RBUCKET), *ibucket = Q(M_IBUCKET), *itp = Q(M_ITP);
    const uint8_t *active = U(M_ACTIVE);
    int8_t *state = (int8_t *)b[M_STATE].view.buf;
    int64_t *where = Q(M_WHERE);
    uint8_t *moved = U(M_MOVED);
    double *ready = D(M_READY), *pending = D(M_PENDING);
    if (ndeg < 0 || LEN(M_CARRIED) != nm || nm == 0) {
        PyErr_SetString(PyExc_ValueError, "moves: the moving requests, their carried tokens or the degree table malformed");
        goto fail;
    }
    load = calloc((size_t)K + 1, sizeof(double));
    mload = malloc(((size_t)K + 1) * sizeof(double));
    bk = malloc((size_t)nm * sizeof(int64_t));
    members = malloc(((size_t)K + 1) * sizeof(int64_t));
    counts = malloc(((size_t)K + 1) * sizeof(int64_t));
    mine = malloc((size_t)nm * sizeof(int64_t));
    if (!load || !mload || !bk || !members || !counts || !mine) goto nomem;
    for (Py_ssize_t i = 0; i < nm; i++) {
        int64_t r = moving[i];
        if (r < 0 || r >= n || turn[r] < 0 || turn[r] >= S || (i && r <= moving[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "moves: the moving requests must be ascending indices with a turn in range");
            goto fail;
        }
        moved[r] = 1;
        bk[i] = rbucket[r * S + turn[r]];
    }
    /* `load()`: the requests assigned to each instance and not finished (`_assign` reads it as floats) */
    for (Py_ssize_t i = 0; i < LEN(M_LIVE); i++) {
        int64_t r = live[i];
        if (r < 0 || r >= n || where[r] < -1 || where[r] >= K) {
            PyErr_SetString(PyExc_ValueError, "moves: a live request's index or instance is out of range");
            goto fail;
        }
        if (state[r] != DONE && where[r] >= 0) load[where[r]] += 1.0;
    }
    int64_t nb = 0;
    for (Py_ssize_t j = 0; j < K; j++) nb = ibucket[j] + 1 > nb ? ibucket[j] + 1 : nb;
    /* each routed bucket, ascending (np.unique) */
    for (int64_t bucket = INT64_MIN;;) {
        int64_t next = INT64_MAX;
        for (Py_ssize_t i = 0; i < nm; i++)
            if (bk[i] > bucket && bk[i] < next) next = bk[i];
        if (next == INT64_MAX) break;
        bucket = next;
        /* the bucket's active instances, else the nearest larger bucket's, then the nearest smaller's */
        Py_ssize_t nmem = 0;
        for (int64_t alt = bucket > 0 ? bucket : 0; nmem == 0 && alt < nb; alt++)
            for (Py_ssize_t j = 0; j < K; j++)
                if (ibucket[j] == alt && active[j]) members[nmem++] = j;
        for (int64_t alt = (bucket < nb ? bucket : nb) - 1; nmem == 0 && alt >= 0; alt--)
            for (Py_ssize_t j = 0; j < K; j++)
                if (ibucket[j] == alt && active[j]) members[nmem++] = j;
        if (nmem == 0) {
            PyErr_SetString(PyExc_ValueError, "moves: no active instance to move requests to");
            goto fail;
        }
        Py_ssize_t nmine = 0;
        for (Py_ssize_t i = 0; i < nm; i++)
            if (bk[i] == bucket) mine[nmine++] = moving[i];
        for (Py_ssize_t q = 0; q < nmem; q++) mload[q] = load[members[q]];
        if (water_fill(mload, nmem, nmine, counts) < 0) goto nomem;
        if (!interleaved) { /* np.repeat(members, counts) */
            Py_ssize_t o = 0;
            for (Py_ssize_t q = 0; q < nmem; q++)
                for (int64_t c = 0; c < counts[q]; c++) where[mine[o++]] = members[q];
        } else { /* `deal`: the c-th of member q's at (c + 1/2) / counts[q] of the order, ties by position */
            free(dealt);
            free(slot_of);
            dealt = malloc(((size_t)nmine + 1) * sizeof(Keyed));
            slot_of = malloc(((size_t)nmine + 1) * sizeof(int64_t));
            if (!dealt || !slot_of) goto nomem;
            Py_ssize_t o = 0;
            for (Py_ssize_t q = 0; q < nmem; q++)
                for (int64_t c = 0; c < counts[q]; c++, o++) {
                    dealt[o] = (Keyed){((double)c + 0.5) / (double)(counts[q] > 1 ? counts[q] : 1), o};
                    slot_of[o] = members[q];
                }
            if (sort_keyed(dealt, nmine) < 0) goto nomem; /* np.argsort(share, kind="stable") */
            for (Py_ssize_t q = 0; q < nmine; q++) where[mine[q]] = slot_of[dealt[q].i];
        }
        for (Py_ssize_t q = 0; q < nmem; q++) load[members[q]] += (double)counts[q];
    }
    /* the carried context: by KV transfer or prefilled again at the new instance, whichever is sooner */
    for (Py_ssize_t i = 0; i < nm; i++) {
        int64_t r = moving[i], k = where[r];
        if (k < 0 || k >= K) {
            PyErr_SetString(PyExc_ValueError, "moves: a moved request has no instance");
            goto fail;
        }
        const Degree *d = NULL;
        for (Py_ssize_t q = 0; q < ndeg && !d; q++)
            if (deg[q].tp == itp[k]) d = &deg[q];
        if (!d) {
            PyErr_SetString(PyExc_SystemError, "moves: an instance's degree is not in the table");
            goto fail;
        }
        double ctx = (double)carried[i];
        double reprefill = sn_prefill(d, work0, attn, ctx, ctx / 2.0);
        double transfer = ctx * kv_bytes / bandwidth;
        int use = transfer < reprefill;
        ready[r] = use ? ready[r] + transfer : ready[r];
        pending[r] += use ? 0.0 : ctx;
        if (use && ready[r] >= slice_end && state[r] != TOOL) { /* KV still in flight */
            touched |= (1 << state[r]) | (1 << TOOL);
            state[r] = TOOL;
        }
    }
    result = PyLong_FromLong(touched);
    goto out;
nomem:
    PyErr_NoMemory();
fail:
out:
    sn_release(b, N_MOVES);
    free(load);
    free(mload);
    free(bk);
    free(members);
    free(counts);
    free(mine);
    free(dealt);
    free(slot_of);
    return result;
}
