/* Admission at a slice boundary: `Admission._admit` (libra/sim/admission.py, the reference), its two passes of
   `_admit_queued` with `_credit`, and the work-conserving steal between them (steal.c). */

#include "slice_native.h"

/* --- admission: `Admission._admit_queued` after the steal ------------------------------------------------ */
typedef struct {
    int32_t k; /* (an instance's index: K is far below 2**31, checked where `sn_admit_core` starts) */
    uint8_t fresh;
    int64_t r;
    double ready, ctx; /* the request's, copied as it is listed: the sums below then read the candidates in order */
} Adm;

/* a candidate's run in the counting sort: 2k, instance k's turns under way; 2k + 1, its new requests */
static inline Py_ssize_t run_of(const Adm *x) { return 2 * (Py_ssize_t)x->k + (x->fresh != 0); }

/* readiness, for a run of one instance and one class */
static inline int adm_ready_less(const Adm *a, const Adm *b) { return a->ready < b->ready; }

DEFINE_STABLE_SORT(sort_adm_ready, Adm, adm_ready_less)

/* np.lexsort((ready, fresh, k)), a stable sort by instance, turns under way before new requests, then readiness,
   in less work than one merge sort of them all: a counting sort into one run per (instance, class), then each run
   by readiness unless it is in order already (new requests mostly are) */
static int sort_candidates(Adm **cp, Py_ssize_t nc, Py_ssize_t K, const AdmitIn *a) {
    Py_ssize_t runs = 2 * K;
    Adm *c = *cp, *tmp = malloc(((size_t)nc + 1) * sizeof(Adm));
    Py_ssize_t *at = calloc((size_t)runs + 1, sizeof(Py_ssize_t));
    int rc = -1, ordered = a->order != NULL;
    if (!tmp || !at) goto out;
    /* candidates of one run mostly come together (an instance's requests are adjacent): each stretch of one run is
       counted, then placed, at once, rather than a counter in memory per candidate that waits on the one before */
    for (Py_ssize_t i = 0, j; i < nc; i = j) {
        Py_ssize_t q = run_of(&c[i]);
        for (j = i + 1; j < nc && run_of(&c[j]) == q;) j++;
        at[q + 1] += j - i;
    }
    for (Py_ssize_t q = 0; q < runs; q++) at[q + 1] += at[q];
    for (Py_ssize_t i = 0; i < nc;) { /* then at[q]: run q's end */
        Py_ssize_t q = run_of(&c[i]), o = at[q];
        for (; i < nc && run_of(&c[i]) == q; i++) tmp[o++] = c[i];
        at[q] = o;
    }
    *cp = tmp; /* the sorted copy is the candidates from here (the caller frees it) */
    tmp = c;
    c = *cp;
    if (ordered) { /* the turns under way of each instance as the kept order lists them: by readiness, then index */
        Py_ssize_t *cur = malloc(((size_t)K + 1) * sizeof(Py_ssize_t)), len = (Py_ssize_t)*a->order->len;
        if (!cur) goto out;
        for (Py_ssize_t k = 0; k < K; k++) cur[k] = k ? at[2 * k - 1] : 0;
        int fits = 1;
        for (Py_ssize_t i = 0; i < len && fits; i++) {
            int64_t r = a->order->ids[i], w = a->where[r];
            if (a->state[r] != WAIT || a->fresh[r] || w < 0 || !a->open_k[w]) continue; /* (not a candidate) */
            if (cur[w] == at[2 * w]) fits = 0;
            else c[cur[w]++] = (Adm){(int32_t)w, 0, r, a->ready[r], a->ctx[r]};
        }
        for (Py_ssize_t k = 0; k < K && fits; k++) fits = cur[k] == at[2 * k];
        free(cur);
        if (!fits) { /* the order holds every queued turn under way, refreshed before admission */
            PyErr_SetString(PyExc_SystemError, "admit: the kept order of the queued turns is not the queue");
            rc = -2;
            goto out;
        }
    }
    rc = 0;
    for (Py_ssize_t q = 0; q < runs && rc == 0; q++) {
        if (ordered && q % 2 == 0) continue;
        Py_ssize_t start = q ? at[q - 1] : 0, len = at[q] - start, i = 1;
        while (i < len && !adm_ready_less(&c[start + i], &c[start + i - 1])) i++;
        if (i < len) rc = sort_adm_ready(c + start, len);
    }
out:
    free(tmp);
    free(at);
    return rc;
}

