/* Admission at a slice boundary after the work-conserving steal: `Admission._admit_queued` from its candidates
   on, with `_credit` (libra/sim/admission.py, the reference). */

#include "slice_native.h"

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

PyObject *sn_admit(PyObject *self, PyObject *args) {
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
    if (sn_acquire(arrays, ADMIT_SPEC, N_ADMIT, b, n, 1, K, &m) < 0) goto fail;
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
            secs[i] = (fresh[r] ? overhead : 0.0) + sn_prefill(d, work0, attn, pending[r], ctx[r] / 2.0);
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
        PyObject *g = sn_to_bytearray(go.p, go.n * (Py_ssize_t)sizeof(int64_t));
        if (g) result = Py_BuildValue("Ni", g, touched);
    }
    goto out;
nomem:
    PyErr_NoMemory();
fail:
out:
    sn_release(b, N_ADMIT);
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
