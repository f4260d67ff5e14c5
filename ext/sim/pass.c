/* The decode pass of a slice with the turns that run inside it: `SliceDecode._decode_pass` with
   `_continue_in_slice`, `_end_segments` and `_refill` (libra/sim/slices.py, the reference), the same floats bit
   for bit. The bookkeeping differs only where the reference recomputes sets with numpy calls:
   - the freed slots are kept sorted by (instance, time): the reference sorts them stably where it needs the
     order, and equal pairs are interchangeable;
   - the live requests are listed by instance once a slice (a pass moves no request between instances), so an
     instance's KV room sums only its own requests, in ascending order as `np.bincount` does;
   - the turns under way queued at the slice start are listed by instance once a slice, each instance's run
     sorted by readiness once, on first use: a refill merges the runs of the instances with freed slots with the
     turns back from their tools, in the order of the reference's one stable sort of them all;
   - the turns back from their tools inside the slice are listed once a slice, and a turn that leaves for its
     tool inside the pass is added to that list. */

#include "slice_native.h"

static void set_state(Pass *P, int64_t r, int s) {
    int old = P->state[r];
    if (old != s) {
        P->touched |= (1 << old) | (1 << s);
        P->state[r] = (int8_t)s;
    }
}

static inline int covered(const Pass *P, int64_t r, int64_t seg) {
    return P->stolen[r] && P->rbucket[r * P->S + seg] <= P->ibucket[P->where[r]];
}

static const Degree *degree_of(const Pass *P, int64_t tp) {
    for (Py_ssize_t i = 0; i < P->ndeg; i++)
        if (P->deg[i].tp == tp) return &P->deg[i];
    return NULL;
}

/* --- freed slots ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t k;
    double t;
} Slot;

static inline int slot_less(const Slot *a, const Slot *b) { return a->k < b->k || (a->k == b->k && a->t < b->t); }

DEFINE_STABLE_SORT(sort_slots, Slot, slot_less)

/* sort the slots from `from` on and merge them into the sorted ones before */
int sn_merge_new_slots(Pass *P, Py_ssize_t from) {
    Py_ssize_t n = P->fk.n, m = n - from;
    if (m == 0) return 0;
    Slot *s = malloc((size_t)m * sizeof(Slot));
    if (!s) return -1;
    for (Py_ssize_t q = 0; q < m; q++) s[q] = (Slot){P->fk.p[from + q], P->ft.p[from + q]};
    if (sort_slots(s, m) < 0) {
        free(s);
        return -1;
    }
    /* merged from the back, in place: the later of the two runs' last slots to the end, the old one on a tie (so
       the new one stays after it, as a stable sort of them all leaves it); the old slots before the first new one
       stay where they are */
    int64_t *fk = P->fk.p;
    double *ft = P->ft.p;
    Py_ssize_t i = from - 1, j = m - 1, o = n - 1;
    while (j >= 0) {
        Slot old = {i >= 0 ? fk[i] : 0, i >= 0 ? ft[i] : 0.0};
        if (i >= 0 && slot_less(&s[j], &old)) {
            fk[o] = old.k, ft[o] = old.t;
            i--;
        } else {
            fk[o] = s[j].k, ft[o] = s[j].t;
            j--;
        }
        o--;
    }
    free(s);
    return 0;
}

/* --- the slice's lists ----------------------------------------------------------------------------------- */
typedef struct Cand_ {
    int64_t k, r;
    double ready, ctx; /* ctx: the request's, copied as it is listed (no pass writes a queued request's context,
                          and a turn back from its tool is listed after its tool's tokens were added) */
} Cand;

/* np.lexsort((ready, k)): by instance, then readiness, stable */
static inline int cand_less(const Cand *a, const Cand *b) {
    return a->k < b->k || (a->k == b->k && a->ready < b->ready);
}

static inline int ready_less(const Cand *a, const Cand *b) { return a->ready < b->ready; }

