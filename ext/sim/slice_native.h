/* What the files of the slice kernel share (ext/sim: pass.c, the decode pass with the turns inside a slice;
   slice.c, a slice's decoding around it; admit.c, admission; steal.c, its work-conserving steal; returns.c, the
   tool calls that return and the routed moves; order.c, the queued turns kept in order across slices; event.c,
   the next event; slice_native.c, the module, buffers and numpy's arithmetic).
   The module is libra.sim._slice_native (libra/sim/native.py); the Python reference is libra/sim/slices.py,
   admission.py and rollout.py. Exported names start with sn_. */

#ifndef LIBRA_SLICE_NATIVE_H
#define LIBRA_SLICE_NATIVE_H

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

/* append to a growable vector (doubling; -1 when out of memory) */
#define DEFINE_PUSH(NAME, VEC, T)                                                                                  \
    static inline int NAME(VEC *v, T x) {                                                                               \
        if (v->n == v->cap) {                                                                                    \
            Py_ssize_t cap = v->cap ? 2 * v->cap : 64;                                                           \
            T *p = realloc(v->p, (size_t)cap * sizeof(T));                                                       \
            if (!p) return -1;                                                                                   \
            v->p = p;                                                                                            \
            v->cap = cap;                                                                                        \
        }                                                                                                        \
        v->p[v->n++] = x;                                                                                        \
        return 0;                                                                                                \
    }

DEFINE_PUSH(ivec_push, IVec, int64_t)
DEFINE_PUSH(dvec_push, DVec, double)

/* a request's row as a pass may write it: rem, ctx, pending, ready, finish, lag, own; turn, state, moved */
typedef struct {
    int64_t r, turn;
    double f[7];
    int8_t state;
    uint8_t moved;
} Row;

typedef struct {
    Row *p;
    Py_ssize_t n, cap;
} RowVec;

DEFINE_PUSH(row_push, RowVec, Row)

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


/* `a.sum()` of a float64 array, as numpy sums it (slice_native.c) */
double sn_np_sum(const double *a, Py_ssize_t n);

/* RolloutCost.prefill_time(tp, tokens, context), operand by operand (slice_native.c) */
double sn_prefill(const Degree *d, double work0, double attn, double tokens, double context);

/* the queued turns under way by (readiness, index), kept across slices (order.c) */
typedef struct {
    int64_t *ids, *len;
    double *ready;
    uint8_t *mark; /* n: has an entry */
    Py_ssize_t cap;
} Order;

/* drop the entries no longer queued as they were (their requests unmarked) */
void sn_order_drop(Order *o, const int8_t *state, const uint8_t *fresh, const double *ready);
/* then merge in `add` (ascending: the requests queued, not new, unmarked after the drop); 0, 1 when a readiness is
   NaN (the order is then left empty: the callers sort), -1 with an exception set */
int sn_order_add(Order *o, const int64_t *add, Py_ssize_t nadd, const double *ready);

typedef struct {
    Py_ssize_t n, S, K, nlive, ndeg;
    double *rem, *ctx, *pending, *ready, *finish, *lag, *own;
    int8_t *state;
    int64_t *turn;
    uint8_t *moved;
    const uint8_t *stolen, *fresh, *tool_end;
    const int64_t *where, *nseg, *tool_tok, *gen, *carried, *rbucket, *ibucket, *itp, *live;
    const double *latency, *cap, *step;
    double *later_debt, *dec_s;
    Degree deg[MAX_DEG];
    double headroom, work0, attn, slice_end, decoded;
    int touched; /* a bit per state whose set of requests changed */
    /* freed slots, sorted by (instance, time) */
    IVec fk;
    DVec ft;
    /* once a slice, from the state at its start (`sn_slice_lists`) */
    struct Cand_ *qc;   /* turns under way queued, by instance (live order), each run sorted by readiness when
                           first needed */
    int64_t *q_start;   /* K + 1: instance k's run in `qc` */
    uint8_t *q_sorted;  /* K */
    int64_t *new_k;     /* K: new requests queued */
    IVec tool0;         /* turns in TOOL whose tool returns before the slice ends, ascending */
    int64_t *csr_start; /* K + 1 */
    int64_t *csr;       /* the live requests but the new ones queued, by instance, ascending within each */
    uint8_t *in_tool;   /* n: listed in `tool` */
    /* per pass (`sn_run_pass` starts them from the slice's) */
    int tool_dirty;
    IVec tool;          /* `tool0` and the turns that leave for a tool returning inside the slice, ascending once
                           sorted */
    IVec refilled;      /* requests taken back in this pass: the only ones whose own debt is not 0 */
    int64_t *left_wait; /* K: requests queued and ready at the slice start taken back in this pass */
    double t0;          /* the slice's start */
    int unplaced;       /* some live request waits with no instance (`sn_slice_lists`; no pass changes that) */
    Order *order;       /* the queued turns by readiness (NULL: none kept) */
    /* the first pass's undo log: each row it writes, as it was, saved before the first write (NULL: none kept) */
    RowVec *undo;
    uint8_t *kept;      /* n: in `undo` */
} Pass;

typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* the order held in four arrays (`b`: ids, readiness, marks, length, as `RolloutRun._order`); -1 with an exception
   when the length is not one count in [0, n] */
int sn_order_of(Order *o, const Buf *b, Py_ssize_t n, const char *who);

typedef struct {
    char kind, size;
    int writable;
} Spec;

/* buffers of Python arrays (slice_native.c) */
int sn_format_is(const Py_buffer *v, char kind);
PyObject *sn_to_bytearray(const void *p, Py_ssize_t nbytes);
int sn_acquire(PyObject *arrays, const Spec *spec, int count, Buf *b, Py_ssize_t n, Py_ssize_t S, Py_ssize_t K,
               Py_ssize_t *m);
void sn_release(Buf *b, int count);
int sn_row_of(PyObject *row, int fields, double *out);
#define D(i) ((double *)b[i].view.buf)
#define Q(i) ((int64_t *)b[i].view.buf)
#define U(i) ((uint8_t *)b[i].view.buf)
#define LEN(i) (b[i].view.len / b[i].view.itemsize)

/* --- one decode pass (pass.c) ------------------------------------------------------------------------------------- */
/* `_pass_inputs` of a slice: per running request its instance, the time it starts decoding and for how long, and
   what it has left of its segment; per instance its first start, whether it runs anything, the seconds it is
   open and whether it is occupied */
typedef struct {
    Py_ssize_t m;
    int64_t *running, *k;
    double *t_delay, *go_s, *rem0, *first, *open_s;
    uint8_t *has, *occupied;
} PassIn;

/* save request r's row in the undo log before a pass writes it; -1 when out of memory */
static inline int sn_keep_row(Pass *P, int64_t r) {
    if (!P->undo || P->kept[r]) return 0;
    P->kept[r] = 1;
    Row x = {r, P->turn[r], {P->rem[r], P->ctx[r], P->pending[r], P->ready[r], P->finish[r], P->lag[r], P->own[r]},
             P->state[r], P->moved[r]};
    return row_push(P->undo, x);
}

/* the slice's lists from the live requests, their indices checked (pass.c, `sn_slice_lists`) */
int sn_slice_lists(Pass *P, int64_t *running, Py_ssize_t *m, int64_t *count_k, int64_t *queued_k);
void sn_free_lists(Pass *P); /* at the slice's end */
int sn_merge_new_slots(Pass *P, Py_ssize_t from);
int sn_run_pass(Pass *P, const PassIn *in, double t, double dt, double *span_end, double *busy_end, double *occ,
                double *real, IVec *still);

/* the rows of a degree table (RolloutCost.prefill_terms, `native.degree_table`) into `out`: their count, or -1
   when malformed (slice_native.c) */
Py_ssize_t sn_degrees(const double *rows, Py_ssize_t len, Degree *out);

/* --- admission (admit.c, steal.c) ----------------------------------------------------------------------------- */
/* `_admit_queued` after the steal: the candidates `waiting` on open instances, their rows, the instances' room,
   seats and running counts, and the freed slots sorted by (instance, time) */
