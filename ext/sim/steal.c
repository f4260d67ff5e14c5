/* Work-conserving admission's steal: `Admission._steal` (libra/sim/admission.py, the reference), the same
   requests moved in the same order, with the same sums. */

#include "slice_native.h"

/* a turn under way in the pool: its position among the waiting requests and when it became ready */
typedef struct {
    Py_ssize_t pos;
    double ready;
} Stuck;

/* np.argsort(ready, kind="stable") */
static inline int stuck_less(const Stuck *a, const Stuck *b) { return a->ready < b->ready; }

DEFINE_STABLE_SORT(sort_stuck, Stuck, stuck_less)

/* a thief: its index, sorted stably by its bucket (np.argsort(bucket[thieves], kind="stable")) */
typedef struct {
    int64_t k, bucket;
} Thief;

static inline int thief_less(const Thief *a, const Thief *b) { return a->bucket < b->bucket; }

DEFINE_STABLE_SORT(sort_thieves, Thief, thief_less)

enum {
    T_WAITING, T_OPEN, T_ROOM, T_SEATS, T_WHERE, T_FRESH, T_READY, T_CTX, T_PENDING, T_STOLEN, T_READY_AT, T_IBUCKET,
    T_ITP, T_DEGREES, N_STEAL
};

static const Spec STEAL_SPEC[N_STEAL] = {
    {'q', '*', 0}, {'?', 'K', 0}, {'d', 'K', 0}, {'q', 'K', 0}, {'q', 'n', 1}, {'?', 'n', 0}, {'d', 'n', 0},
    {'d', 'n', 0}, {'d', 'n', 1}, {'?', 'n', 1}, {'d', 'K', 0}, {'q', 'K', 0}, {'q', 'K', 0}, {'d', '*', 0},
};

/* the first position of the non-decreasing cs[0..m) holding a value > x (np.searchsorted(cs, x, "right")); NaN
   sorts last */