DEFINE_STABLE_SORT(sort_cands, Cand, cand_less)
DEFINE_STABLE_SORT(sort_ready, Cand, ready_less)

/* Two scans of the live requests at the slice start. The first checks each one's indices and lists the running
   requests (ascending, `_in_state(RUN)`) into `running` and counts them per instance into `count_k`, and the
   requests queued and ready per instance into `queued_k` (`_step_inputs`); where some run, it and the second list
   what the passes read: by instance, the requests that can run in the slice (all but the new requests queued, which
   wait for the boundary); the turns under way queued (`_slice_queues`), the new requests queued, the turns whose
   tool returns inside the slice. Both passes start from this state (the second after the first is undone); in a
   pass no request enters WAIT (a pass ends segments and takes requests back), so the queued lists hold for both
   and each refill checks the state of what it takes. -1 with an exception set on bad input or no memory. */
int sn_slice_lists(Pass *P, int64_t *running, Py_ssize_t *m, int64_t *count_k, int64_t *queued_k) {
    Py_ssize_t K = P->K, n = P->n;
    IVec add = {0}; /* queued turns under way not in the kept order yet */
    int64_t *placed = NULL, *fill = NULL;
    int rc = -1;
    P->csr_start = calloc((size_t)K + 1, sizeof(int64_t));
    P->q_start = calloc((size_t)K + 1, sizeof(int64_t));
    P->q_sorted = calloc((size_t)K + 1, 1);
    P->new_k = calloc((size_t)K + 1, sizeof(int64_t));
    P->left_wait = calloc((size_t)K + 1, sizeof(int64_t));
    if (!P->csr_start || !P->q_start || !P->q_sorted || !P->new_k || !P->left_wait) goto nomem;
    *m = 0;
    for (Py_ssize_t j = 0; j < K; j++) count_k[j] = queued_k[j] = 0;
    if (P->order) sn_order_drop(P->order, P->state, P->fresh, P->ready);
    /* new requests, most of the live ones, come in stretches on one instance: a stretch's counts are kept here and
       added once, rather than counters in memory that each wait on the one before; the arrays are read through
       locals, which the stores to the counts cannot alias */
    const int64_t *live = P->live, *where = P->where, *turn = P->turn, *nseg = P->nseg;
    const int8_t *state = P->state;
    const uint8_t *fresh = P->fresh, *mark = P->order ? P->order->mark : NULL;
    const double *ready = P->ready, t0 = P->t0, slice_end = P->slice_end;
    int64_t *q_start = P->q_start, *csr_start = P->csr_start, S = P->S, fw = -1, fq = 0, fn = 0;
    /* the requests on an instance but the new ones queued (what the lists by instance hold), ascending */
    placed = malloc(((size_t)P->nlive + 1) * sizeof(int64_t));
    if (!placed) goto nomem;
    Py_ssize_t nrun = 0, nplaced = 0;
    for (Py_ssize_t i = 0; i < P->nlive; i++) {
        int64_t r = live[i];
        int bad = r < 0 || r >= n;
        int64_t w = bad ? 0 : where[r];
        int st = bad ? WAIT : state[r];
        /* (a new request queued has no segment the passes read: its turn is checked once it runs) */
        if (bad || w < -1 || w >= K || st < WAIT || st > DONE ||
            (!(st == WAIT && fresh[r]) && (turn[r] < 0 || turn[r] >= S || nseg[r] > S || (st == RUN && w < 0)))) {
            PyErr_SetString(PyExc_ValueError, "decode_slice: a live request's index, instance, state or turn is out of range");
            goto out;
        }
        if (st == WAIT && fresh[r]) {
            if (w < 0) {
                P->unplaced = 1;
                continue;
            }
            if (w != fw) {
                if (fw >= 0) queued_k[fw] += fq, P->new_k[fw] += fn;
                fw = w, fq = fn = 0;
            }
            fq += ready[r] <= t0;
            fn++;
            continue;
        }
        if (mark && st == WAIT && !mark[r] && ivec_push(&add, r) < 0) goto nomem;
        if (w < 0) {
            P->unplaced |= st == WAIT;
            continue;
        }
        if (st == WAIT) {
            if (ready[r] <= t0) queued_k[w]++;
            q_start[w + 1]++;
        } else if (st == RUN) {
            running[nrun++] = r;
            count_k[w]++;
        } else if (st == TOOL && ready[r] < slice_end) {
            if (ivec_push(&P->tool0, r) < 0) goto nomem;
        }
        csr_start[w + 1]++;
        placed[nplaced++] = r;
    }
    *m = nrun;
    if (fw >= 0) queued_k[fw] += fq, P->new_k[fw] += fn;
    int ordered = 0; /* the queued turns' runs from the kept order, already by readiness */
    if (P->order) {
        ordered = sn_order_add(P->order, add.p, add.n, P->ready);
        if (ordered < 0) goto out;
        ordered = ordered == 0;
    }
    if (*m == 0) { /* no pass runs */
        rc = 0;
        goto out;
    }
    for (Py_ssize_t k = 0; k < K; k++) {
        P->csr_start[k + 1] += P->csr_start[k];
        P->q_start[k + 1] += P->q_start[k];
    }
    P->csr = malloc(((size_t)P->csr_start[K] + 1) * sizeof(int64_t));
    P->qc = malloc(((size_t)P->q_start[K] + 1) * sizeof(Cand));
    P->in_tool = calloc((size_t)n + 1, 1);
    fill = malloc(2 * ((size_t)K + 1) * sizeof(int64_t));
    if (!P->csr || !P->qc || !P->in_tool || !fill) goto nomem;
    int64_t *qfill = fill + K + 1;
    memcpy(fill, P->csr_start, (size_t)K * sizeof(int64_t));
    memcpy(qfill, P->q_start, (size_t)K * sizeof(int64_t));
    /* (an instance's requests come in stretches: their places are kept in registers while a stretch lasts) */
    int64_t pw = -1, at_c = 0, at_q = 0;
    for (Py_ssize_t i = 0; i < nplaced; i++) {
        int64_t r = placed[i], w = where[r];
        if (w != pw) {
            if (pw >= 0) fill[pw] = at_c, qfill[pw] = at_q;
            pw = w, at_c = fill[w], at_q = qfill[w];
        }
        if (state[r] == WAIT && !ordered) P->qc[at_q++] = (Cand){w, r, ready[r], P->ctx[r]};
        P->csr[at_c++] = r;
    }
    if (pw >= 0) fill[pw] = at_c, qfill[pw] = at_q;
    if (ordered) {
        for (Py_ssize_t i = 0; i < (Py_ssize_t)*P->order->len; i++) {
            int64_t r = P->order->ids[i], w = P->where[r];
            if (w >= 0) P->qc[qfill[w]++] = (Cand){w, r, P->ready[r], P->ctx[r]};
        }
        for (Py_ssize_t k = 0; k < K; k++) {
            if (qfill[k] != P->q_start[k + 1]) {
                PyErr_SetString(PyExc_SystemError, "decode_slice: the kept order of the queued turns is not the queue");
                goto out;
            }
            P->q_sorted[k] = 1;
        }
    }
    rc = 0;
    goto out;
nomem:
    PyErr_NoMemory();
out:
    free(add.p);
    free(placed);
    free(fill);
    return rc;
}