/* `_admit_queued` after the steal on raw arrays: the admitted requests into `go` (in admission order), their
   states written; -1 with an exception set on bad input or no memory */
int sn_admit_core(const AdmitIn *a, IVec *go, int *touched) {
    const int64_t *waiting = a->waiting, *seats = a->seats, *run_k = a->run_k, *where = a->where, *itp = a->itp,
                  *fk = a->fk;
    const uint8_t *open_k = a->open_k;
    const double *ready = a->ready, *ctx = a->ctx, *ft = a->ft;
    uint8_t *fresh = a->fresh;
    double *pending = a->pending, *lag = a->lag, *debt = a->debt;
    int8_t *state = a->state;
    int64_t *refilled = a->refilled;
    Py_ssize_t n = a->n, K = a->K, nw = a->nw, nf = a->nf, ndeg = a->ndeg;
    double t = a->t;
    Adm *c = NULL;
    double *room = NULL, *credit = NULL, *secs = NULL;
    int64_t *go_rank = NULL;
    int rc = -1;
    if (K > INT32_MAX) { /* (a candidate keeps its instance in 32 bits) */
        PyErr_SetString(PyExc_ValueError, "admit: too many instances");
        goto fail;
    }
    for (Py_ssize_t j = 0; j < nf; j++) {
        if (fk[j] < 0 || fk[j] >= K || (j && (fk[j] < fk[j - 1] || (fk[j] == fk[j - 1] && ft[j] < ft[j - 1])))) {
            PyErr_SetString(PyExc_ValueError, "admit: the freed slots must be sorted by (instance, time)");
            goto fail;
        }
    }
    c = malloc(((size_t)nw + 1) * sizeof(Adm));
    room = malloc(((size_t)K + 1) * sizeof(double));
    if (!c || !room) goto nomem;
    memcpy(room, a->room, (size_t)K * sizeof(double));
    Py_ssize_t nc = 0;
    for (Py_ssize_t i = 0; i < nw; i++) {
        int64_t r = waiting[i];
        if (r < 0 || r >= n || where[r] < -1 || where[r] >= K) {
            PyErr_SetString(PyExc_ValueError, "admit: a waiting request's index or instance is out of range");
            goto fail;
        }
        int64_t w = where[r];
        if (w >= 0 && open_k[w]) {
            c[nc] = (Adm){(int32_t)w, fresh[r], r, ready[r], ctx[r]};
            nc++;
        }
    }
    if (nc) {
        int sorted = sort_candidates(&c, nc, K, a);
        if (sorted == -2) goto fail;
        if (sorted < 0) goto nomem;
        go_rank = malloc((size_t)nc * sizeof(int64_t));
        if (!go_rank) goto nomem;
        /* the running sum over all candidates, each one's within its instance (a difference of two running sums, as
           the reference's cumsum gives it); an idle instance keeps headroom in units of its first candidate's
           context; the admitted kept, in order, with their rank */
        double cs = 0.0, base = 0.0;
        int64_t rk = 0, prev = -1;
        Py_ssize_t ng = 0;
        for (Py_ssize_t i = 0; i < nc; i++) {
            Adm x = c[i];
            double need = x.ctx;
            cs += need;
            if (x.k != prev) {
                rk = 0;
                base = cs - need;
                prev = x.k;
                if (run_k[x.k] == 0) room[x.k] -= a->headroom * need;
            } else {
                rk++;
            }
            double within = cs - base;
            if ((within <= room[x.k] && rk < seats[x.k]) || (rk == 0 && run_k[x.k] == 0)) {
                c[ng] = x; /* (ng <= i: nothing not yet read is written) */
                go_rank[ng] = rk;
                ng++;
            }
        }
        secs = malloc(((size_t)ng + 1) * sizeof(double));
        credit = malloc(((size_t)ng + 1) * sizeof(double));
        if (!secs || !credit) goto nomem;
        for (Py_ssize_t i = 0; i < ng; i++) {
            int64_t r = c[i].r;
            const Degree *d = NULL;
            for (Py_ssize_t q = 0; q < ndeg; q++)
                if (a->deg[q].tp == itp[c[i].k]) d = &a->deg[q];
            if (!d) {
                PyErr_SetString(PyExc_SystemError, "admit: an instance's degree is not in the table");
                goto fail;
            }
            secs[i] = (fresh[r] ? a->overhead : 0.0) + sn_prefill(d, a->work0, a->attn, pending[r], ctx[r] / 2.0);
        }
        for (Py_ssize_t i = 0; i < ng;) { /* debt += np.bincount(gk, weights=secs) */
            int64_t k = c[i].k;
            double sum = 0.0;
            for (; i < ng && c[i].k == k; i++) sum += secs[i];
            debt[k] += sum;
        }
        /* `_credit`: the j-th admitted to an instance takes its j-th freed slot (after those refilled earlier at
           this boundary), from when both it was free and the request ready */
        for (Py_ssize_t i = 0; i < ng; i++) {
            credit[i] = 0.0;
            if (nf == 0) continue;
            int64_t k = c[i].k;
            Py_ssize_t lo = 0, hi = nf;
            while (lo < hi) {
                Py_ssize_t mid = lo + ((hi - lo) >> 1);
                if (fk[mid] < k) lo = mid + 1;
                else hi = mid;
            }
            Py_ssize_t first = lo;
            hi = nf;
            while (lo < hi) {
                Py_ssize_t mid = lo + ((hi - lo) >> 1);
                if (fk[mid] <= k) lo = mid + 1;
                else hi = mid;
            }
            int64_t slot = go_rank[i] + refilled[k];
            if (slot < (int64_t)(lo - first)) {
                double since = np_max(ft[first + slot], ready[c[i].r]);
                credit[i] = np_max(0.0, t - since);
            }
        }
        for (Py_ssize_t i = 0; i < ng; i++) {
            int64_t r = c[i].r;
            if (nf) refilled[c[i].k] += 1;
            lag[r] = np_max(0.0, ready[r] - t) - credit[i];
            pending[r] = 0.0;
            fresh[r] = 0;
            if (state[r] != RUN) {
                *touched |= (1 << state[r]) | (1 << RUN);
                state[r] = RUN;
            }
            if (ivec_push(go, r) < 0) goto nomem;
        }
    }
    rc = 0;
    goto out;
nomem:
    PyErr_NoMemory();
fail:
out:
    free(c);
    free(room);
    free(go_rank);
    free(secs);
    free(credit);
    return rc;
}

