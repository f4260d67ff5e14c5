/* One decode pass of the timed rollout's slice in C: `SliceDecode._decode_pass_py` with `_continue_in_slice`,
   `_end_segments` and `_refill` (libra/sim/slices.py, the reference, which runs where this is not built or
   LIBRA_PURE_PYTHON is set). The same arithmetic in the same order, so every float is bit for bit the
   reference's (tests/sim/test_slice_native.py and the golden reports): numpy's pairwise sum for `x.sum()`, a
   zeroed per-instance sum added after for `+= np.bincount(...)`, numpy's minimum and maximum for two floats.

   The differences are in the bookkeeping only, where the reference recomputes sets with numpy calls:
   - the freed slots are kept sorted by (instance, time): the reference sorts them stably where it needs the
     order, and equal pairs are interchangeable;
   - the live requests are listed by instance once per pass (a pass moves no request between instances), so an
     instance's KV room sums only its own requests, in ascending order as `np.bincount` does;
   - the turns back from their tools inside the slice are listed once per pass, and a turn that leaves for its
     tool inside the pass is added to that list.

   Build: setup.py, as the optional module libra.sim._slice_native (no numpy headers: buffers by the buffer
   protocol). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { WAIT = 0, RUN = 1, TOOL = 2, DONE = 3 };
enum { DEG_FIELDS = 9, MAX_DEG = 32 };

/* prefill_time's terms for one degree: RolloutCost.prefill_terms */
typedef struct {
    int64_t tp;
    double denom, weights, a, hidden, dbytes, lat, bw, layers2;
} Degree;

typedef struct {
    int64_t *p;
    Py_ssize_t n, cap;
} IVec;

typedef struct {
    double *p;
    Py_ssize_t n, cap;
} DVec;