/* instance k's queued turns by readiness (stable): sorted on first use, and in a pass no queued turn's readiness
   changes (only the turns a pass takes back are written, and they are queued no more) */
static int queued_run(Pass *P, int64_t k, Py_ssize_t *lo, Py_ssize_t *hi) {
    *lo = P->q_start[k], *hi = P->q_start[k + 1];
    if (!P->q_sorted[k]) {
        Cand *run = P->qc + *lo;
        Py_ssize_t len = *hi - *lo, i = 1;
        while (i < len && !ready_less(&run[i], &run[i - 1])) i++;
        if (i < len && sort_ready(run, len) < 0) return -1;
        P->q_sorted[k] = 1;
    }
    return 0;
}

static inline int i64_less(const int64_t *a, const int64_t *b) { return *a < *b; }

DEFINE_STABLE_SORT(sort_i64, int64_t, i64_less)
/* a turn that left for its tool inside the pass joins the list when its tool returns inside the slice */
static int note_tool(Pass *P, int64_t r) {
    if (P->in_tool[r] || !(P->ready[r] < P->slice_end)) return 0;
    P->in_tool[r] = 1;
    P->tool_dirty = 1;
    return ivec_push(&P->tool, r);
}

/* --- _refill ---------------------------------------------------------------------------------------------- */