static Py_ssize_t search_right(const double *cs, Py_ssize_t m, double x) {
    if (isnan(x)) return m;
    Py_ssize_t lo = 0, hi = m;
    while (lo < hi) {
        Py_ssize_t mid = lo + ((hi - lo) >> 1);
        if (cs[mid] <= x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* `_steal` on raw arrays: 1 when it moved some request, 0 when not, -1 with an exception set; `moved` and
   `tokens` count the turns under way it moved and their context tokens */
int sn_steal_core(const StealIn *s, long long *moved, long long *tokens) {
    const int64_t *waiting = s->waiting, *seats = s->seats, *ibucket = s->ibucket, *itp = s->itp;
    const uint8_t *open_k = s->open_k, *fresh = s->fresh;
    const double *room = s->room, *ready = s->ready, *ctx = s->ctx, *ready_at = s->ready_at;
    int64_t *where = s->where;
    double *pending = s->pending;
    uint8_t *stolen = s->stolen;
    Py_ssize_t n = s->n, K = s->K, nw = s->nw, ndeg = s->ndeg;
    double t = s->t;
    int64_t *pool = NULL, *eligible = NULL, *home = NULL;
    Thief *thieves = NULL;
    Stuck *stuck = NULL;
    uint8_t *queued = NULL, *taken = NULL, *ripe_all = NULL, *has_ripe = NULL;
    double *scratch = NULL, *cs = NULL;
    int rc = -1, any = 0;
    /* thieves: open instances with nothing queued (np.bincount(where[waiting]) == 0; a flag, not a count, so no
       store waits on the one before at the same instance) */
    queued = calloc((size_t)K + 1, 1);
    thieves = malloc(((size_t)K + 1) * sizeof(Thief));
    if (!queued || !thieves) goto nomem;
    for (Py_ssize_t i = 0; i < nw; i++) {
        int64_t r = waiting[i];
        if (r < 0 || r >= n || where[r] < 0 || where[r] >= K) {
            PyErr_SetString(PyExc_ValueError, "steal: a waiting request's index or instance is out of range");
            goto fail;
        }
        queued[where[r]] = 1;
    }
    Py_ssize_t nt = 0;
    for (Py_ssize_t k = 0; k < K; k++) {
        if (open_k[k] && !queued[k]) {
            if (ibucket[k] < 0) {
                PyErr_SetString(PyExc_ValueError, "steal: an instance's bucket is negative");
                goto fail;
            }
            thieves[nt++] = (Thief){k, ibucket[k]};
        }
    }
    if (nt == 0) goto done;
    if (sort_thieves(thieves, nt) < 0) goto nomem;
    /* the pool: new requests newest first, then (all) turns under way oldest first; an instance still starting
       keeps its queue */
    pool = malloc(((size_t)nw + 1) * sizeof(int64_t));
    stuck = malloc(((size_t)nw + 1) * sizeof(Stuck));
    if (!pool || !stuck) goto nomem;
    Py_ssize_t np_ = 0, ns = 0;
    for (Py_ssize_t i = nw - 1; i >= 0; i--) {
        int64_t r = waiting[i];
        if (fresh[r] && ready_at[where[r]] <= t) pool[np_++] = r;
    }
    if (s->all && s->order) { /* the kept order lists them by readiness, then index: the stable sort's order */
        for (Py_ssize_t i = 0; i < (Py_ssize_t)*s->order->len; i++) {
            int64_t r = s->order->ids[i];
            if (s->state[r] != WAIT || fresh[r] || where[r] < 0 || where[r] >= K || !(ready_at[where[r]] <= t))
                continue;
            if (np_ == nw) { /* (each is one of the waiting: the order holds every queued turn under way once) */
                PyErr_SetString(PyExc_SystemError, "steal: the kept order of the queued turns is not the queue");
                goto fail;
            }
            pool[np_++] = r;
        }
    } else if (s->all) {
        for (Py_ssize_t i = 0; i < nw; i++)
            if (!fresh[waiting[i]]) stuck[ns++] = (Stuck){i, ready[waiting[i]]};
        if (sort_stuck(stuck, ns) < 0) goto nomem;
        for (Py_ssize_t i = 0; i < ns; i++) {
            int64_t r = waiting[stuck[i].pos];
            if (ready_at[where[r]] <= t) pool[np_++] = r;
        }
    }
    /* per candidate, read once (the loop moves only the requests it takes, which leave the pool) */
    taken = calloc((size_t)np_ + 1, 1);
    eligible = malloc(((size_t)np_ + 1) * sizeof(int64_t));
    scratch = malloc(((size_t)np_ + 1) * sizeof(double));
    cs = malloc(((size_t)np_ + 1) * sizeof(double));
    ripe_all = malloc(((size_t)np_ + 1) * (size_t)(ndeg + 1));
    has_ripe = calloc((size_t)ndeg + 1, 1);
    home = malloc(((size_t)np_ + 1) * sizeof(int64_t)); /* each candidate's bucket */
    if (!taken || !eligible || !scratch || !cs || !ripe_all || !has_ripe || !home) goto nomem;
    for (Py_ssize_t p = 0; p < np_; p++) home[p] = ibucket[where[pool[p]]];
    Py_ssize_t left = np_, ne = 0, at = 0;
    int64_t key_bucket = -1, key_tp = -1;
    for (Py_ssize_t q = 0; q < nt; q++) {
        if (left == 0) break;
        int64_t k = thieves[q].k, tp = itp[k], bucket = ibucket[k];
        if (bucket != key_bucket || tp != key_tp) {
            key_bucket = bucket, key_tp = tp;
            Py_ssize_t di = -1;
            for (Py_ssize_t d = 0; d < ndeg; d++)
                if (s->deg[d].tp == tp) di = d;
            if (di < 0) {
                PyErr_SetString(PyExc_SystemError, "steal: an instance's degree is not in the table");
                goto fail;
            }
            uint8_t *ripe = ripe_all + (size_t)di * (size_t)(np_ + 1);
            if (!has_ripe[di]) { /* rent or buy: move a stuck turn only once its wait has cost as much as the move */
                for (Py_ssize_t p = 0; p < np_; p++) {
                    int64_t r = pool[p];
                    double c = ctx[r];
                    ripe[p] = fresh[r] ? 1 : (t - ready[r]) >= sn_prefill(&s->deg[di], s->work0, s->attn, c, c / 2.0);
                }
                has_ripe[di] = 1;
            }
            ne = 0, at = 0;
            for (Py_ssize_t p = 0; p < np_; p++)
                if (!taken[p] && home[p] <= bucket && ripe[p]) eligible[ne++] = p;
        }
        Py_ssize_t avail = ne - at;
        if (avail == 0) continue;
        const int64_t *mine = eligible + at;
        for (Py_ssize_t i = 0; i < avail; i++) scratch[i] = ctx[pool[mine[i]]];
        double mean = sn_np_sum(scratch, avail) / (double)avail;
        double free_kv = room[k] - s->headroom * mean; /* the headroom admission keeps */
        Py_ssize_t most = seats[k] < (int64_t)avail ? (Py_ssize_t)seats[k] : avail;
        Py_ssize_t fit = 0;
        if (most > 0) {
            double run = 0.0;
            for (Py_ssize_t i = 0; i < most; i++) cs[i] = run += scratch[i];
            fit = search_right(cs, most, free_kv);
        }
        if ((int64_t)fit > seats[k]) fit = (Py_ssize_t)seats[k];
        Py_ssize_t take = fit > 1 ? fit : 1; /* at least one */
        if (take > avail) take = avail; /* (Python slices the available: `take` cannot pass them) */
        Py_ssize_t nu = 0;
        for (Py_ssize_t i = 0; i < take; i++) {
            Py_ssize_t p = mine[i];
            int64_t r = pool[p];
            taken[p] = 1;
            if (!fresh[r]) {
                pending[r] = ctx[r]; /* re-prefill the whole context on the new instance */
                scratch[nu++] = ctx[r];
            }
            if (home[p] < bucket) stolen[r] = 1;
            where[r] = k;
        }
        at += take;
        left -= take;
        any = 1;
        *moved += nu;
        *tokens += (long long)sn_np_sum(scratch, nu);
    }
done:
    rc = any;
    goto out;
nomem:
    PyErr_NoMemory();
fail:
out:
    free(queued);
    free(thieves);
    free(pool);
    free(stuck);
    free(taken);
    free(eligible);
    free(scratch);
    free(cs);
    free(ripe_all);
    free(has_ripe);
    free(home);
    return rc;
}

/* steal(arrays, n, K, t, headroom, all, work0, attn) -> (taken any, turns moved, their context tokens) */
PyObject *sn_steal(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, K, m = -1;
    double t, headroom, work0, attn;
    int all;
    if (!PyArg_ParseTuple(args, "O!nnddpdd", &PyTuple_Type, &arrays, &n, &K, &t, &headroom, &all, &work0, &attn))
        return NULL;
    Buf b[N_STEAL];
    memset(b, 0, sizeof(b));
    Degree deg[MAX_DEG];
    long long moved = 0, tokens = 0;
    if (sn_acquire(arrays, STEAL_SPEC, N_STEAL, b, n, 1, K, &m) < 0) goto out;
    Py_ssize_t ndeg = sn_degrees(D(T_DEGREES), LEN(T_DEGREES), deg);
    if (ndeg < 0) {
        PyErr_SetString(PyExc_ValueError, "steal: degree table malformed");
        goto out;
    }
    StealIn s = {
        .n = n, .K = K, .ndeg = ndeg, .nw = LEN(T_WAITING), .waiting = Q(T_WAITING), .open_k = U(T_OPEN),
        .room = D(T_ROOM), .seats = Q(T_SEATS), .where = Q(T_WHERE), .fresh = U(T_FRESH), .ready = D(T_READY),
        .ctx = D(T_CTX), .pending = D(T_PENDING), .stolen = U(T_STOLEN), .ready_at = D(T_READY_AT),
        .ibucket = Q(T_IBUCKET), .itp = Q(T_ITP), .deg = deg, .t = t, .headroom = headroom, .work0 = work0,
        .attn = attn, .all = all,
    };
    int any = sn_steal_core(&s, &moved, &tokens);
    if (any >= 0) result = Py_BuildValue("OLL", any ? Py_True : Py_False, moved, tokens);
out:
    sn_release(b, N_STEAL);
    return result;
}