typedef struct {
    Py_ssize_t n, K, ndeg, nw, nf;
    const int64_t *waiting;
    const uint8_t *open_k;
    const double *room;
    const int64_t *seats, *run_k, *where;
    const double *ready;
    uint8_t *fresh;
    const double *ctx;
    double *pending, *lag;
    int8_t *state;
    double *debt;
    int64_t *refilled;
    const int64_t *itp, *fk;
    const double *ft;
    const Degree *deg;
    double t, headroom, overhead, work0, attn;
    const Order *order; /* the queued turns by readiness, refreshed (NULL: sort them) */
} AdmitIn;

int sn_admit_core(const AdmitIn *a, IVec *go, int *touched);

/* `_steal`: the waiting requests, the open instances' room and seats, the rows it reads and moves */
typedef struct {
    Py_ssize_t n, K, ndeg, nw;
    const int64_t *waiting;
    const uint8_t *open_k;
    const double *room;
    const int64_t *seats;
    int64_t *where;
    const uint8_t *fresh;
    const double *ready, *ctx;
    double *pending;
    uint8_t *stolen;
    const double *ready_at;
    const int64_t *ibucket, *itp;
    const Degree *deg;
    double t, headroom, work0, attn;
    int all;
    /* the queued turns under way by readiness, refreshed this boundary, and the states (NULL: sort them) */
    const Order *order;
    const int8_t *state;
} StealIn;

int sn_steal_core(const StealIn *s, long long *moved, long long *tokens);

/* `next_event`'s inputs: the rows it reads at time `t`, and the last slice's running requests with their instances'
   step times (`have_last`: the last slice ran some) */
typedef struct {
    Py_ssize_t n, K, nstill, nstep;
    const int8_t *state;
    const double *ready, *ready_at, *debt, *rem, *step;
    const int64_t *where, *still;
    double t, min_slice, max_slice;
    int have_last;
    int starting; /* some instance starts after `t` (else no waiting request's instance is read) */
    int checked;  /* every waiting request is known to have an instance (else each one's is checked) */
} EventIn;

/* what one scan of the live requests tells `next_event` (bad: a waiting request without a valid instance) */
typedef struct {
    int any_run, any_tool, any_wait, any_later, bad;
    double tool_min, later_min;
} EventScan;

/* whether some instance starts after `t` */
static inline int sn_starting(const double *ready_at, Py_ssize_t K, double t) {
    for (Py_ssize_t k = 0; k < K; k++)
        if (ready_at[k] > t) return 1;
    return 0;
}

/* note one live request (index checked by the caller); inline: it runs once per live request in each scan */
static inline void sn_event_note(EventScan *e, const EventIn *in, int64_t r) {
    int s = in->state[r];
    /* (the live requests' states follow no pattern a branch predictor could learn: the common ones are noted
       without a branch) */
    e->any_run |= s == RUN;
    e->any_wait |= s == WAIT;
    if (s == TOOL) {
        e->tool_min = e->any_tool ? np_min(e->tool_min, in->ready[r]) : in->ready[r];
        e->any_tool = 1;
    } else if ((in->starting || !in->checked) && s == WAIT) {
        int64_t w = in->where[r];
        if (w < 0 || w >= in->K) {
            e->bad = 1;
        } else if (in->ready_at[w] > in->t) {
            e->later_min = e->any_later ? np_min(e->later_min, in->ready_at[w]) : in->ready_at[w];
            e->any_later = 1;
        }
    }
}

/* the time from a scan of every live request, or -1 with an exception set (event.c; by value, so that the caller
   never takes the structs' addresses and its scan may keep their fields in registers) */
int sn_event_time(EventScan e, EventIn in, double *out);

/* the module's functions */
PyObject *sn_decode_slice(PyObject *self, PyObject *args);
PyObject *sn_decode_py(PyObject *self, PyObject *args);
PyObject *sn_steal(PyObject *self, PyObject *args);
PyObject *sn_admit_slice(PyObject *self, PyObject *args);
PyObject *sn_returns(PyObject *self, PyObject *args);
PyObject *sn_moves(PyObject *self, PyObject *args);
PyObject *sn_next_event(PyObject *self, PyObject *args);

#endif