/* Slots freed inside the slice go to turns under way inside it; appends the requests taken and their starts. */
static int refill(Pass *P, IVec *out, DVec *out_start) {
    if (P->fk.n == 0) return 0;
    if (P->tool_dirty) { /* ascending, as `_in_state(TOOL)` lists them */
        if (sort_i64(P->tool.p, P->tool.n) < 0) return -1;
        P->tool_dirty = 0;
    }
    int rc = -1;
    Py_ssize_t K = P->K;
    Cand *c = malloc(((size_t)P->q_start[K] + (size_t)P->tool.n + 1) * sizeof(Cand));
    Cand *tc = malloc(((size_t)P->tool.n + 1) * sizeof(Cand));
    double *within = NULL, *room_k = NULL, *secs = NULL;
    int64_t *rank = NULL, *run_k = NULL, *s_of = NULL, *slot = NULL;
    /* each instance's freed slots: the first one's index and how many (the slots are sorted by instance) */
    int64_t *first_k = malloc(2 * ((size_t)K + 1) * sizeof(int64_t)), *slots_k = first_k ? first_k + K + 1 : NULL;
    uint8_t *gone = NULL;
    if (!c || !tc || !first_k) goto done;
    for (Py_ssize_t k = 0; k < K; k++) slots_k[k] = 0;
    for (Py_ssize_t j = P->fk.n - 1; j >= 0; j--) {
        first_k[P->fk.p[j]] = j;
        slots_k[P->fk.p[j]]++;
    }
    /* the candidates in the order of one stable sort by (instance, readiness) of the queued turns (live order)
       followed by the turns back from their tools (ascending): per instance with freed slots, its queued turns
       by readiness merged with its turns back, a queued turn first on a tie */
    Py_ssize_t nt = 0;
    for (Py_ssize_t i = 0; i < P->tool.n; i++) {
        int64_t r = P->tool.p[i];
        if (P->state[r] != TOOL || !(P->ready[r] < P->slice_end)) continue;
        int64_t tu = P->turn[r];
        if (!(P->moved[r] || covered(P, r, tu) || P->carried[r * P->S + tu] == 0)) continue;
        if (slots_k[P->where[r]] > 0) tc[nt++] = (Cand){P->where[r], r, P->ready[r], P->ctx[r]};
    }
    if (nt > 1 && sort_cands(tc, nt) < 0) goto done;
    Py_ssize_t nc = 0, ti = 0;
    for (Py_ssize_t j = 0; j < P->fk.n; j += slots_k[P->fk.p[j]]) {
        int64_t k = P->fk.p[j];
        Py_ssize_t q, hi;
        if (queued_run(P, k, &q, &hi) < 0) goto done;
        for (;;) {
            while (q < hi && P->state[P->qc[q].r] != WAIT) q++; /* taken back earlier in this pass */
            int has_q = q < hi, has_t = ti < nt && tc[ti].k == k;
            if (has_q && (!has_t || !(tc[ti].ready < P->qc[q].ready))) c[nc++] = P->qc[q++];
            else if (has_t) c[nc++] = tc[ti++];
            else break;
        }
    }
    if (nc == 0) {
        rc = 0;
        goto done;
    }
    within = malloc((size_t)nc * sizeof(double));
    rank = malloc((size_t)nc * sizeof(int64_t));
    room_k = malloc((size_t)nc * sizeof(double)); /* per candidate: its instance's room */
    run_k = malloc((size_t)nc * sizeof(int64_t));
    if (!within || !rank || !room_k || !run_k) goto done;
    /* ranks, the running sum over all candidates, and each group's KV room (its instance's running requests,
       ascending, as np.bincount sums them) */
    double cs = 0.0, base = 0.0, room = 0.0;
    int64_t runs = 0;
    for (Py_ssize_t i = 0; i < nc; i++) {
        double need = c[i].ctx;
        cs += need;
        if (i == 0 || c[i].k != c[i - 1].k) {
            rank[i] = 0;
            base = cs - need;
            int64_t k = c[i].k;
            double used = 0.0;
            runs = 0;
            for (int64_t q = P->csr_start[k]; q < P->csr_start[k + 1]; q++) {
                int64_t r = P->csr[q];
                if (P->state[r] == RUN) {
                    runs++;
                    used += P->ctx[r];
                }
            }
            room = P->cap[k] - used - P->headroom * used / (double)(runs > 1 ? runs : 1);
        } else {
            rank[i] = rank[i - 1] + 1;
        }
        within[i] = cs - base;
        room_k[i] = room;
        run_k[i] = runs;
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < nc; i++) {
        if ((within[i] <= room_k[i]) || (rank[i] == 0 && run_k[i] == 0)) {
            c[m] = c[i];
            rank[m] = rank[i];
            m++;
        }
    }
    if (m == 0) {
        rc = 0;
        goto done;
    }
    /* the turn's slot among its instance's: with new requests queued there, the first freed once it is back and
       after the previous turn's; else the rank-th */
    s_of = malloc((size_t)m * sizeof(int64_t));
    slot = malloc((size_t)m * sizeof(int64_t));
    if (!s_of || !slot) goto done;
    int any_queue = 0;
    for (Py_ssize_t i = 0; i < m; i++)
        if (P->new_k[c[i].k] > 0) any_queue = 1;
    if (any_queue) {
        Py_ssize_t nf = P->fk.n;
        double ft_min = P->ft.p[0], ft_max = P->ft.p[0];
        for (Py_ssize_t j = 1; j < nf; j++) {
            ft_min = np_min(ft_min, P->ft.p[j]);
            ft_max = np_max(ft_max, P->ft.p[j]);
        }
        double span = (ft_max - ft_min) + 1.0;
        double *key = malloc((size_t)nf * sizeof(double));
        if (!key) goto done;
        for (Py_ssize_t j = 0; j < nf; j++) key[j] = (double)P->fk.p[j] * span + (P->ft.p[j] - ft_min);
        double big = (double)(m + nf + 1), acc = 0.0;
        for (Py_ssize_t i = 0; i < m; i++) {
            double v = (double)c[i].k * span + (P->ready[c[i].r] - ft_min);
            Py_ssize_t lo = 0, hi = nf;
            while (lo < hi) {
                Py_ssize_t mid = lo + ((hi - lo) >> 1);
                if (key[mid] < v) lo = mid + 1;
                else hi = mid;
            }
            int64_t g = (int64_t)lo - first_k[c[i].k];
            if (g < 0) g = 0;
            double x = (double)(g - rank[i]) + (double)c[i].k * big;
            acc = (i == 0) ? x : np_max(acc, x);
            double chain = ((double)rank[i] + acc) - (double)c[i].k * big;
            s_of[i] = P->new_k[c[i].k] > 0 ? (int64_t)chain : (int64_t)(double)rank[i];
        }
        free(key);
    } else {
        for (Py_ssize_t i = 0; i < m; i++) s_of[i] = rank[i];
    }
    Py_ssize_t m2 = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (s_of[i] < slots_k[c[i].k]) {
            c[m2] = c[i];
            slot[m2] = first_k[c[i].k] + s_of[i];
            m2++;
        }
    }
    if (m2 == 0) {
        rc = 0;
        goto done;
    }
    secs = malloc((size_t)m2 * sizeof(double));
    if (!secs) goto done;
    Py_ssize_t m3 = 0;
    for (Py_ssize_t i = 0; i < m2; i++) {
        int64_t r = c[i].r;
        const Degree *d = degree_of(P, P->itp[c[i].k]);
        if (!d) {
            PyErr_SetString(PyExc_SystemError, "slice kernel: an instance's degree is not in the table");
            goto done;
        }
        double sec = sn_prefill(d, P->work0, P->attn, P->pending[r], P->ctx[r] / 2.0);
        double start = np_max(P->ft.p[slot[i]], P->ready[r]) + sec;
        if (start < P->slice_end) {
            c[m3] = c[i];
            slot[m3] = slot[i];
            secs[m3] = sec;
            within[m3] = start; /* reused: the start */
            m3++;
        }
    }
    if (m3 == 0) {
        rc = 0;
        goto done;
    }
    /* later_debt += np.bincount(k, weights=secs): a zeroed sum per instance (the candidates are grouped by
       instance), then added */
    for (Py_ssize_t i = 0; i < m3;) {
        int64_t k = c[i].k;
        double sum = 0.0;
        for (; i < m3 && c[i].k == k; i++) sum += secs[i];
        P->later_debt[k] += sum;
    }
    gone = calloc((size_t)P->fk.n, 1);
    if (!gone) goto done;
    for (Py_ssize_t i = 0; i < m3; i++) {
        int64_t r = c[i].r;
        if (sn_keep_row(P, r) < 0) goto done;
        if (P->state[r] == WAIT && P->ready[r] <= P->t0) P->left_wait[c[i].k]++;
        P->own[r] += secs[i];
        if (ivec_push(&P->refilled, r) < 0) goto done;
        P->pending[r] = 0.0;
        P->lag[r] = 0.0;
        set_state(P, r, RUN);
        gone[slot[i]] = 1;
        if (ivec_push(out, r) < 0 || dvec_push(out_start, within[i]) < 0) goto done;
    }
    Py_ssize_t keep = 0;
    for (Py_ssize_t j = 0; j < P->fk.n; j++) {
        if (!gone[j]) {
            P->fk.p[keep] = P->fk.p[j];
            P->ft.p[keep] = P->ft.p[j];
            keep++;
        }
    }
    P->fk.n = P->ft.n = keep;
    rc = 0;