/* --- a slice boundary's whole admission: `Admission._admit` ------------------------------------------------- */
typedef struct {
    int64_t k;
    double t;
} Slot;

/* np.lexsort((ft, fk)): by instance, then time, stable */
static inline int slot_less(const Slot *a, const Slot *b) { return a->k != b->k ? a->k < b->k : a->t < b->t; }

DEFINE_STABLE_SORT(sort_slots, Slot, slot_less)

enum {
    S_LIVE, S_STATE, S_WHERE, S_READY, S_FRESH, S_CTX, S_PENDING, S_LAG, S_STOLEN, S_DEBT, S_REFILLED, S_ACTIVE,
    S_READY_AT, S_IBUCKET, S_ITP, S_CAP, S_FK, S_FT, S_DEGREES, S_OIDS, S_OREADY, S_OMARK, S_OLEN, N_SLICE_ADMIT
};

static const Spec SLICE_ADMIT_SPEC[N_SLICE_ADMIT] = {
    {'q', '*', 0}, {'b', 'n', 1}, {'q', 'n', 1}, {'d', 'n', 0}, {'?', 'n', 1}, {'d', 'n', 0}, {'d', 'n', 1},
    {'d', 'n', 1}, {'?', 'n', 1}, {'d', 'K', 1}, {'q', 'K', 1}, {'?', 'K', 0}, {'d', 'K', 0}, {'q', 'K', 0},
    {'q', 'K', 0}, {'d', 'K', 0}, {'q', '*', 0}, {'d', '*', 0}, {'d', '*', 0},
    {'q', 'n', 1}, {'d', 'n', 1}, {'?', 'n', 1}, {'q', '*', 1},
};

/* keeps the requests of `reqs` still in WAIT, in order; their count. `queued[k]`: some of them are on instance k;
   `*bad`: one has no valid instance (the steal, which reads them all, says so) */
static Py_ssize_t still_waiting(int64_t *reqs, Py_ssize_t n, const int8_t *state, const int64_t *where, Py_ssize_t K,
                                uint8_t *queued, int *bad) {
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < K; j++) queued[j] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = reqs[i];
        if (state[r] != WAIT) continue;
        reqs[kept++] = r;
        if (where[r] < 0 || where[r] >= K) *bad = 1;
        else queued[where[r]] = 1;
    }
    return kept;
}

/* admit_slice(arrays, n, K, t, headroom, overhead, max_num_seqs, steal, work0, attn) -> (touched, moved, tokens);
   steal: 0 off, 1 new, 2 all */
