/* A slice's decoding, `SliceDecode._decode` (libra/sim/slices.py): the step times
   (RolloutCost.decode_step_time), the decode pass (pass.c), the check at the batch the slice really ran at and
   the second pass, the busy GPU-seconds, the capacity and the instances' debt. */

#include "slice_native.h"

/* the arrays of `decode_slice`, in the order libra/sim/native.py packs them */
enum {
    A_REM, A_CTX, A_PENDING, A_READY, A_FINISH, A_LAG, A_OWN, A_STATE, A_TURN, A_MOVED, A_STOLEN, A_FRESH,
    A_WHERE, A_NSEG, A_TOOL_END, A_TOOL_TOK, A_LATENCY, A_GEN, A_CARRIED, A_RBUCKET, A_IBUCKET, A_ITP, A_CAP,
    A_ACTIVE, A_READY_AT, A_DEBT, A_LATER_DEBT, A_BUSY_UNTIL, A_OCC_BEFORE, A_OCCUPANCY, A_DEC_S, A_SPAN_END,
    A_STEP_OUT, A_LIVE, A_FK, A_FT, A_DEGREES, A_DECODE, A_OIDS, A_OREADY, A_OMARK, A_OLEN, N_ARRAYS
};

/* kind: 'd' float64, 'q' int64, 'b' int8, '?' bool; size: 'n' requests, 'w' requests x width, 'K' instances,
   'm' running requests, '*' any */
static const Spec SPEC[N_ARRAYS] = {
    {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1},
    {'b', 'n', 1}, {'q', 'n', 1}, {'?', 'n', 1}, {'?', 'n', 0}, {'?', 'n', 0}, {'q', 'n', 0}, {'q', 'n', 0},
    {'?', 'w', 0}, {'q', 'w', 0}, {'d', 'w', 0}, {'q', 'w', 0}, {'q', 'w', 0}, {'q', 'w', 0}, {'q', 'K', 0},
    {'q', 'K', 0}, {'d', 'K', 0}, {'?', 'K', 0}, {'d', 'K', 0}, {'d', 'K', 1}, {'d', 'K', 1}, {'d', 'K', 1},
    {'d', '*', 0}, {'d', 'K', 1}, {'d', 'K', 1}, {'d', 'K', 1}, {'d', 'K', 1}, {'q', '*', 0}, {'q', '*', 0},
    {'d', '*', 0}, {'d', '*', 0}, {'d', '*', 0}, {'q', 'n', 1}, {'d', 'n', 1}, {'?', 'n', 1}, {'q', '*', 1},
};

/* --- the step time of a decode iteration: RolloutCost.decode_step_time ------------------------------------- */
enum { DEC_FIELDS = 20 };

typedef struct {
    int64_t tp;
    int moe;
    double W, E, ept, L, P, B, kvpt, hbm, dden, so, pso, tpo, a, H, Bd, lat, bw, L2;
} Dec;

static void dec_of_row(Dec *d, const double *row) {
    *d = (Dec){(int64_t)row[0], row[2] != 0.0, row[1], row[3], row[4], row[5], row[6], row[7], row[8], row[9],
               row[10], row[11], row[12], row[13], row[14], row[15], row[16], row[17], row[18], row[19]};
}

/* operand by operand as `_decode_step` (terms: RolloutCost.decode_terms) */
static double decode_step(const Dec *d, double work0, double attn, double batch, double context) {
    double work = work0 + attn * context;
    double weights = d->W;
    if (d->moe) {
        double touched = np_min(d->E, batch * d->ept);
        weights = d->W - d->L * (d->E - touched) * d->P * d->B;
    }
    double kv_bytes = batch * context * d->kvpt;
    double mem = (weights / (double)d->tp + kv_bytes) / d->hbm;
    double compute = batch * work / d->dden;
    double overhead = d->so + d->pso * batch + d->tpo;
    double comm = d->tp == 1 ? 0.0 * batch : d->L2 * (d->lat + d->a * batch * d->H * d->Bd / d->bw);
    return np_max(mem, compute) + comm + overhead;
}