done:
    free(c);
    free(tc);
    free(first_k);
    free(within);
    free(rank);
    free(room_k);
    free(run_k);
    free(s_of);
    free(slot);
    free(secs);
    free(gone);
    return rc;
}

/* --- _end_segments ---------------------------------------------------------------------------------------- */
/* Segments `ended` at times `at`: finish, tool call, or the next chunk in place; then the in-slice refill.
   Fills `cont` / `start` with the requests that go on decoding inside the slice and when each starts. */
static int end_segments(Pass *P, const IVec *ended, const DVec *at, IVec *cont, DVec *start) {
    Py_ssize_t mark = P->fk.n;
    cont->n = start->n = 0;
    /* finished first, then the tool calls, as the reference notes them (the order does not matter: sorted) */
    for (Py_ssize_t i = 0; i < ended->n; i++) {
        int64_t r = ended->p[i];
        if (P->turn[r] >= P->nseg[r] - 1) {
            set_state(P, r, DONE);
            P->finish[r] = at->p[i];
            if (ivec_push(&P->fk, P->where[r]) < 0 || dvec_push(&P->ft, at->p[i]) < 0) return -1;
        }
    }
    for (Py_ssize_t i = 0; i < ended->n; i++) {
        int64_t r = ended->p[i];
        int64_t sg = P->turn[r];
        if (sg >= P->nseg[r] - 1) continue;
        int64_t nxt = sg + 1;
        Py_ssize_t here = r * P->S + sg, there = r * P->S + nxt;
        int keep = !P->tool_end[here] && (P->carried[there] == 0 || covered(P, r, nxt));
        if (keep) { /* a chunk boundary with no migration */
            P->turn[r] = nxt;
            P->rem[r] = (double)P->gen[there];
            P->lag[r] = 0.0;
            if (ivec_push(cont, r) < 0 || dvec_push(start, at->p[i]) < 0) return -1;
        } else {
            double tool_tok = (double)P->tool_tok[here];
            P->ctx[r] += tool_tok;
            P->pending[r] = tool_tok;
            P->ready[r] = at->p[i] + P->latency[here];
            P->turn[r] = nxt;
            P->moved[r] = 0;
            P->rem[r] = (double)P->gen[there];
            set_state(P, r, TOOL);
            if (ivec_push(&P->fk, P->where[r]) < 0 || dvec_push(&P->ft, at->p[i]) < 0) return -1;
            if (note_tool(P, r) < 0) return -1;
        }
    }
    if (sn_merge_new_slots(P, mark) < 0) return -1;
    return refill(P, cont, start);
}