PyObject *sn_admit_slice(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, K, m = -1;
    double t, headroom, overhead, work0, attn;
    long long max_seqs;
    int steal;
    if (!PyArg_ParseTuple(args, "O!nndddLidd", &PyTuple_Type, &arrays, &n, &K, &t, &headroom, &overhead, &max_seqs,
                          &steal, &work0, &attn))
        return NULL;
    Buf b[N_SLICE_ADMIT];
    memset(b, 0, sizeof(b));
    Degree deg[MAX_DEG];
    IVec go = {0};
    int64_t *waiting = NULL, *add = NULL, *run_k = NULL, *seats = NULL, *fk = NULL;
    double *used_k = NULL, *room = NULL, *ft = NULL, *added = NULL;
    uint8_t *open_k = NULL, *queued = NULL;
    int bad = 0;
    Slot *slots = NULL;
    long long moved = 0, tokens = 0;
    int touched = 0;
    if (sn_acquire(arrays, SLICE_ADMIT_SPEC, N_SLICE_ADMIT, b, n, 1, K, &m) < 0) goto fail;
    Py_ssize_t ndeg = sn_degrees(D(S_DEGREES), LEN(S_DEGREES), deg), nf = LEN(S_FK), nlive = LEN(S_LIVE);
    if (ndeg < 0 || LEN(S_FT) != nf) {
        PyErr_SetString(PyExc_ValueError, "admit_slice: freed slots or degree table malformed");
        goto fail;
    }
    const int64_t *live = Q(S_LIVE);
    int8_t *state = (int8_t *)b[S_STATE].view.buf;
    int64_t *where = Q(S_WHERE);
    const double *ctx = D(S_CTX);
    waiting = malloc(((size_t)nlive + 1) * sizeof(int64_t));
    add = malloc(((size_t)nlive + 1) * sizeof(int64_t));
    run_k = calloc((size_t)K + 1, sizeof(int64_t));
    used_k = calloc((size_t)K + 1, sizeof(double));
    if (!waiting || !add || !run_k || !used_k) goto nomem;
    /* the kept order of the queued turns under way, its stale entries dropped (they are the same after the scan:
       it writes nothing) */
    Order order;
    const Order *kept = NULL;
    const uint8_t *fresh_r = U(S_FRESH);
    if (sn_order_of(&order, &b[S_OIDS], n, "admit_slice") < 0) goto fail;
    sn_order_drop(&order, state, fresh_r, D(S_READY));
    /* one pass over the live requests: checked, the waiting listed (`_in_state(WAIT)`) with the queued turns
       under way the kept order lacks, and the running counted with their context per instance (np.bincount, in
       the order of the running requests: a stretch of one instance's is summed in a register from the count so
       far, the same additions in the same order) */
    Py_ssize_t nw = 0, nadd = 0;
    int64_t rk = -1, rn = 0;
    double ru = 0.0;
    for (Py_ssize_t i = 0; i < nlive; i++) {
        int64_t r = live[i];
        if (r < 0 || r >= n || state[r] < WAIT || state[r] > DONE || where[r] < -1 || where[r] >= K ||
            (state[r] == RUN && where[r] < 0))
            goto bad_row;
        if (state[r] == WAIT) {
            waiting[nw++] = r;
            if (!fresh_r[r] && !order.mark[r]) add[nadd++] = r;
        } else if (state[r] == RUN) {
            if (where[r] != rk) {
                if (rk >= 0) run_k[rk] = rn, used_k[rk] = ru;
                rk = where[r], rn = run_k[rk], ru = used_k[rk];
            }
            rn++;
            ru += ctx[r];
        }
    }
    if (rk >= 0) run_k[rk] = rn, used_k[rk] = ru;
    if (nw == 0) goto done; /* nothing to admit */
    /* the queued turns since the last slice merged into the kept order */
    {
        int got = sn_order_add(&order, add, nadd, D(S_READY));
        if (got < 0) goto fail;
        if (got == 0) kept = &order;
    }
    seats = malloc(((size_t)K + 1) * sizeof(int64_t));
    room = malloc(((size_t)K + 1) * sizeof(double));
    added = malloc(((size_t)K + 1) * sizeof(double));
    open_k = malloc((size_t)K + 1);
    queued = malloc((size_t)K + 1);
    slots = malloc(((size_t)nf + 1) * sizeof(Slot));
    fk = malloc(((size_t)nf + 1) * sizeof(int64_t));
    ft = malloc(((size_t)nf + 1) * sizeof(double));
    if (!seats || !room || !added || !open_k || !queued || !slots || !fk || !ft) goto nomem;
    /* the freed slots by instance, earliest first, once for both passes */
    for (Py_ssize_t j = 0; j < nf; j++) {
        if (Q(S_FK)[j] < 0 || Q(S_FK)[j] >= K) {
            PyErr_SetString(PyExc_ValueError, "admit_slice: a freed slot's instance is out of range");
            goto fail;
        }
        slots[j] = (Slot){Q(S_FK)[j], D(S_FT)[j]};
    }
    if (sort_slots(slots, nf) < 0) goto nomem;
    for (Py_ssize_t j = 0; j < nf; j++) fk[j] = slots[j].k, ft[j] = slots[j].t;
    const double *cap = D(S_CAP), *ready_at = D(S_READY_AT);
    const uint8_t *active = U(S_ACTIVE);
    for (int pass = 0; pass < 2; pass++) {
        /* `_admit_queued`: each instance's room, seats and whether it is open */
        int any_open = 0;
        for (Py_ssize_t j = 0; j < K; j++) {
            double mean = used_k[j] / (double)(run_k[j] > 1 ? run_k[j] : 1);
            room[j] = cap[j] - used_k[j] - headroom * mean;
            seats[j] = (int64_t)max_seqs - run_k[j];
            open_k[j] = active[j] && ready_at[j] <= t && seats[j] > 0 && (room[j] > 0 || run_k[j] == 0);
            any_open |= open_k[j];
        }
        if (!any_open) break; /* (None: no second pass) */
        if (pass == 1) {
            int thief = bad; /* an open instance with nothing queued: else the steal has nothing to do */
            for (Py_ssize_t j = 0; j < K && !thief; j++) thief = open_k[j] && !queued[j];
            if (!thief) break;
            StealIn s = {
                .n = n, .K = K, .ndeg = ndeg, .nw = nw, .waiting = waiting, .open_k = open_k, .room = room,
                .seats = seats, .where = where, .fresh = U(S_FRESH), .ready = D(S_READY), .ctx = ctx,
                .pending = D(S_PENDING), .stolen = U(S_STOLEN), .ready_at = ready_at, .ibucket = Q(S_IBUCKET),
                .itp = Q(S_ITP), .deg = deg, .t = t, .headroom = headroom, .work0 = work0, .attn = attn,
                .all = steal == 2, .order = kept, .state = state,
            };
            int stole = sn_steal_core(&s, &moved, &tokens);
            if (stole < 0) goto fail;
            if (!stole) break;
        }
        go.n = 0;
        AdmitIn a = {
            .n = n, .K = K, .ndeg = ndeg, .nw = nw, .nf = nf, .waiting = waiting, .open_k = open_k, .room = room,
            .seats = seats, .run_k = run_k, .where = where, .ready = D(S_READY), .fresh = U(S_FRESH), .ctx = ctx,
            .pending = D(S_PENDING), .lag = D(S_LAG), .state = state, .debt = D(S_DEBT), .refilled = Q(S_REFILLED),
            .itp = Q(S_ITP), .fk = fk, .ft = ft, .deg = deg, .t = t, .headroom = headroom, .overhead = overhead,
            .work0 = work0, .attn = attn, .order = kept,
        };
        if (sn_admit_core(&a, &go, &touched) < 0) goto fail;
        if (pass == 1 || steal == 0) break;
        /* the admitted join the running (np.bincount of them, added): then the steal, if any still wait */
        for (Py_ssize_t j = 0; j < K; j++) added[j] = 0.0;
        for (Py_ssize_t i = 0; i < go.n; i++) {
            run_k[where[go.p[i]]]++;
            added[where[go.p[i]]] += ctx[go.p[i]];
        }
        for (Py_ssize_t j = 0; j < K; j++) used_k[j] += added[j];
        nw = still_waiting(waiting, nw, state, where, K, queued, &bad); /* the first pass's left, ascending */
        if (nw == 0) break;
    }
done:
    result = Py_BuildValue("iLL", touched, moved, tokens);
    goto out;
bad_row:
    PyErr_SetString(PyExc_ValueError, "admit_slice: a live request's index, state or instance is out of range");
    goto fail;
nomem:
    PyErr_NoMemory();
fail:
out:
    sn_release(b, N_SLICE_ADMIT);
    free(go.p);
    free(waiting);
    free(add);
    free(run_k);
    free(seats);
    free(used_k);
    free(room);
    free(added);
    free(open_k);
    free(queued);
    free(slots);
    free(fk);
    free(ft);
    return result;
}