typedef struct {
    Dec dec[MAX_DEG];
    Py_ssize_t ndec;
    double max_seqs, preemption, max_churn;
} Steps;

static const Dec *dec_for(const Steps *st, int64_t tp) {
    for (Py_ssize_t i = 0; i < st->ndec; i++)
        if (st->dec[i].tp == tp) return &st->dec[i];
    return NULL;
}

/* `step_times`: per instance the engine step time at `batch` (inf where it runs nothing), from the running
   contexts' sum and the requests queued */
static int step_times(const Steps *st, const Pass *P, const double *batch, const double *ctx_k, const int64_t *queued_k,
                      double *out) {
    for (Py_ssize_t j = 0; j < P->K; j++) {
        double bb = batch[j];
        if (!(bb > 0)) {
            out[j] = INFINITY;
            continue;
        }
        const Dec *d = dec_for(st, P->itp[j]);
        if (!d) {
            PyErr_SetString(PyExc_SystemError, "slice kernel: an instance's degree is not in the decode table");
            return -1;
        }
        double step = decode_step(d, P->work0, P->attn, bb, ctx_k[j] / bb);
        int kv_bound = queued_k[j] > 0 && bb < st->max_seqs;
        double churn = 1.0 + np_min(st->preemption / bb, st->max_churn);
        out[j] = step * (kv_bound ? churn : 1.0);
    }
    return 0;
}

/* `_step_inputs`, its first half: the running contexts' sum per instance, in `running`'s order (the requests
   queued and ready come from `sn_slice_lists`) */
static void running_ctx(const Pass *P, const int64_t *running, Py_ssize_t m, double *ctx_k) {
    const int64_t *where = P->where;
    const double *ctx = P->ctx;
    for (Py_ssize_t j = 0; j < P->K; j++) ctx_k[j] = 0.0;
    /* a stretch of one instance's requests (they come together) is summed in a register from the sum so far: the
       same additions in the same order as one sum in memory per request, without each waiting on the last */
    int64_t k = -1;
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t w = where[running[i]];
        if (w != k) {
            if (k >= 0) ctx_k[k] = sum;
            k = w;
            sum = ctx_k[w];
        }
        sum += ctx[running[i]];
    }
    if (k >= 0) ctx_k[k] = sum;
}

/* What a second pass starts from: the rows the first one wrote (its undo log: the running requests, saved before
   it starts, and each request it takes back, saved before it is first written: a pass writes no other row), the
   freed slots and the tokens decoded */
typedef struct {
    RowVec rows;
    IVec fk;
    DVec ft;
    double decoded;
} Saved;

static int save(Pass *P, Saved *sv, const int64_t *running, Py_ssize_t m) {
    if (!(P->kept = calloc((size_t)P->n + 1, 1))) return -1;
    sv->rows.cap = m + 64; /* the running rows and room for the turns taken back (it grows beyond) */
    if (!(sv->rows.p = malloc((size_t)sv->rows.cap * sizeof(Row)))) return -1;
    P->undo = &sv->rows;
    for (Py_ssize_t i = 0; i < m; i++)
        if (sn_keep_row(P, running[i]) < 0) return -1;
    for (Py_ssize_t j = 0; j < P->fk.n; j++)
        if (ivec_push(&sv->fk, P->fk.p[j]) < 0 || dvec_push(&sv->ft, P->ft.p[j]) < 0) return -1;
    sv->decoded = P->decoded;
    return 0;
}

