/* The timed rollout's slice in C: the module libra.sim._slice_native (libra/sim/native.py packs the arguments),
   the buffers of Python arrays, and numpy's arithmetic. Every float is the Python reference's bit for bit
   (tests/sim/test_slice_native.py and the golden reports): numpy's pairwise sum for `x.sum()`, a zeroed
   per-instance sum added after for `+= np.bincount(...)`, numpy's minimum and maximum for two floats, and no
   fused multiply-add (setup.py builds with -ffp-contract=off).

   Build: setup.py, as an optional module (no numpy headers: buffers by the buffer protocol). The parts:
   slice_native.h. */

#include "slice_native.h"

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
double sn_np_sum(const double *a, Py_ssize_t n) { return 0.0 + pairwise_sum(a, n); }

/* RolloutCost.prefill_time(tp, tokens, context), operand by operand */
Py_ssize_t sn_degrees(const double *rows, Py_ssize_t len, Degree *out) {
    if (len % DEG_FIELDS || len / DEG_FIELDS > MAX_DEG) return -1;
    for (Py_ssize_t i = 0; i < len / DEG_FIELDS; i++) {
        const double *row = rows + i * DEG_FIELDS;
        out[i] = (Degree){(int64_t)row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8]};
    }
    return len / DEG_FIELDS;
}

double sn_prefill(const Degree *d, double work0, double attn, double tokens, double context) {
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

int sn_format_is(const Py_buffer *v, char kind) {
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

PyObject *sn_to_bytearray(const void *p, Py_ssize_t nbytes) {
    return PyByteArray_FromStringAndSize(nbytes ? (const char *)p : "", nbytes);
}

/* the buffers of `arrays` as `spec` says: kind, length ('n' requests, 'w' requests x width, 'K' instances, 'm' the
   length of the first 'm' array, '*' any) and whether it is written */
int sn_acquire(PyObject *arrays, const Spec *spec, int count, Buf *b, Py_ssize_t n, Py_ssize_t S, Py_ssize_t K,
                   Py_ssize_t *m) {
    if (PyTuple_GET_SIZE(arrays) != count) {
        PyErr_Format(PyExc_ValueError, "needs %d arrays, got %zd", count, PyTuple_GET_SIZE(arrays));
        return -1;
    }
    for (int i = 0; i < count; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (spec[i].writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(arrays, i), &b[i].view, flags) < 0) return -1;
        b[i].held = 1;
        if (!sn_format_is(&b[i].view, spec[i].kind)) {
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

void sn_release(Buf *b, int count) {
    for (int i = 0; i < count; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

/* the floats of a tuple of `fields` terms (a row of `prefill_terms` or `decode_terms`) */
int sn_row_of(PyObject *row, int fields, double *out) {
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


PyDoc_STRVAR(decode_slice_doc,
             "decode_slice(arrays, n, width, instances, t, dt, decoded, headroom, work0, attn, max_num_seqs, "
             "preemption_factor, max_churn, tolerance, min_slice, max_slice) -> (decoded, busy_gpu_s, "
             "capacity_tokens, still, fk, ft, touched, left, next_at)\n\nDecode the slice [t, t + dt): "
             "SliceDecode._decode (libra/sim/native.py packs the arguments; `still` is None when nothing ran, `left` "
             "None when nothing finished; `next_at`: next_event(t + dt) after it, NaN where a row is bad).");

PyDoc_STRVAR(decode_doc, "decode_step(decode_row, work0, attn, batch, context) -> float\n\nThe kernel's decode "
                         "step time (checked against RolloutCost.decode_step_time before the kernel is used).");

PyDoc_STRVAR(admit_slice_doc,
             "admit_slice(arrays, n, K, t, headroom, overhead, max_num_seqs, steal, work0, attn) -> (touched, moved, "
             "tokens)\n\nAdmission._admit: both passes and the steal between them (steal: 0 off, 1 new, 2 all).");

PyDoc_STRVAR(returns_doc, "returns(arrays, n, S, K, slice_end) -> (touched, moving, carried)\n\n"
                          "The start of RolloutRun._returns: tool calls back before slice_end go to WAIT; the "
                          "requests whose routed move applies and what each carries.");

PyDoc_STRVAR(moves_doc, "moves(arrays, n, S, K, slice_end, interleaved, kv_bytes, bandwidth, work0, attn) -> touched\n\n"
                        "The rest of RolloutRun._returns: the routed moves of the requests `returns` gave, with "
                        "_assign, and each one's carried context by KV transfer or prefilled again.");

PyDoc_STRVAR(steal_doc, "steal(arrays, n, K, t, headroom, all, work0, attn) -> (bool, int, int)\n\n"
                        "Admission._steal: moves queued requests to idle open instances (where, stolen, pending); "
                        "returns whether any moved, the turns under way moved and their context tokens.");

PyDoc_STRVAR(next_event_doc, "next_event(arrays, n, instances, t, min_slice, max_slice, have_last) -> float\n\n"
                             "RolloutRun.next_event (libra/sim/native.py packs the arguments).");

PyDoc_STRVAR(prefill_doc, "prefill(degree_row, work0, attn, tokens, context) -> float\n\nThe kernel's prefill time "
                          "for one request (checked against RolloutCost.prefill_time before the kernel is used).");

static PyObject *prefill_py(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *row;
    double work0, attn, tokens, context, f[DEG_FIELDS];
    if (!PyArg_ParseTuple(args, "O!dddd", &PyTuple_Type, &row, &work0, &attn, &tokens, &context)) return NULL;
    if (sn_row_of(row, DEG_FIELDS, f) < 0) return NULL;
    Degree d = {(int64_t)f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]};
    return PyFloat_FromDouble(sn_prefill(&d, work0, attn, tokens, context));
}

PyDoc_STRVAR(pairwise_doc, "pairwise_sum(buffer) -> float\n\nnumpy's sum of a float64 buffer, pairwise (tests).");

static PyObject *pairwise_py(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (!sn_format_is(&v, 'd')) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_TypeError, "pairwise_sum: a float64 buffer");
        return NULL;
    }
    double s = sn_np_sum((const double *)v.buf, v.len / 8);
    PyBuffer_Release(&v);
    return PyFloat_FromDouble(s);
}

static PyMethodDef methods[] = {
    {"decode_slice", sn_decode_slice, METH_VARARGS, decode_slice_doc},
    {"decode_step", sn_decode_py, METH_VARARGS, decode_doc},
    {"steal", sn_steal, METH_VARARGS, steal_doc},
    {"admit_slice", sn_admit_slice, METH_VARARGS, admit_slice_doc},
    {"returns", sn_returns, METH_VARARGS, returns_doc},
    {"moves", sn_moves, METH_VARARGS, moves_doc},
    {"next_event", sn_next_event, METH_VARARGS, next_event_doc},
    {"prefill", prefill_py, METH_VARARGS, prefill_doc},
    {"pairwise_sum", pairwise_py, METH_O, pairwise_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_slice_native", "The timed rollout's slice in C (libra/sim/native.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__slice_native(void) { return PyModule_Create(&module); }