static int ivec_push(IVec *v, int64_t x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? 2 * v->cap : 64;
        int64_t *p = realloc(v->p, (size_t)cap * sizeof(int64_t));
        if (!p) return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

static int dvec_push(DVec *v, double x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? 2 * v->cap : 64;
        double *p = realloc(v->p, (size_t)cap * sizeof(double));
        if (!p) return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

/* numpy's two-float minimum and maximum (the first operand on a tie, NaN from the first) */
static inline double np_min(double a, double b) { return (a <= b || isnan(a)) ? a : b; }
static inline double np_max(double a, double b) { return (a >= b || isnan(a)) ? a : b; }

/* A stable merge sort with the comparison inlined (glibc's qsort calls it through a pointer): insertion sort of
   runs of 16, then bottom-up merges through `tmp`. LESS(a, b): a sorts strictly before b. */
#define DEFINE_STABLE_SORT(NAME, T, LESS)                                                                         \
    static int NAME(T *a, Py_ssize_t n) {                                                                        \
        for (Py_ssize_t lo = 0; lo < n; lo += 16) {                                                              \
            Py_ssize_t hi = lo + 16 < n ? lo + 16 : n;                                                           \
            for (Py_ssize_t i = lo + 1; i < hi; i++) {                                                           \
                T x = a[i];                                                                                      \
                Py_ssize_t j = i;                                                                                \
                for (; j > lo && LESS(&x, &a[j - 1]); j--) a[j] = a[j - 1];                                       \
                a[j] = x;                                                                                        \
            }                                                                                                    \
        }                                                                                                        \
        if (n <= 16) return 0;                                                                                   \
        T *tmp = malloc((size_t)n * sizeof(T));                                                                  \
        if (!tmp) return -1;                                                                                     \
        T *src = a, *dst = tmp;                                                                                  \
        for (Py_ssize_t w = 16; w < n; w *= 2) {                                                                 \
            for (Py_ssize_t lo = 0; lo < n; lo += 2 * w) {                                                       \
                Py_ssize_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;                  \
                Py_ssize_t i = lo, j = mid, o = lo;                                                              \
                while (i < mid && j < hi) dst[o++] = LESS(&src[j], &src[i]) ? src[j++] : src[i++];               \
                while (i < mid) dst[o++] = src[i++];                                                             \
                while (j < hi) dst[o++] = src[j++];                                                              \
            }                                                                                                    \
            T *swap = src;                                                                                       \
            src = dst;                                                                                           \
            dst = swap;                                                                                          \
        }                                                                                                        \
        if (src != a) memcpy(a, src, (size_t)n * sizeof(T));                                                     \
        free(tmp);                                                                                               \
        return 0;                                                                                                \
    }

/* numpy's pairwise summation of a contiguous float64 array (`a.sum()`) */
static double pairwise_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* `a.sum()`: the reduction starts from 0.0 (so an empty or all -0.0 array sums to 0.0) and adds the pairwise sum */
static double np_sum(const double *a, Py_ssize_t n) { return 0.0 + pairwise_sum(a, n); }

typedef struct {
    Py_ssize_t n, S, K, nlive, ndeg;
    double *rem, *ctx, *pending, *ready, *finish, *lag, *own;
    int8_t *state;
    int64_t *turn;
    uint8_t *moved;
    const uint8_t *stolen, *fresh, *tool_end, *occupied, *has;
    const int64_t *where, *nseg, *tool_tok, *gen, *carried, *rbucket, *ibucket, *itp, *live;
    const double *latency, *cap, *step;
    double *later_debt, *dec_s;
    Degree deg[MAX_DEG];
    double headroom, work0, attn, slice_end, decoded;
    int touched; /* a bit per state whose set of requests changed */
    /* freed slots, sorted by (instance, time) */
    IVec fk;
    DVec ft;
    /* per pass, built on the first refill (`ensure_lists`) */
    int have_lists, tool_dirty;
    IVec tool;          /* turns in TOOL whose tool returns before the slice ends, ascending once sorted */
    uint8_t *in_tool;   /* n: listed in `tool` */
    IVec queued;        /* turns under way queued at the slice start, ascending */
    int64_t *new_k;     /* K: new requests queued at the slice start */
    int64_t *csr_start; /* K + 1 */
    int64_t *csr;       /* live requests by instance, ascending within each */
    IVec refilled;      /* requests taken back in this pass: the only ones whose own debt is not 0 */
} Pass;

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

/* RolloutCost.prefill_time(tp, tokens, context), operand by operand */
static double prefill(const Degree *d, double work0, double attn, double tokens, double context) {
    double work = work0 + attn * context;
    double flops = tokens * work;
    double compute = flops / d->denom;
    double comm;
    if (d->tp == 1) {
        comm = 0.0 * tokens;
    } else {
        double volume = d->a * tokens * d->hidden * d->dbytes;
        double per = d->lat + volume / d->bw;
        comm = d->layers2 * per;
    }
    return compute + d->weights + comm;
}

/* --- freed slots ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t k;
    double t;
} Slot;

static inline int slot_less(const Slot *a, const Slot *b) { return a->k < b->k || (a->k == b->k && a->t < b->t); }

DEFINE_STABLE_SORT(sort_slots, Slot, slot_less)

/* sort the slots from `from` on and merge them into the sorted ones before */
static int merge_new_slots(Pass *P, Py_ssize_t from) {
    Py_ssize_t n = P->fk.n, m = n - from;
    if (m == 0) return 0;
    Slot *s = malloc((size_t)n * sizeof(Slot));
    if (!s) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        s[i].k = P->fk.p[i];
        s[i].t = P->ft.p[i];
    }
    if (sort_slots(s + from, m) < 0) {
        free(s);
        return -1;
    }
    Slot *out = malloc((size_t)n * sizeof(Slot));
    if (!out) {
        free(s);
        return -1;
    }
    Py_ssize_t i = 0, j = from, o = 0;
    while (i < from && j < n) out[o++] = slot_less(&s[j], &s[i]) ? s[j++] : s[i++];
    while (i < from) out[o++] = s[i++];
    while (j < n) out[o++] = s[j++];
    for (Py_ssize_t q = 0; q < n; q++) {
        P->fk.p[q] = out[q].k;
        P->ft.p[q] = out[q].t;
    }
    free(s);
    free(out);
    return 0;
}

static Py_ssize_t lower_k(const Pass *P, int64_t k) {
    Py_ssize_t lo = 0, hi = P->fk.n;
    while (lo < hi) {
        Py_ssize_t mid = lo + ((hi - lo) >> 1);
        if (P->fk.p[mid] < k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static Py_ssize_t slots_of(const Pass *P, int64_t k, Py_ssize_t *first) {
    Py_ssize_t a = lower_k(P, k), b = lower_k(P, k + 1);
    *first = a;
    return b - a;
}

/* --- per-pass lists ------------------------------------------------------------------------------------- */
/* On the first refill of a pass, one scan of the live requests (checking each one's indices) lists: the turns
   under way queued at the slice start and the new requests queued per instance (`_slice_queues`), the turns whose
   tool returns inside the slice, and, with a second scan, the live requests by instance. */
static int ensure_lists(Pass *P) {
    if (P->have_lists) return 0;
    P->new_k = calloc((size_t)P->K, sizeof(int64_t));
    P->in_tool = calloc((size_t)P->n, 1);
    P->csr_start = calloc((size_t)P->K + 1, sizeof(int64_t));
    P->csr = malloc(((size_t)P->nlive + 1) * sizeof(int64_t));
    if (!P->new_k || !P->in_tool || !P->csr_start || !P->csr) return -1;
    for (Py_ssize_t i = 0; i < P->nlive; i++) {
        int64_t r = P->live[i];
        if (r < 0 || r >= P->n || P->where[r] < -1 || P->where[r] >= P->K || P->turn[r] < 0 || P->turn[r] >= P->S ||
            P->nseg[r] > P->S || P->state[r] < WAIT || P->state[r] > DONE) {
            PyErr_SetString(PyExc_ValueError, "decode_pass: a live request's index, instance or turn is out of range");
            return -1;
        }
        int64_t w = P->where[r];
        if (w >= 0) P->csr_start[w + 1]++;
        if (P->state[r] == WAIT) {
            if (w < 0) continue;
            if (P->fresh[r]) P->new_k[w]++;
            else if (ivec_push(&P->queued, r) < 0) return -1;
        } else if (P->state[r] == TOOL && P->ready[r] < P->slice_end && w >= 0) {
            if (ivec_push(&P->tool, r) < 0) return -1;
            P->in_tool[r] = 1;
        }
    }
    for (Py_ssize_t k = 0; k < P->K; k++) P->csr_start[k + 1] += P->csr_start[k];
    int64_t *fill = malloc((size_t)P->K * sizeof(int64_t) + 1);
    if (!fill) return -1;
    memcpy(fill, P->csr_start, (size_t)P->K * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < P->nlive; i++) {
        int64_t r = P->live[i], w = P->where[r];
        if (w >= 0) P->csr[fill[w]++] = r;
    }
    free(fill);
    P->have_lists = 1;
    return 0;
}

static inline int i64_less(const int64_t *a, const int64_t *b) { return *a < *b; }

DEFINE_STABLE_SORT(sort_i64, int64_t, i64_less)
/* a turn that left for its tool inside the pass joins the list when its tool returns inside the slice */
static int note_tool(Pass *P, int64_t r) {
    if (!P->have_lists || P->in_tool[r] || !(P->ready[r] < P->slice_end)) return 0;
    P->in_tool[r] = 1;
    P->tool_dirty = 1;
    return ivec_push(&P->tool, r);
}

/* --- _refill ---------------------------------------------------------------------------------------------- */
typedef struct {
    int64_t k, r;
    double ready;
} Cand;

/* np.lexsort((ready, k)): by instance, then readiness, stable */
static inline int cand_less(const Cand *a, const Cand *b) {
    return a->k < b->k || (a->k == b->k && a->ready < b->ready);
}

DEFINE_STABLE_SORT(sort_cands, Cand, cand_less)
/* Slots freed inside the slice go to turns under way inside it; appends the requests taken and their starts. */
static int refill(Pass *P, IVec *out, DVec *out_start) {
    if (P->fk.n == 0) return 0;
    if (ensure_lists(P) < 0) return -1;
    if (P->tool_dirty) { /* ascending, as `_in_state(TOOL)` lists them */
        if (sort_i64(P->tool.p, P->tool.n) < 0) return -1;
        P->tool_dirty = 0;
    }
    int rc = -1;
    Py_ssize_t cap = P->queued.n + P->tool.n;
    Cand *c = malloc(((size_t)cap + 1) * sizeof(Cand));
    double *within = NULL, *room_k = NULL, *secs = NULL;
    int64_t *rank = NULL, *run_k = NULL, *s_of = NULL, *slot = NULL;
    uint8_t *gone = NULL;
    if (!c) return -1;
    Py_ssize_t nc = 0, first;
    for (Py_ssize_t i = 0; i < P->queued.n; i++) {
        int64_t r = P->queued.p[i];
        if (P->state[r] == WAIT && slots_of(P, P->where[r], &first) > 0) {
            c[nc].k = P->where[r];
            c[nc].r = r;
            c[nc].ready = P->ready[r];
            nc++;
        }
    }
    for (Py_ssize_t i = 0; i < P->tool.n; i++) {
        int64_t r = P->tool.p[i];
        if (P->state[r] != TOOL || !(P->ready[r] < P->slice_end)) continue;
        int64_t tu = P->turn[r];
        if (!(P->moved[r] || covered(P, r, tu) || P->carried[r * P->S + tu] == 0)) continue;
        if (slots_of(P, P->where[r], &first) > 0) {
            c[nc].k = P->where[r];
            c[nc].r = r;
            c[nc].ready = P->ready[r];
            nc++;
        }
    }
    if (nc == 0) {
        rc = 0;
        goto done;
    }
    if (sort_cands(c, nc) < 0) goto done;
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
        double need = P->ctx[c[i].r];
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
            slots_of(P, c[i].k, &first);
            int64_t g = (int64_t)lo - (int64_t)first;
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
        Py_ssize_t count = slots_of(P, c[i].k, &first);
        if (s_of[i] < count) {
            c[m2] = c[i];
            slot[m2] = first + s_of[i];
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
        double sec = prefill(d, P->work0, P->attn, P->pending[r], P->ctx[r] / 2.0);
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
    if (merge_new_slots(P, mark) < 0) return -1;
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
    P->decoded += np_sum(took, m);
    return 0;
}

typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* the arrays of `decode_slice`, in the order libra/sim/native.py packs them */
enum {
    A_REM, A_CTX, A_PENDING, A_READY, A_FINISH, A_LAG, A_OWN, A_STATE, A_TURN, A_MOVED, A_STOLEN, A_FRESH,
    A_WHERE, A_NSEG, A_TOOL_END, A_TOOL_TOK, A_LATENCY, A_GEN, A_CARRIED, A_RBUCKET, A_IBUCKET, A_ITP, A_CAP,
    A_ACTIVE, A_READY_AT, A_DEBT, A_LATER_DEBT, A_OCC_BEFORE, A_OCCUPANCY, A_DEC_S, A_SPAN_END, A_STEP_OUT, A_LIVE,
    A_FK, A_FT, A_DEGREES, A_DECODE, N_ARRAYS
};

static int format_is(const Py_buffer *v, char kind) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (f[0] == '\0' || f[1] != '\0') return 0;
    switch (kind) {
    case 'd': return f[0] == 'd' && v->itemsize == 8;
    case 'q': return (f[0] == 'q' || f[0] == 'l') && v->itemsize == 8;
    case 'b': return f[0] == 'b' && v->itemsize == 1;
    case '?': return f[0] == '?' && v->itemsize == 1;
    }
    return 0;
}

static PyObject *to_bytearray(const void *p, Py_ssize_t nbytes) {
    return PyByteArray_FromStringAndSize(nbytes ? (const char *)p : "", nbytes);
}

typedef struct {
    char kind, size;
    int writable;
} Spec;

/* kind: 'd' float64, 'q' int64, 'b' int8, '?' bool; size: 'n' requests, 'w' requests x width, 'K' instances,
   'm' running requests, '*' any */
static const Spec SPEC[N_ARRAYS] = {
    {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1}, {'d', 'n', 1},
    {'b', 'n', 1}, {'q', 'n', 1}, {'?', 'n', 1}, {'?', 'n', 0}, {'?', 'n', 0}, {'q', 'n', 0}, {'q', 'n', 0},
    {'?', 'w', 0}, {'q', 'w', 0}, {'d', 'w', 0}, {'q', 'w', 0}, {'q', 'w', 0}, {'q', 'w', 0}, {'q', 'K', 0},
    {'q', 'K', 0}, {'d', 'K', 0}, {'?', 'K', 0}, {'d', 'K', 0}, {'d', 'K', 1}, {'d', 'K', 1}, {'d', '*', 0},
    {'d', 'K', 1}, {'d', 'K', 1}, {'d', 'K', 1}, {'d', 'K', 1}, {'q', '*', 0}, {'q', '*', 0}, {'d', '*', 0},
    {'d', '*', 0}, {'d', '*', 0},
};

static int format_is(const Py_buffer *v, char kind);

/* the buffers of `arrays` as `spec` says: kind, length ('n' requests, 'w' requests x width, 'K' instances, 'm' the
   length of the first 'm' array, '*' any) and whether it is written */
static int acquire(PyObject *arrays, const Spec *spec, int count, Buf *b, Py_ssize_t n, Py_ssize_t S, Py_ssize_t K,
                   Py_ssize_t *m) {
    if (PyTuple_GET_SIZE(arrays) != count) {
        PyErr_Format(PyExc_ValueError, "needs %d arrays, got %zd", count, PyTuple_GET_SIZE(arrays));
        return -1;
    }
    for (int i = 0; i < count; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (spec[i].writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(arrays, i), &b[i].view, flags) < 0) return -1;
        b[i].held = 1;
        if (!format_is(&b[i].view, spec[i].kind)) {
            PyErr_Format(PyExc_TypeError, "array %d has format %s, not %c", i, b[i].view.format ? b[i].view.format : "B",
                         spec[i].kind);
            return -1;
        }
        Py_ssize_t len = b[i].view.len / b[i].view.itemsize, want = -1;
        switch (spec[i].size) {
        case 'n': want = n; break;
        case 'w': want = n * S; break;
        case 'K': want = K; break;
        case 'm':
            if (*m < 0) *m = len;
            want = *m;
            break;
        }
        if (want >= 0 && len != want) {
            PyErr_Format(PyExc_ValueError, "array %d has %zd items, not %zd", i, len, want);
            return -1;
        }
    }
    return 0;
}

static void release(Buf *b, int count) {
    for (int i = 0; i < count; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

/* --- one decode pass ------------------------------------------------------------------------------------- */
/* `_pass_inputs` of a slice: per running request its instance, the time it starts decoding and for how long, and
   what it has left of its segment; per instance its first start, whether it runs anything, the seconds it is
   open and whether it is occupied */
typedef struct {
    Py_ssize_t m;
    int64_t *running, *k;
    double *t_delay, *go_s, *rem0, *first, *open_s;
    uint8_t *has, *occupied;
} PassIn;

static void reset_lists(Pass *P) {
    free(P->tool.p);
    free(P->in_tool);
    free(P->queued.p);
    free(P->new_k);
    free(P->csr_start);
    free(P->csr);
    free(P->refilled.p);
    P->tool = (IVec){0};
    P->queued = (IVec){0};
    P->refilled = (IVec){0};
    P->in_tool = NULL;
    P->new_k = P->csr_start = P->csr = NULL;
    P->have_lists = P->tool_dirty = 0;
}

/* `_decode_pass_py` with the step times `P->step`: writes the request state, `dec_s`, `span_end`, `occ`, `real`
   and the requests still decoding at the slice end */
static int run_pass(Pass *P, const PassIn *in, double t, double dt, double *span_end, double *occ, double *real,
                    IVec *still) {
    int rc = -1;
    IVec ended = {0}, cont = {0};
    DVec at = {0}, start = {0};
    Py_ssize_t m = in->m, K = P->K;
    double *took = malloc(((size_t)(m > P->n ? m : P->n) + 1) * sizeof(double));
    double *sums = malloc(((size_t)K + 1) * sizeof(double));
    uint8_t *added = malloc((size_t)K + 1);
    still->n = 0;
    reset_lists(P);
    if (!took || !sums || !added) goto done;
    for (Py_ssize_t j = 0; j < K; j++) {
        P->dec_s[j] = 0.0;
        span_end[j] = t;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = in->running[i], k = in->k[i];
        double sk = P->step[k];
        double tk = np_min(in->go_s[i] / sk, in->rem0[i]);
        P->dec_s[k] += tk * sk;
        P->rem[r] = in->rem0[i] - tk;
        P->ctx[r] += tk;
        took[i] = tk;
    }
    P->decoded += np_sum(took, m);
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = in->running[i], k = in->k[i];
        P->lag[r] = 0.0;
        if (in->rem0[i] <= in->go_s[i] / P->step[k]) {
            double when = in->t_delay[i] + in->rem0[i] * P->step[k];
            if (ivec_push(&ended, r) < 0 || dvec_push(&at, when) < 0) goto done;
            span_end[k] = np_max(span_end[k], when);
        } else if (ivec_push(still, r) < 0) {
            goto done;
        }
    }
    while (ended.n) { /* _continue_in_slice */
        if (end_segments(P, &ended, &at, &cont, &start) < 0) goto done;
        if (cont.n == 0) break;
        if (decode_from(P, &cont, &start, took, sums, added, still, &ended, &at) < 0) goto done;
    }
    for (Py_ssize_t i = 0; i < still->n; i++) span_end[P->where[still->p[i]]] = t + dt;
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

/* `_step_inputs`: the running contexts' sum per instance (in `running`'s order) and the requests queued now */
static void step_inputs(const Pass *P, const int64_t *running, Py_ssize_t m, double now, double *ctx_k,
                        int64_t *queued_k) {
    for (Py_ssize_t j = 0; j < P->K; j++) {
        ctx_k[j] = 0.0;
        queued_k[j] = 0;
    }
    for (Py_ssize_t i = 0; i < m; i++) ctx_k[P->where[running[i]]] += P->ctx[running[i]];
    for (Py_ssize_t i = 0; i < P->nlive; i++) {
        int64_t r = P->live[i];
        if (P->state[r] == WAIT && P->ready[r] <= now && P->where[r] >= 0) queued_k[P->where[r]]++;
    }
}

/* the rows a pass may write, for the live requests: saved before the first pass, written back before a second */
typedef struct {
    double *f[7];
    int8_t *state;
    int64_t *turn;
    uint8_t *moved;
    IVec fk;
    DVec ft;
    double decoded;
} Saved;

static double **rows_of(Pass *P, double **rows) {
    rows[0] = P->rem, rows[1] = P->ctx, rows[2] = P->pending, rows[3] = P->ready, rows[4] = P->finish;
    rows[5] = P->lag, rows[6] = P->own;
    return rows;
}

static int save(Pass *P, Saved *sv) {
    Py_ssize_t nl = P->nlive;
    double *rows[7];
    rows_of(P, rows);
    for (int q = 0; q < 7; q++) {
        if (!(sv->f[q] = malloc(((size_t)nl + 1) * sizeof(double)))) return -1;
        for (Py_ssize_t i = 0; i < nl; i++) sv->f[q][i] = rows[q][P->live[i]];
    }
    sv->state = malloc((size_t)nl + 1);
    sv->turn = malloc(((size_t)nl + 1) * sizeof(int64_t));
    sv->moved = malloc((size_t)nl + 1);
    if (!sv->state || !sv->turn || !sv->moved) return -1;
    for (Py_ssize_t i = 0; i < nl; i++) {
        int64_t r = P->live[i];
        sv->state[i] = P->state[r];
        sv->turn[i] = P->turn[r];
        sv->moved[i] = P->moved[r];
    }
    for (Py_ssize_t j = 0; j < P->fk.n; j++)
        if (ivec_push(&sv->fk, P->fk.p[j]) < 0 || dvec_push(&sv->ft, P->ft.p[j]) < 0) return -1;
    sv->decoded = P->decoded;
    return 0;
}

static int restore(Pass *P, const Saved *sv) {
    double *rows[7];
    rows_of(P, rows);
    for (int q = 0; q < 7; q++)
        for (Py_ssize_t i = 0; i < P->nlive; i++) rows[q][P->live[i]] = sv->f[q][i];
    for (Py_ssize_t i = 0; i < P->nlive; i++) {
        int64_t r = P->live[i];
        P->state[r] = sv->state[i];
        P->turn[r] = sv->turn[i];
        P->moved[r] = sv->moved[i];
    }
    P->fk.n = P->ft.n = 0;
    for (Py_ssize_t j = 0; j < sv->fk.n; j++)
        if (ivec_push(&P->fk, sv->fk.p[j]) < 0 || dvec_push(&P->ft, sv->ft.p[j]) < 0) return -1;
    P->decoded = sv->decoded;
    for (Py_ssize_t j = 0; j < P->K; j++) P->later_debt[j] = 0.0;
    return 0;
}

static void free_saved(Saved *sv) {
    for (int q = 0; q < 7; q++) free(sv->f[q]);
    free(sv->state);
    free(sv->turn);
    free(sv->moved);
    free(sv->fk.p);
    free(sv->ft.p);
}

PyDoc_STRVAR(decode_slice_doc,
             "decode_slice(arrays, n, width, instances, t, dt, decoded, headroom, work0, attn, max_num_seqs, "
             "preemption_factor, max_churn, tolerance) -> (decoded, busy_gpu_s, capacity_tokens, still, fk, ft, "
             "touched)\n\nDecode the slice [t, t + dt): SliceDecode._decode (libra/sim/native.py packs the "
             "arguments; `still` is None when nothing ran).");

static PyObject *decode_slice(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, S, K, m = -1;
    double t, dt, decoded, headroom, work0, attn, max_seqs, preemption, max_churn, tolerance;
    if (!PyArg_ParseTuple(args, "O!nnndddddddddd", &PyTuple_Type, &arrays, &n, &S, &K, &t, &dt, &decoded, &headroom,
                          &work0, &attn, &max_seqs, &preemption, &max_churn, &tolerance))
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
    int64_t *count_k = NULL, *queued_k = NULL;
    double *used = NULL, *ctx_k = NULL, *step2 = NULL, *real = NULL, *busy = NULL, *avail = NULL, *cap_ctx = NULL;
    double busy_sum = 0.0, capacity = 0.0;
    if (acquire(arrays, SPEC, N_ARRAYS, b, n, S, K, &m) < 0) goto fail;
#define D(i) ((double *)b[i].view.buf)
#define Q(i) ((int64_t *)b[i].view.buf)
#define U(i) ((uint8_t *)b[i].view.buf)
#define LEN(i) (b[i].view.len / b[i].view.itemsize)
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
    P.ndeg = LEN(A_DEGREES) / DEG_FIELDS;
    for (Py_ssize_t i = 0; i < P.ndeg; i++) {
        const double *row = D(A_DEGREES) + i * DEG_FIELDS;
        P.deg[i] = (Degree){(int64_t)row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8]};
    }
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
    if (merge_new_slots(&P, 0) < 0) goto nomem;
    double *debt = D(A_DEBT), *occ = D(A_OCCUPANCY), *span_end = D(A_SPAN_END), *step = D(A_STEP_OUT);
    const double *ready_at = D(A_READY_AT);
    const uint8_t *active = U(A_ACTIVE);
    count_k = calloc((size_t)K + 1, sizeof(int64_t));
    queued_k = malloc(((size_t)K + 1) * sizeof(int64_t));
    used = malloc(((size_t)K + 1) * sizeof(double));
    ctx_k = malloc(((size_t)K + 1) * sizeof(double));
    step2 = malloc(((size_t)K + 1) * sizeof(double));
    real = malloc(((size_t)K + 1) * sizeof(double));
    busy = malloc(((size_t)K + 1) * sizeof(double));
    avail = malloc(((size_t)K + 1) * sizeof(double));
    cap_ctx = malloc(((size_t)K + 1) * sizeof(double));
    in.running = malloc(((size_t)P.nlive + 1) * sizeof(int64_t));
    if (!count_k || !queued_k || !used || !ctx_k || !step2 || !real || !busy || !avail || !cap_ctx || !in.running)
        goto nomem;
    /* the running requests, ascending (`_in_state(RUN)`), their indices checked */
    for (Py_ssize_t i = 0; i < P.nlive; i++) {
        int64_t r = P.live[i];
        if (r < 0 || r >= n || P.where[r] < -1 || P.where[r] >= K || P.state[r] < WAIT || P.state[r] > DONE) {
            PyErr_SetString(PyExc_ValueError, "decode_slice: a live request's index, instance or state is out of range");
            goto fail;
        }
        if (P.state[r] != RUN) continue;
        if (P.where[r] < 0 || P.turn[r] < 0 || P.turn[r] >= S || P.nseg[r] > S) {
            PyErr_SetString(PyExc_ValueError, "decode_slice: a running request's instance or turn is out of range");
            goto fail;
        }
        in.running[in.m++] = r;
        count_k[P.where[r]]++;
    }
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
        if (save(&P, &sv) < 0) goto nomem;
        /* `step_batch`: the running requests, scaled by the last slice's occupancy */
        const double *occ_before = D(A_OCC_BEFORE);
        int scale = LEN(A_OCC_BEFORE) == K;
        for (Py_ssize_t j = 0; j < K; j++) {
            double bj = (double)count_k[j];
            used[j] = (scale && bj > 0) ? np_max(1.0, bj * occ_before[j]) : bj;
        }
        step_inputs(&P, in.running, mm, t, ctx_k, queued_k);
        /* `_pass_inputs` */
        for (Py_ssize_t j = 0; j < K; j++) {
            avail[j] = np_max(0.0, dt - debt[j]);
            in.first[j] = t + dt;
            in.has[j] = count_k[j] > 0;
            in.open_s[j] = np_max(1e-9, avail[j] * (double)count_k[j]);
            in.occupied[j] = in.has[j] && avail[j] > 0;
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
        }
        if (step_times(&st, &P, used, ctx_k, queued_k, step) < 0) goto fail;
        P.step = step;
        if (run_pass(&P, &in, t, dt, span_end, occ, real, &still) < 0) goto fail_or_nomem;
        /* the batch each instance really ran at; decoded again where it moves the step time past the tolerance */
        for (Py_ssize_t j = 0; j < K; j++) real[j] = real[j] > 0 ? real[j] : used[j];
        int64_t *queued_now = malloc(((size_t)K + 1) * sizeof(int64_t));
        double *ctx_now = malloc(((size_t)K + 1) * sizeof(double));
        if (!queued_now || !ctx_now) {
            free(queued_now);
            free(ctx_now);
            goto nomem;
        }
        step_inputs(&P, in.running, mm, t, ctx_now, queued_now);
        int bad = step_times(&st, &P, real, ctx_now, queued_now, step2);
        free(queued_now);
        free(ctx_now);
        if (bad < 0) goto fail;
        int off = 0;
        for (Py_ssize_t j = 0; j < K; j++)
            if (isfinite(step[j]) && fabs(step2[j] - step[j]) > tolerance * step[j]) off = 1;
        if (off) {
            if (restore(&P, &sv) < 0) goto nomem;
            if (step_times(&st, &P, real, ctx_k, queued_k, step) < 0) goto fail;
            if (run_pass(&P, &in, t, dt, span_end, occ, real, &still) < 0) goto fail_or_nomem;
        }
        for (Py_ssize_t j = 0; j < K; j++) busy[j] = count_k[j] > 0 ? dt : np_min(debt[j], dt);
    } else {
        for (Py_ssize_t j = 0; j < K; j++) busy[j] = np_min(debt[j], dt);
    }
    /* busy_gpu_s += (busy_k * tp).sum() */
    for (Py_ssize_t j = 0; j < K; j++) busy[j] = busy[j] * (double)P.itp[j];
    busy_sum = np_sum(busy, K);
    /* `_capacity`: what the started, active instances could decode at their largest batch */
    {
        double *up = busy; /* reused */
        int any = 0;
        for (Py_ssize_t j = 0; j < K; j++) {
            up[j] = np_max(0.0, (t + dt) - np_max(t, ready_at[j])) * (active[j] ? 1.0 : 0.0);
            if (up[j] != 0.0) any = 1;
        }
        if (any) {
            double mean_all = 1.0;
            if (P.nlive) {
                double *g = real; /* reused as scratch: the live contexts */
                if (P.nlive > K) {
                    g = malloc((size_t)P.nlive * sizeof(double));
                    if (!g) goto nomem;
                }
                for (Py_ssize_t i = 0; i < P.nlive; i++) g[i] = P.ctx[P.live[i]];
                mean_all = np_sum(g, P.nlive) / (double)P.nlive;
                if (g != real) free(g);
            }
            if (ran) {
                for (Py_ssize_t j = 0; j < K; j++) ctx_k[j] = 0.0;
                for (Py_ssize_t i = 0; i < in.m; i++) ctx_k[P.where[in.running[i]]] += P.ctx[in.running[i]];
            }
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
                if (q) capacity += np_sum(step2, q);
                done_tp = tp;
            }
        }
    }
    for (Py_ssize_t j = 0; j < K; j++) debt[j] = np_max(0.0, debt[j] - dt) + P.later_debt[j];
    {
        PyObject *s = ran ? to_bytearray(still.p, still.n * (Py_ssize_t)sizeof(int64_t)) : Py_NewRef(Py_None);
        PyObject *f1 = to_bytearray(P.fk.p, P.fk.n * (Py_ssize_t)sizeof(int64_t));
        PyObject *f2 = to_bytearray(P.ft.p, P.ft.n * (Py_ssize_t)sizeof(double));
        if (s && f1 && f2) result = Py_BuildValue("dddNNNi", P.decoded, busy_sum, capacity, s, f1, f2, P.touched);
        else {
            Py_XDECREF(s);
            Py_XDECREF(f1);
            Py_XDECREF(f2);
        }
    }
    goto out;
fail_or_nomem:
    if (PyErr_Occurred()) goto fail;
nomem:
    PyErr_NoMemory();
fail:
out:
    release(b, N_ARRAYS);
    reset_lists(&P);
    free(P.fk.p);
    free(P.ft.p);
    free_saved(&sv);
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
    free(avail);
    free(cap_ctx);
    return result;
}

/* --- when to look again: `RolloutRun.next_event` ----------------------------------------------------------- */
enum { E_LIVE, E_STATE, E_READY, E_WHERE, E_DEBT, E_REM, E_STILL, E_STEP, E_READY_AT, N_EVENT };

static const Spec EVENT_SPEC[N_EVENT] = {
    {'q', '*', 0}, {'b', 'n', 0}, {'d', 'n', 0}, {'q', 'n', 0}, {'d', 'K', 0},
    {'d', 'n', 0}, {'q', '*', 0}, {'d', '*', 0}, {'d', 'K', 0},
};

PyDoc_STRVAR(next_event_doc, "next_event(arrays, n, instances, t, min_slice, max_slice, have_last) -> float\n\n"
                             "RolloutRun.next_event (libra/sim/native.py packs the arguments).");

static PyObject *next_event(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, K, m = -1;
    double t, min_slice, max_slice;
    int have_last;
    if (!PyArg_ParseTuple(args, "O!nndddp", &PyTuple_Type, &arrays, &n, &K, &t, &min_slice, &max_slice, &have_last))
        return NULL;
    Buf b[N_EVENT];
    memset(b, 0, sizeof(b));
    if (acquire(arrays, EVENT_SPEC, N_EVENT, b, n, 1, K, &m) < 0) goto out;
    const int64_t *live = Q(E_LIVE), *where = Q(E_WHERE), *still = Q(E_STILL);
    const int8_t *state = (const int8_t *)b[E_STATE].view.buf;
    const double *ready = D(E_READY), *debt = D(E_DEBT), *rem = D(E_REM), *step = D(E_STEP), *ready_at = D(E_READY_AT);
    Py_ssize_t nlive = LEN(E_LIVE), nstill = LEN(E_STILL);
    int any_run = 0, any_tool = 0, any_later = 0;
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
    int any_wait = 0;
    for (Py_ssize_t i = 0; i < nlive && !any_wait; i++) any_wait = state[live[i]] == WAIT;
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
    release(b, N_EVENT);
    return result;
}

PyDoc_STRVAR(decode_doc, "decode_step(decode_row, work0, attn, batch, context) -> float\n\nThe kernel's decode "
                         "step time (checked against RolloutCost.decode_step_time before the kernel is used).");

/* the floats of a tuple of `fields` terms (a row of `prefill_terms` or `decode_terms`) */
static int row_of(PyObject *row, int fields, double *out) {
    if (PyTuple_GET_SIZE(row) != fields) {
        PyErr_Format(PyExc_ValueError, "a row of terms has %d fields, got %zd", fields, PyTuple_GET_SIZE(row));
        return -1;
    }
    for (int i = 0; i < fields; i++) {
        out[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(row, i));
        if (out[i] == -1.0 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static PyObject *decode_py(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *row;
    double work0, attn, batch, context, f[DEC_FIELDS];
    if (!PyArg_ParseTuple(args, "O!dddd", &PyTuple_Type, &row, &work0, &attn, &batch, &context)) return NULL;
    if (row_of(row, DEC_FIELDS, f) < 0) return NULL;
    Dec d;
    dec_of_row(&d, f);
    return PyFloat_FromDouble(decode_step(&d, work0, attn, batch, context));
}

/* --- admission: `Admission._admit_queued` after the steal ------------------------------------------------ */
typedef struct {
    int64_t k, r;
    uint8_t fresh;
    double ready;
} Adm;

/* np.lexsort((ready, fresh, k)): by instance, turns under way before new requests, then readiness, stable */
static inline int adm_less(const Adm *a, const Adm *b) {
    if (a->k != b->k) return a->k < b->k;
    if (a->fresh != b->fresh) return a->fresh < b->fresh;
    return a->ready < b->ready;
}

DEFINE_STABLE_SORT(sort_adm, Adm, adm_less)
enum {
    B_WAITING, B_OPEN, B_ROOM, B_SEATS, B_RUN_K, B_WHERE, B_READY, B_FRESH, B_CTX, B_PENDING, B_LAG, B_STATE, B_DEBT,
    B_REFILLED, B_ITP, B_FK, B_FT, B_DEGREES, N_ADMIT
};

static const Spec ADMIT_SPEC[N_ADMIT] = {
    {'q', '*', 0}, {'?', 'K', 0}, {'d', 'K', 0}, {'q', 'K', 0}, {'q', 'K', 0}, {'q', 'n', 0},
    {'d', 'n', 0}, {'?', 'n', 1}, {'d', 'n', 0}, {'d', 'n', 1}, {'d', 'n', 1}, {'b', 'n', 1},
    {'d', 'K', 1}, {'q', 'K', 1}, {'q', 'K', 0}, {'q', '*', 0}, {'d', '*', 0}, {'d', '*', 0},
};

PyDoc_STRVAR(admit_doc, "admit(arrays, n, instances, t, headroom, overhead, work0, attn) -> (admitted, touched)\n\n"
                        "The admission pass at a slice boundary (libra/sim/native.py packs the arguments).");

static PyObject *admit(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *result = NULL;
    Py_ssize_t n, K, m = -1;
    double t, headroom, overhead, work0, attn;
    if (!PyArg_ParseTuple(args, "O!nnddddd", &PyTuple_Type, &arrays, &n, &K, &t, &headroom, &overhead, &work0,
                          &attn))
        return NULL;
    Buf b[N_ADMIT];
    memset(b, 0, sizeof(b));
    Adm *c = NULL;
    double *room = NULL, *within = NULL, *credit = NULL, *secs = NULL;
    int64_t *rank = NULL, *go_rank = NULL;
    IVec go = {0};
    Degree deg[MAX_DEG];
    int touched = 0;
    if (acquire(arrays, ADMIT_SPEC, N_ADMIT, b, n, 1, K, &m) < 0) goto fail;
    const int64_t *waiting = Q(B_WAITING), *seats = Q(B_SEATS), *run_k = Q(B_RUN_K), *where = Q(B_WHERE),
                  *itp = Q(B_ITP), *fk = Q(B_FK);
    const uint8_t *open_k = U(B_OPEN);
    const double *ready = D(B_READY), *ctx = D(B_CTX), *ft = D(B_FT);
    uint8_t *fresh = U(B_FRESH);
    double *pending = D(B_PENDING), *lag = D(B_LAG), *debt = D(B_DEBT);
    int8_t *state = (int8_t *)b[B_STATE].view.buf;
    int64_t *refilled = Q(B_REFILLED);
    Py_ssize_t nw = LEN(B_WAITING), nf = LEN(B_FK), ndeg = LEN(B_DEGREES) / DEG_FIELDS;
    if (LEN(B_FT) != nf || LEN(B_DEGREES) % DEG_FIELDS || ndeg > MAX_DEG) {
        PyErr_SetString(PyExc_ValueError, "admit: freed slots or degree table malformed");
        goto fail;
    }
    for (Py_ssize_t j = 0; j < nf; j++) {
        if (fk[j] < 0 || fk[j] >= K || (j && (fk[j] < fk[j - 1] || (fk[j] == fk[j - 1] && ft[j] < ft[j - 1])))) {
            PyErr_SetString(PyExc_ValueError, "admit: the freed slots must be sorted by (instance, time)");
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < ndeg; i++) {
        const double *row = D(B_DEGREES) + i * DEG_FIELDS;
        deg[i] = (Degree){(int64_t)row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8]};
    }
    c = malloc(((size_t)nw + 1) * sizeof(Adm));
    room = malloc(((size_t)K + 1) * sizeof(double));
    if (!c || !room) goto nomem;
    memcpy(room, D(B_ROOM), (size_t)K * sizeof(double));
    Py_ssize_t nc = 0;
    for (Py_ssize_t i = 0; i < nw; i++) {
        int64_t r = waiting[i];
        if (r < 0 || r >= n || where[r] < -1 || where[r] >= K) {
            PyErr_SetString(PyExc_ValueError, "admit: a waiting request's index or instance is out of range");
            goto fail;
        }
        int64_t w = where[r];
        if (w >= 0 && open_k[w]) {
            c[nc] = (Adm){w, r, fresh[r], ready[r]};
            nc++;
        }
    }
    if (nc) {
        if (sort_adm(c, nc) < 0) goto nomem;
        within = malloc((size_t)nc * sizeof(double));
        rank = malloc((size_t)nc * sizeof(int64_t));
        if (!within || !rank) goto nomem;
        /* the running sum over all candidates, each one's within its instance; an idle instance keeps headroom in
           units of its first candidate's context */
        double cs = 0.0, base = 0.0;
        for (Py_ssize_t i = 0; i < nc; i++) {
            double need = ctx[c[i].r];
            cs += need;
            if (i == 0 || c[i].k != c[i - 1].k) {
                rank[i] = 0;
                base = cs - need;
                if (run_k[c[i].k] == 0) room[c[i].k] -= headroom * need;
            } else {
                rank[i] = rank[i - 1] + 1;
            }
            within[i] = cs - base;
        }
        go_rank = malloc((size_t)nc * sizeof(int64_t));
        if (!go_rank) goto nomem;
        Py_ssize_t ng = 0;
        for (Py_ssize_t i = 0; i < nc; i++) {
            int64_t k = c[i].k;
            if ((within[i] <= room[k] && rank[i] < seats[k]) || (rank[i] == 0 && run_k[k] == 0)) {
                c[ng] = c[i];
                go_rank[ng] = rank[i];
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
                if (deg[q].tp == itp[c[i].k]) d = &deg[q];
            if (!d) {
                PyErr_SetString(PyExc_SystemError, "admit: an instance's degree is not in the table");
                goto fail;
            }
            secs[i] = (fresh[r] ? overhead : 0.0) + prefill(d, work0, attn, pending[r], ctx[r] / 2.0);
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
                touched |= (1 << state[r]) | (1 << RUN);
                state[r] = RUN;
            }
            if (ivec_push(&go, r) < 0) goto nomem;
        }
    }
    {
        PyObject *g = to_bytearray(go.p, go.n * (Py_ssize_t)sizeof(int64_t));
        if (g) result = Py_BuildValue("Ni", g, touched);
    }
    goto out;
nomem:
    PyErr_NoMemory();
fail:
out:
    release(b, N_ADMIT);
    free(c);
    free(room);
    free(within);
    free(rank);
    free(go_rank);
    free(secs);
    free(credit);
    free(go.p);
    return result;
}

PyDoc_STRVAR(prefill_doc, "prefill(degree_row, work0, attn, tokens, context) -> float\n\nThe kernel's prefill time "
                          "for one request (checked against RolloutCost.prefill_time before the kernel is used).");

static PyObject *prefill_py(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *row;
    double work0, attn, tokens, context, f[DEG_FIELDS];
    if (!PyArg_ParseTuple(args, "O!dddd", &PyTuple_Type, &row, &work0, &attn, &tokens, &context)) return NULL;
    if (row_of(row, DEG_FIELDS, f) < 0) return NULL;
    Degree d = {(int64_t)f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]};
    return PyFloat_FromDouble(prefill(&d, work0, attn, tokens, context));
}

PyDoc_STRVAR(pairwise_doc, "pairwise_sum(buffer) -> float\n\nnumpy's sum of a float64 buffer, pairwise (tests).");

static PyObject *pairwise_py(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (!format_is(&v, 'd')) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_TypeError, "pairwise_sum: a float64 buffer");
        return NULL;
    }
    double s = np_sum((const double *)v.buf, v.len / 8);
    PyBuffer_Release(&v);
    return PyFloat_FromDouble(s);
}

static PyMethodDef methods[] = {
    {"decode_slice", decode_slice, METH_VARARGS, decode_slice_doc},
    {"decode_step", decode_py, METH_VARARGS, decode_doc},
    {"admit", admit, METH_VARARGS, admit_doc},
    {"next_event", next_event, METH_VARARGS, next_event_doc},
    {"prefill", prefill_py, METH_VARARGS, prefill_doc},
    {"pairwise_sum", pairwise_py, METH_O, pairwise_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_slice_native", "The timed rollout's decode pass in C (libra/sim/native.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__slice_native(void) { return PyModule_Create(&module); }