static int restore(Pass *P, const Saved *sv) {
    for (Py_ssize_t i = 0; i < sv->rows.n; i++) {
        const Row *x = &sv->rows.p[i];
        int64_t r = x->r;
        P->rem[r] = x->f[0], P->ctx[r] = x->f[1], P->pending[r] = x->f[2], P->ready[r] = x->f[3];
        P->finish[r] = x->f[4], P->lag[r] = x->f[5], P->own[r] = x->f[6];
        P->turn[r] = x->turn;
        P->state[r] = x->state;
        P->moved[r] = x->moved;
    }
    P->fk.n = P->ft.n = 0;
    for (Py_ssize_t j = 0; j < sv->fk.n; j++)
        if (ivec_push(&P->fk, sv->fk.p[j]) < 0 || dvec_push(&P->ft, sv->ft.p[j]) < 0) return -1;
    P->decoded = sv->decoded;
    for (Py_ssize_t j = 0; j < P->K; j++) P->later_debt[j] = 0.0;
    return 0;
}

static void free_saved(Pass *P, Saved *sv) {
    free(sv->rows.p);
    free(sv->fk.p);
    free(sv->ft.p);
    free(P->kept);
    P->kept = NULL;
    P->undo = NULL;
}

PyObject *sn_decode_slice(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, S, K, m = -1;
    double t, dt, decoded, headroom, work0, attn, max_seqs, preemption, max_churn, tolerance, min_slice, max_slice;
    if (!PyArg_ParseTuple(args, "O!nnndddddddddddd", &PyTuple_Type, &arrays, &n, &S, &K, &t, &dt, &decoded,
                          &headroom, &work0, &attn, &max_seqs, &preemption, &max_churn, &tolerance, &min_slice,
                          &max_slice))
        return NULL;
    Buf b[N_ARRAYS];
    memset(b, 0, sizeof(b));
    Pass P;
    memset(&P, 0, sizeof(P));
    Steps st;
    memset(&st, 0, sizeof(st));
    Saved sv;
    memset(&sv, 0, sizeof(sv));
    IVec still = {0};
    PassIn in = {0};
    int64_t *count_k = NULL, *queued_k = NULL, *keep = NULL, *tools = NULL, *live_k = NULL;
    double *used = NULL, *ctx_k = NULL, *step2 = NULL, *real = NULL, *busy = NULL, *cap_ctx = NULL, *live_ctx = NULL;
    double *busy_end = NULL, *busy_start = NULL;
    double busy_sum = 0.0, capacity = 0.0;
    if (sn_acquire(arrays, SPEC, N_ARRAYS, b, n, S, K, &m) < 0) goto fail;
    if (LEN(A_FK) != LEN(A_FT) || LEN(A_DEGREES) % DEG_FIELDS || LEN(A_DEGREES) / DEG_FIELDS > MAX_DEG ||
        LEN(A_DECODE) % DEC_FIELDS || LEN(A_DECODE) / DEC_FIELDS > MAX_DEG) {
        PyErr_SetString(PyExc_ValueError, "decode_slice: freed slots or degree tables malformed");
        goto fail;
    }
    P.n = n, P.S = S, P.K = K;
    P.rem = D(A_REM), P.ctx = D(A_CTX), P.pending = D(A_PENDING), P.ready = D(A_READY);
    P.finish = D(A_FINISH), P.lag = D(A_LAG), P.own = D(A_OWN);
    P.state = (int8_t *)b[A_STATE].view.buf;
    P.turn = Q(A_TURN), P.moved = U(A_MOVED), P.stolen = U(A_STOLEN), P.fresh = U(A_FRESH);
    P.where = Q(A_WHERE), P.nseg = Q(A_NSEG), P.tool_end = U(A_TOOL_END), P.tool_tok = Q(A_TOOL_TOK);
    P.latency = D(A_LATENCY), P.gen = Q(A_GEN), P.carried = Q(A_CARRIED), P.rbucket = Q(A_RBUCKET);
    P.ibucket = Q(A_IBUCKET), P.itp = Q(A_ITP), P.cap = D(A_CAP);
    P.later_debt = D(A_LATER_DEBT), P.dec_s = D(A_DEC_S);
    P.live = Q(A_LIVE), P.nlive = LEN(A_LIVE);
    P.headroom = headroom, P.work0 = work0, P.attn = attn, P.slice_end = t + dt, P.decoded = decoded;
    P.ndeg = sn_degrees(D(A_DEGREES), LEN(A_DEGREES), P.deg); /* (checked above) */
    st.ndec = LEN(A_DECODE) / DEC_FIELDS;
    for (Py_ssize_t i = 0; i < st.ndec; i++) dec_of_row(&st.dec[i], D(A_DECODE) + i * DEC_FIELDS);
    st.max_seqs = max_seqs, st.preemption = preemption, st.max_churn = max_churn;
    for (Py_ssize_t i = 0; i < LEN(A_FK); i++) {
        if (Q(A_FK)[i] < 0 || Q(A_FK)[i] >= K) {
            PyErr_SetString(PyExc_ValueError, "decode_slice: a freed slot's instance is out of range");
            goto fail;
        }
        if (ivec_push(&P.fk, Q(A_FK)[i]) < 0 || dvec_push(&P.ft, D(A_FT)[i]) < 0) goto nomem;
    }
    if (sn_merge_new_slots(&P, 0) < 0) goto nomem;
    double *debt = D(A_DEBT), *occ = D(A_OCCUPANCY), *span_end = D(A_SPAN_END), *step = D(A_STEP_OUT);
    const double *ready_at = D(A_READY_AT);
    const uint8_t *active = U(A_ACTIVE);
    count_k = malloc(((size_t)K + 1) * sizeof(int64_t));
    queued_k = malloc(((size_t)K + 1) * sizeof(int64_t));
    used = malloc(((size_t)K + 1) * sizeof(double));
    ctx_k = malloc(((size_t)K + 1) * sizeof(double));
    step2 = malloc(((size_t)K + 1) * sizeof(double));
    real = malloc(((size_t)K + 1) * sizeof(double));
    busy = malloc(((size_t)K + 1) * sizeof(double));
    busy_end = malloc(((size_t)K + 1) * sizeof(double));
    busy_start = malloc(((size_t)K + 1) * sizeof(double));
    cap_ctx = malloc(((size_t)K + 1) * sizeof(double));
    in.running = malloc(((size_t)P.nlive + 1) * sizeof(int64_t));
    if (!count_k || !queued_k || !used || !ctx_k || !step2 || !real || !busy || !busy_end || !busy_start || !cap_ctx ||
        !in.running)
        goto nomem;
    P.t0 = t;
    Order order;
    if (sn_order_of(&order, &b[A_OIDS], n, "decode_slice") < 0) goto fail;
    P.order = &order;
    if (sn_slice_lists(&P, in.running, &in.m, count_k, queued_k) < 0) goto fail;
    for (Py_ssize_t j = 0; j < K; j++) P.later_debt[j] = 0.0;
    int ran = in.m > 0;
    if (ran) {
        Py_ssize_t mm = in.m;
        in.k = malloc(((size_t)mm + 1) * sizeof(int64_t));
        in.t_delay = malloc(((size_t)mm + 1) * sizeof(double));
        in.go_s = malloc(((size_t)mm + 1) * sizeof(double));
        in.rem0 = malloc(((size_t)mm + 1) * sizeof(double));
        in.first = malloc(((size_t)K + 1) * sizeof(double));
        in.open_s = malloc(((size_t)K + 1) * sizeof(double));
        in.has = malloc((size_t)K + 1);
        in.occupied = malloc((size_t)K + 1);
        if (!in.k || !in.t_delay || !in.go_s || !in.rem0 || !in.first || !in.open_s || !in.has || !in.occupied)
            goto nomem;
        if (save(&P, &sv, in.running, mm) < 0) goto nomem;
        /* `step_batch`: the running requests, scaled by the last slice's occupancy */
        const double *occ_before = D(A_OCC_BEFORE);
        int scale = LEN(A_OCC_BEFORE) == K;
        for (Py_ssize_t j = 0; j < K; j++) {
            double bj = (double)count_k[j];
            used[j] = (scale && bj > 0) ? np_max(1.0, bj * occ_before[j]) : bj;
        }
        running_ctx(&P, in.running, mm, ctx_k);
        /* `_pass_inputs` */
        for (Py_ssize_t j = 0; j < K; j++) {
            double avail = np_max(0.0, dt - debt[j]);
            in.first[j] = t + dt;
            in.has[j] = count_k[j] > 0;
            in.open_s[j] = np_max(1e-9, avail * (double)count_k[j]);
            in.occupied[j] = in.has[j] && avail > 0;
            busy_start[j] = 0.0;
        }
        for (Py_ssize_t i = 0; i < mm; i++) {
            int64_t r = in.running[i], k = P.where[r];
            double lag = P.lag[r], owed = np_min(debt[k], dt);
            double delay = lag < 0 ? owed + lag : np_max(owed, lag);
            in.k[i] = k;
            in.first[k] = np_min(in.first[k], t + np_min(delay, dt));
            in.t_delay[i] = t + delay;
            in.go_s[i] = np_max(0.0, dt - delay);
            in.rem0[i] = P.rem[r];
            busy_start[k] = np_min(busy_start[k], lag); /* `_decode`'s `start` */
        }
        if (step_times(&st, &P, used, ctx_k, queued_k, step) < 0) goto fail;
        P.step = step;
        if (sn_run_pass(&P, &in, t, dt, span_end, busy_end, occ, real, &still) < 0) goto fail_or_nomem;
        /* the batch each instance really ran at; decoded again where it moves the step time past the tolerance */
        for (Py_ssize_t j = 0; j < K; j++) real[j] = real[j] > 0 ? real[j] : used[j];
        int64_t *queued_now = malloc(((size_t)K + 1) * sizeof(int64_t));
        double *ctx_now = malloc(((size_t)K + 1) * sizeof(double));
        if (!queued_now || !ctx_now) {
            free(queued_now);
            free(ctx_now);
            goto nomem;
        }
        /* a pass puts no request in WAIT and moves none: the queued and ready ones are those at the slice start
           but the ones it took back */
        running_ctx(&P, in.running, mm, ctx_now);
        for (Py_ssize_t j = 0; j < K; j++) queued_now[j] = queued_k[j] - P.left_wait[j];
        int bad = step_times(&st, &P, real, ctx_now, queued_now, step2);
        free(queued_now);
        free(ctx_now);
        if (bad < 0) goto fail;
        P.undo = NULL; /* the second pass needs no log */
        int off = 0;
        for (Py_ssize_t j = 0; j < K; j++)
            if (isfinite(step[j]) && fabs(step2[j] - step[j]) > tolerance * step[j]) off = 1;
        if (off) {
            if (restore(&P, &sv) < 0) goto nomem;
            if (step_times(&st, &P, real, ctx_k, queued_k, step) < 0) goto fail;
            if (sn_run_pass(&P, &in, t, dt, span_end, busy_end, occ, real, &still) < 0) goto fail_or_nomem;
        }
    }
    /* `_busy`: per instance, seconds into the slice from its first request's work (where that is before the
       slice start) to its last segment's end, at least its owed prefill, less what an earlier slice counted */
    double *busy_until = D(A_BUSY_UNTIL);
    for (Py_ssize_t j = 0; j < K; j++) {
        double end = 0.0, start = 0.0;
        if (ran) {
            end = busy_end[j] >= t + dt ? dt : busy_end[j] - t;
            start = busy_start[j];
        }
        end = np_max(np_min(debt[j], dt), end);
        start = np_max(start, busy_until[j] - t);
        busy[j] = np_max(0.0, end - start);
        busy_until[j] = np_max(busy_until[j], t + end);
    }
    /* busy_gpu_s += (busy_k * tp).sum() */
    for (Py_ssize_t j = 0; j < K; j++) busy[j] = busy[j] * (double)P.itp[j];
    busy_sum = sn_np_sum(busy, K);
    /* one scan of the live requests after the passes: their contexts (for the capacity, where an instance that is
       up ran nothing: the mean context of all stands in for its own), those not DONE where some finished
       (`_in_state(DONE, False)`), those in a tool call (all the next slice's returns need read), and what
       `next_event` at the slice end reads of them */
    double *up = busy; /* reused: the seconds each instance is up in the slice */
    int any = 0, finished = (P.touched & (1 << DONE)) != 0, need_mean = 0;
    for (Py_ssize_t j = 0; j < K; j++) {
        up[j] = np_max(0.0, (t + dt) - np_max(t, ready_at[j])) * (active[j] ? 1.0 : 0.0);
        if (up[j] != 0.0) any = 1;
        if (up[j] > 0 && !(ran && count_k[j] > 0)) need_mean = 1;
    }
    live_ctx = malloc(((size_t)P.nlive + 1) * sizeof(double));
    keep = malloc(((size_t)P.nlive + 1) * sizeof(int64_t));
    tools = malloc(((size_t)P.nlive + 1) * sizeof(int64_t));
    live_k = calloc((size_t)K + 1, sizeof(int64_t)); /* `RolloutRun.load()`: requests not DONE per instance */
    if (!live_ctx || !keep || !tools || !live_k) goto nomem;
    EventIn ein = {
        .n = n, .K = K, .state = P.state, .ready = P.ready, .where = P.where, .ready_at = ready_at, .debt = debt,
        .rem = P.rem, .still = ran ? still.p : NULL, .nstill = ran ? still.n : 0, .step = step, .nstep = K,
        .t = t + dt, .min_slice = min_slice, .max_slice = max_slice, .have_last = ran,
        .starting = sn_starting(ready_at, K, t + dt), .checked = !P.unplaced,
    };
    EventScan ev = {.bad = P.unplaced};
    Py_ssize_t nk = 0, nt = 0;
    int load_ok = 1; /* every placed request's instance is one of the K (else `load()` counts them itself) */
    {
        const int64_t *live = P.live; /* (locals: no store below reloads them) */
        const double *ctx = P.ctx;
        const int8_t *state = P.state;
        const int64_t *where = P.where;
        int64_t lk = -1, ln = 0; /* a stretch of one instance's count, in a register (as `running_ctx` sums) */
        for (Py_ssize_t i = 0; i < P.nlive; i++) {
            int64_t r = live[i];
            if (need_mean) live_ctx[i] = ctx[r];
            if (state[r] != DONE) {
                if (finished) keep[nk++] = r;
                int64_t k = where[r];
                if (k >= K) load_ok = 0;
                else if (k >= 0) {
                    if (k != lk) {
                        if (lk >= 0) live_k[lk] = ln;
                        lk = k;
                        ln = live_k[k];
                    }
                    ln++;
                }
            }
            tools[nt] = r; /* (kept where it is in a tool call: no branch on the state) */
            nt += state[r] == TOOL;
            sn_event_note(&ev, &ein, r);
        }
        if (lk >= 0) live_k[lk] = ln;
    }
    /* `_capacity`: what the started, active instances could decode at their largest batch */
    if (any) {
        double mean_all = 1.0;
        if (P.nlive && need_mean) mean_all = sn_np_sum(live_ctx, P.nlive) / (double)P.nlive;
        if (ran) running_ctx(&P, in.running, in.m, ctx_k);
        for (Py_ssize_t j = 0; j < K; j++) {
            double c = mean_all;
            if (ran && count_k[j] > 0) c = ctx_k[j] / (double)(count_k[j] > 1 ? count_k[j] : 1);
            cap_ctx[j] = c;
            double bb = floor(P.cap[j] / np_max(c, 1.0));
            bb = bb > 1.0 ? bb : 1.0; /* np.clip(x, 1, max_num_seqs) */
            used[j] = bb < max_seqs ? bb : max_seqs;
        }
        /* per degree, ascending, a pairwise sum over its instances in index order */
        int64_t done_tp = 0;
        for (;;) {
            int64_t tp = -1;
            for (Py_ssize_t j = 0; j < K; j++)
                if (P.itp[j] > done_tp && (tp < 0 || P.itp[j] < tp)) tp = P.itp[j];
            if (tp < 0) break;
            const Dec *d = dec_for(&st, tp);
            if (!d) {
                PyErr_SetString(PyExc_SystemError, "slice kernel: an instance's degree is not in the decode table");
                goto fail;
            }
            Py_ssize_t q = 0;
            for (Py_ssize_t j = 0; j < K; j++)
                if (P.itp[j] == tp && up[j] > 0)
                    step2[q++] = up[j] * used[j] / decode_step(d, work0, attn, used[j], cap_ctx[j]);
            if (q) capacity += sn_np_sum(step2, q);
            done_tp = tp;
        }
    }
    for (Py_ssize_t j = 0; j < K; j++) debt[j] = np_max(0.0, debt[j] - dt) + P.later_debt[j];
    double next_at = NAN; /* (left NaN on a bad row: the caller asks `next_event` itself, which names it) */
    if (sn_event_time(ev, ein, &next_at) < 0) PyErr_Clear();
    {
        PyObject *s = ran ? sn_to_bytearray(still.p, still.n * (Py_ssize_t)sizeof(int64_t)) : Py_NewRef(Py_None);
        PyObject *f1 = sn_to_bytearray(P.fk.p, P.fk.n * (Py_ssize_t)sizeof(int64_t));
        PyObject *f2 = sn_to_bytearray(P.ft.p, P.ft.n * (Py_ssize_t)sizeof(double));
        PyObject *left = finished ? sn_to_bytearray(keep, nk * (Py_ssize_t)sizeof(int64_t)) : Py_NewRef(Py_None);
        PyObject *in_tool = sn_to_bytearray(tools, nt * (Py_ssize_t)sizeof(int64_t));
        PyObject *loads = load_ok ? sn_to_bytearray(live_k, K * (Py_ssize_t)sizeof(int64_t)) : Py_NewRef(Py_None);
        if (s && f1 && f2 && left && in_tool && loads)
            result = Py_BuildValue("dddNNNiNdNN", P.decoded, busy_sum, capacity, s, f1, f2, P.touched, left, next_at,
                                   in_tool, loads);
        else {
            Py_XDECREF(s);
            Py_XDECREF(f1);
            Py_XDECREF(f2);
            Py_XDECREF(left);
            Py_XDECREF(in_tool);
            Py_XDECREF(loads);
        }
    }
    goto out;
fail_or_nomem:
    if (PyErr_Occurred()) goto fail;
nomem:
    PyErr_NoMemory();
fail:
out:
    sn_release(b, N_ARRAYS);
    sn_free_lists(&P);
    free(P.fk.p);
    free(P.ft.p);
    free_saved(&P, &sv);
    free(still.p);
    free(in.running);
    free(in.k);
    free(in.t_delay);
    free(in.go_s);
    free(in.rem0);
    free(in.first);
    free(in.open_s);
    free(in.has);
    free(in.occupied);
    free(count_k);
    free(queued_k);
    free(used);
    free(ctx_k);
    free(step2);
    free(real);
    free(busy);
    free(busy_end);
    free(busy_start);
    free(cap_ctx);
    free(live_ctx);
    free(keep);
    free(tools);
    free(live_k);
    return result;
}

PyObject *sn_decode_py(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *row;
    double work0, attn, batch, context, f[DEC_FIELDS];
    if (!PyArg_ParseTuple(args, "O!dddd", &PyTuple_Type, &row, &work0, &attn, &batch, &context)) return NULL;
    if (sn_row_of(row, DEC_FIELDS, f) < 0) return NULL;
    Dec d;
    dec_of_row(&d, f);
    return PyFloat_FromDouble(decode_step(&d, work0, attn, batch, context));
}