/* --- the pass --------------------------------------------------------------------------------------------- */
/* Decode the requests `cont` from `start` to the slice end at their instance's step time; ended ones go to
   `ended` / `at`, the others to `still`. */
static int decode_from(Pass *P, const IVec *cont, const DVec *start, double *took, double *sums, uint8_t *added,
                       IVec *still, IVec *ended, DVec *at) {
    ended->n = at->n = 0;
    Py_ssize_t m = cont->n;
    for (Py_ssize_t i = 0; i < m; i++) {
        sums[P->where[cont->p[i]]] = 0.0;
        added[P->where[cont->p[i]]] = 0;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = cont->p[i], k = P->where[r];
        double sk = P->step[k];
        double advance = np_max(0.0, P->slice_end - start->p[i]) / sk;
        double r0 = P->rem[r];
        double tk = np_min(advance, r0);
        sums[k] += tk * sk;
        P->rem[r] = r0 - tk;
        P->ctx[r] += tk;
        took[i] = tk;
        if (r0 <= advance) {
            if (ivec_push(ended, r) < 0 || dvec_push(at, start->p[i] + r0 * sk) < 0) return -1;
        } else if (ivec_push(still, r) < 0) {
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t k = P->where[cont->p[i]];
        if (!added[k]) { /* `+= np.bincount(...)`: each instance's sum, once */
            P->dec_s[k] += sums[k];
            added[k] = 1;
        }
    }
    P->decoded += sn_np_sum(took, m);
    return 0;
}

/* a pass starts from the slice's turns back from their tools, nothing taken back */
static int pass_lists(Pass *P) {
    for (Py_ssize_t i = 0; i < P->tool.n; i++) P->in_tool[P->tool.p[i]] = 0;
    P->tool.n = 0;
    for (Py_ssize_t i = 0; i < P->tool0.n; i++) {
        if (ivec_push(&P->tool, P->tool0.p[i]) < 0) return -1;
        P->in_tool[P->tool0.p[i]] = 1;
    }
    P->tool_dirty = 0;
    P->refilled.n = 0;
    for (Py_ssize_t k = 0; k < P->K; k++) P->left_wait[k] = 0;
    return 0;
}

void sn_free_lists(Pass *P) {
    free(P->qc);
    free(P->q_start);
    free(P->q_sorted);
    free(P->new_k);
    free(P->tool0.p);
    free(P->csr_start);
    free(P->csr);
    free(P->in_tool);
    free(P->tool.p);
    free(P->refilled.p);
    free(P->left_wait);
    P->qc = NULL;
    P->q_start = P->new_k = P->csr_start = P->csr = P->left_wait = NULL;
    P->q_sorted = P->in_tool = NULL;
    P->tool0 = P->tool = P->refilled = (IVec){0};
}

/* `_decode_pass` with the step times `P->step`: writes the request state, `dec_s`, `span_end`, `busy_end` (the
   end of each instance's last segment in the slice, those continued inside it included), `occ`, `real` and the
   requests still decoding at the slice end */
int sn_run_pass(Pass *P, const PassIn *in, double t, double dt, double *span_end, double *busy_end, double *occ,
                double *real, IVec *still) {
    int rc = -1;
    IVec ended = {0}, cont = {0};
    DVec at = {0}, start = {0};
    Py_ssize_t m = in->m, K = P->K;
    double *took = malloc(((size_t)(m > P->n ? m : P->n) + 1) * sizeof(double));
    double *sums = malloc(((size_t)K + 1) * sizeof(double));
    uint8_t *added = malloc((size_t)K + 1);
    still->n = 0;
    if (!took || !sums || !added || pass_lists(P) < 0) goto done;
    for (Py_ssize_t j = 0; j < K; j++) {
        P->dec_s[j] = 0.0;
        span_end[j] = busy_end[j] = t;
    }
    /* each running request decodes what its instance's step time lets it in the slice; a stretch of one
       instance's requests sums its decode seconds in a register from the sum so far (the same additions in the
       same order as `np.add.at`) */
    int64_t sum_k = -1;
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = in->running[i], k = in->k[i];
        double sk = P->step[k], fits = in->go_s[i] / sk, rem0 = in->rem0[i];
        double tk = np_min(fits, rem0);
        if (k != sum_k) {
            if (sum_k >= 0) P->dec_s[sum_k] = sum;
            sum_k = k;
            sum = P->dec_s[k];
        }
        sum += tk * sk;
        P->rem[r] = rem0 - tk;
        P->ctx[r] += tk;
        took[i] = tk;
        P->lag[r] = 0.0;
        if (rem0 <= fits) {
            double when = in->t_delay[i] + rem0 * sk;
            if (ivec_push(&ended, r) < 0 || dvec_push(&at, when) < 0) goto done;
            span_end[k] = np_max(span_end[k], when);
            busy_end[k] = np_max(busy_end[k], when);
        } else if (ivec_push(still, r) < 0) {
            goto done;
        }
    }
    if (sum_k >= 0) P->dec_s[sum_k] = sum;
    P->decoded += sn_np_sum(took, m);
    while (ended.n) { /* _continue_in_slice */
        if (end_segments(P, &ended, &at, &cont, &start) < 0) goto done;
        if (cont.n == 0) break;
        if (decode_from(P, &cont, &start, took, sums, added, still, &ended, &at) < 0) goto done;
        for (Py_ssize_t i = 0; i < ended.n; i++) {
            int64_t k = P->where[ended.p[i]];
            busy_end[k] = np_max(busy_end[k], at.p[i]);
        }
    }
    for (Py_ssize_t i = 0; i < still->n; i++) {
        int64_t k = P->where[still->p[i]];
        span_end[k] = busy_end[k] = t + dt;
    }
    for (Py_ssize_t j = 0; j < K; j++) occ[j] = np_min(1.0, in->occupied[j] ? P->dec_s[j] / in->open_s[j] : 1.0);
    for (Py_ssize_t i = 0; i < still->n; i++) P->lag[still->p[i]] = -P->own[still->p[i]];
    /* `_own_debt[:] = 0.0`: it is 0 at every pass start, and only the requests taken back added to it */
    for (Py_ssize_t i = 0; i < P->refilled.n; i++) P->own[P->refilled.p[i]] = 0.0;
    for (Py_ssize_t j = 0; j < K; j++) {
        double span = span_end[j] - in->first[j];
        real[j] = np_max(span > 1e-9 ? P->dec_s[j] / span : 0.0, in->has[j] ? 1.0 : 0.0);
    }
    rc = 0;
done:
    free(took);
    free(sums);
    free(added);
    free(ended.p);
    free(at.p);
    free(cont.p);
    free(start.p);
    return rc;
}
