/* The turns under way that are queued (WAIT and not new), by readiness then index, kept from slice to slice in the
   rollout's arrays (`RolloutRun._order_*`): admission orders its candidates by instance, class and readiness, and a
   refill takes queued turns by readiness, and between two slices only a few turns join the queue (back from their
   tools) or leave it (admitted, taken back), so each slice merges the newcomers into the order instead of sorting
   every queue again. An entry holds its request's readiness when it joined: one whose request is not queued now,
   or is queued with another readiness (it left and came back), is dropped and its request unmarked, so it joins
   again, in its new place. Per instance, the entries in this order are each instance's queue by readiness, ties by
   index: the order of the stable sorts of the reference, whose lists are ascending by index. */

#include "slice_native.h"

typedef struct {
    double ready;
    int64_t r;
} Entry;

static inline int entry_less(const Entry *a, const Entry *b) {
    return a->ready < b->ready || (a->ready == b->ready && a->r < b->r);
}

DEFINE_STABLE_SORT(sort_entries, Entry, entry_less)

int sn_order_of(Order *o, const Buf *b, Py_ssize_t n, const char *who) {
    *o = (Order){(int64_t *)b[0].view.buf, (int64_t *)b[3].view.buf, (double *)b[1].view.buf,
                 (uint8_t *)b[2].view.buf, n};
    if (b[3].view.len != (Py_ssize_t)sizeof(int64_t) || *o->len < 0 || *o->len > n) {
        PyErr_Format(PyExc_ValueError, "%s: the kept order's length must be one count in [0, n]", who);
        return -1;
    }
    return 0;
}

void sn_order_drop(Order *o, const int8_t *state, const uint8_t *fresh, const double *ready) {
    Py_ssize_t len = (Py_ssize_t)*o->len, kept = 0;
    for (Py_ssize_t i = 0; i < len; i++) { /* what is still queued as it was */
        int64_t r = o->ids[i];
        if (state[r] == WAIT && !fresh[r] && ready[r] == o->ready[i]) {
            o->ids[kept] = r;
            o->ready[kept] = o->ready[i];
            kept++;
        } else {
            o->mark[r] = 0;
        }
    }
    *o->len = kept;
}

int sn_order_add(Order *o, const int64_t *add, Py_ssize_t nadd, const double *ready) {
    Py_ssize_t kept = (Py_ssize_t)*o->len;
    if (nadd == 0) return 0;
    Entry *e = malloc((size_t)nadd * sizeof(Entry));
    if (!e) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nadd; i++) {
        if (isnan(ready[add[i]])) { /* no order to keep: the callers sort */
            free(e);
            for (Py_ssize_t q = 0; q < kept; q++) o->mark[o->ids[q]] = 0;
            *o->len = 0;
            return 1;
        }
        e[i] = (Entry){ready[add[i]], add[i]};
    }
    if (sort_entries(e, nadd) < 0) {
        free(e);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t total = kept + nadd;
    if (total > o->cap) {
        free(e);
        PyErr_SetString(PyExc_ValueError, "order: more queued turns than requests");
        return -1;
    }
    /* merge from the back, in place: the kept entries are the first `kept` */
    Py_ssize_t i = kept - 1, j = nadd - 1, w = total - 1;
    while (j >= 0) {
        if (i >= 0 && entry_less(&e[j], &(Entry){o->ready[i], o->ids[i]})) {
            o->ids[w] = o->ids[i];
            o->ready[w] = o->ready[i];
            i--;
        } else {
            o->ids[w] = e[j].r;
            o->ready[w] = e[j].ready;
            o->mark[e[j].r] = 1;
            j--;
        }
        w--;
    }
    *o->len = total;
    free(e);
    return 0;
}
