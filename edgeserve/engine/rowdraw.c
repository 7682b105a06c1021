/* One exact draw from softmax(logits / T), compiled: draw.py's `RowSampler` calls `draw` for
 * every token it samples.
 *
 * draw(row, temperature, gap, u, random, scratch) -> token
 *
 * - row: the float32 logit row (a C-contiguous buffer of n floats), only read;
 * - two passes over the row, BLOCK logits at a time. The first finds each block's greatest
 *   logit and the row's, `best`; the second, reading the row from this core's cache, weighs
 *   each token within `gap` (in units of logit/T) of `best` at exp((logit - best) / T),
 *   eight at a time, and sums each block's weights, skipping a block whose greatest is
 *   outside the gap. The blocks' sums and greatest logits go to `scratch` (float64,
 *   2 * ceil(n / BLOCK)). A small model's row puts nearly its whole vocabulary within the
 *   gap (SmolLM2 at T = 0.7: 48k of 49k tokens); a large one's leaves most blocks out
 *   (Gemma's 262k). No value carries from one block to the next but the lanes' greatest,
 *   so the blocks overlap in the pipeline (one pass against a running best, rescaling the
 *   sums at the end, took three times as long on SmolLM2's rows);
 * - every token outside the gap weighs under e^-gap of the best: (their count) * e^-gap
 *   covers them all (the envelope);
 * - u in [0, 1) picks a point in (mass + envelope). In the mass, the block whose interval of
 *   the running sum holds it is found from the block sums, and its token by weighing that
 *   block's tokens again. In the envelope (at most 262,144 * e^-20 of the time), the tokens
 *   outside the gap are weighed exactly in float64 and the point picks among them or, in
 *   the envelope's slack, `random()` gives a uniform to draw again from the whole exact
 *   distribution: rejection sampling, so every token has its softmax probability.
 *
 * The vectors' exp is a polynomial within 2 ulp of the true value over the gap's range
 * (tests/unit/test_rowdraw.py): the distribution is softmax's to float32 precision, as numpy's
 * float32 exp made it before. The GIL stays held: a draw takes tens of microseconds, and a
 * thread that lets the GIL go may wait a switch interval (5 ms) to have it back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Eight floats at a time in GCC's and clang's vector extensions: one AVX2 register in the
 * clone built for CPUs that have it, two SSE2 ones on any x86-64, two NEON ones on arm64.
 * Sixteen (a 64-byte vector) made AVX2's comparisons lane-by-lane scalar code: 176 µs a draw
 * on SmolLM2's rows where eight take 38, while AVX-512 gained only 34 against 43. */
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef float f4 __attribute__((vector_size(16)));
typedef int32_t i4 __attribute__((vector_size(16)));

#define WIDTH 8
#define BLOCK 64 /* logits a block sum covers: four vectors */
#define MAX_GAP 80.0f /* the vectors' exp holds from e^-87 */

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define CLONED __attribute__((target_clones("avx2", "default")))
#else
#define CLONED
#endif

static inline vf load(const float *at)
{
    vf v;
    memcpy(&v, at, sizeof v); /* the row need not be aligned */
    return v;
}

/* Copies of x in every lane (-0 as +0, which no caller can tell): the sum of a zero vector and
 * a scalar, which GCC broadcasts once; a compound literal of sixteen x's it built lane by lane
 * with masked moves, inside the loops, costing the pass over a row two thirds of its time. */
static inline vf splat(float x)
{
    return (vf){0} + x;
}

/* Lanes of `a` where `take` is set, of `b` elsewhere. */
static inline vf pick(vi take, vf a, vf b)
{
    return (vf)(((vi)a & take) | ((vi)b & ~take));
}

/* e^x for x in [-80, 0]: x = k ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so that k ln2
 * is exact), e^r as 1 + r + r^2 q(r) with q a quartic fitted to (e^r - 1 - r) / r^2 over
 * that range (e^r's relative error under 4e-9, far inside float32's 6e-8), 2^k by building
 * the float's exponent. Lanes outside the range come out as garbage, for the caller to mask. */
static inline vf vexp(vf x)
{
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vf k = (x * splat(1.44269504f) + magic) - magic;
    vf r = (x - k * splat(0.693359375f)) - k * splat(-2.12194440e-4f);
    vf q = splat(0.00137514085508883f);
    q = q * r + splat(0.008368921466171741f);
    q = q * r + splat(0.04166953265666962f);
    q = q * r + splat(0.166665181517601f);
    q = q * r + splat(0.49999988079071045f);
    vf e = (r * r * q + r) + splat(1.0f);
    vi exponent = (__builtin_convertvector(k, vi) + 127) << 23;
    return e * (vf)exponent;
}

/* A vector of eight folded to four, lane by lane with `fold`. */
#define FOLD_TO_FOUR(v, fold)                                                                  \
    ({                                                                                         \
        f4 half[2];                                                                            \
        memcpy(half, &(v), sizeof half);                                                       \
        fold(half[0], half[1]);                                                                \
    })

static inline f4 greater4(f4 a, f4 b)
{
    i4 take = a > b; /* a NaN is never greater */
    return (f4)(((i4)a & take) | ((i4)b & ~take));
}

static inline f4 add4(f4 a, f4 b)
{
    return a + b;
}

/* The greatest of the lanes (-inf if none is a number). */
static inline float top(vf v)
{
    f4 four = FOLD_TO_FOUR(v, greater4);
    float best = -INFINITY;
    for (int k = 0; k < 4; k++)
        best = four[k] > best ? four[k] : best;
    return best;
}

/* The sum of the lanes. */
static inline double total(vf v)
{
    f4 four = FOLD_TO_FOUR(v, add4);
    return ((double)four[0] + four[1]) + ((double)four[2] + four[3]);
}

/* A token's offset from a reference in units of T, as the vectors work it out. */
static inline float offset(float logit, float reference, float inverse_t)
{
    return (logit - reference) * inverse_t;
}

/* The greatest logit of each block into `maxima` (the last, partial block padded with -inf),
 * and the row's greatest, returned: the first pass. Each block's greatest is folded from its
 * four vectors on its own, so blocks overlap in the pipeline; only the lanes' running
 * greatest carries from one block to the next. */
CLONED static float scan_row(const float *row, Py_ssize_t n, double *maxima)
{
    vf running = splat(-INFINITY);
    Py_ssize_t i = 0, b = 0;
    for (; i + BLOCK <= n; i += BLOCK, b++) {
        /* the row is read once, a cache line at a time: ask for the lines 16 blocks ahead
         * (a prefetch past the row's end is harmless) */
        __builtin_prefetch(row + i + 16 * BLOCK);
        __builtin_prefetch(row + i + 16 * BLOCK + 16);
        __builtin_prefetch(row + i + 16 * BLOCK + 32);
        __builtin_prefetch(row + i + 16 * BLOCK + 48);
        vf high = load(row + i);
        for (int j = 1; j < BLOCK / WIDTH; j++) {
            vf v = load(row + i + WIDTH * j);
            high = pick(v > high, v, high);
        }
        running = pick(high > running, high, running);
        maxima[b] = top(high);
    }
    if (i < n) {
        float best = -INFINITY;
        for (; i < n; i++)
            best = row[i] > best ? row[i] : best;
        running = pick(splat(best) > running, splat(best), running);
        maxima[b] = best;
    }
    return top(running);
}

/* The weights exp((logit - best) / T) of one block's tokens within the gap, summed; in
 * `*inside` the count of those tokens added (a set lane counts -1). */
static inline double weigh_block(const float *logits, float best, float inverse_t, float gap,
                                 vi *inside)
{
    vf sum = splat(0.0f);
    vi in_block = {0};
    for (int j = 0; j < BLOCK / WIDTH; j++) {
        vf x = (load(logits + WIDTH * j) - splat(best)) * splat(inverse_t);
        vi in = x >= splat(-gap);
        sum += (vf)((vi)vexp(x) & in);
        in_block += in;
    }
    *inside += in_block;
    return total(sum);
}

/* The second pass, over a row the first has brought into this core's cache: each block's
 * sum of weights into `sums` (0 for a block whose greatest logit is outside the gap, which
 * is skipped: most of a large vocabulary's blocks); how many tokens are within the gap. */
CLONED static Py_ssize_t weigh_row(const float *row, Py_ssize_t n, float best, float inverse_t,
                                   float gap, const double *maxima, double *sums)
{
    vi inside = {0};
    Py_ssize_t i = 0, b = 0;
    for (; i + BLOCK <= n; i += BLOCK, b++)
        sums[b] = offset((float)maxima[b], best, inverse_t) >= -gap
                      ? weigh_block(row + i, best, inverse_t, gap, &inside)
                      : 0.0;
    if (i < n) { /* the last, partial block, padded with logits that weigh nothing */
        float logits[BLOCK];
        for (int k = 0; k < BLOCK; k++)
            logits[k] = i + k < n ? row[i + k] : -INFINITY;
        sums[b] = weigh_block(logits, best, inverse_t, gap, &inside);
    }
    Py_ssize_t count = 0;
    for (int k = 0; k < WIDTH; k++)
        count -= inside[k];
    return count;
}

/* exp((logit - best) / T) in float64; 0 for a logit that is not a number. */
static inline double exact_weight(float logit, float best, float inverse_t)
{
    double w = exp((double)offset(logit, best, inverse_t));
    return w == w ? w : 0.0;
}

/* The token of block `b` whose interval of the block's running sum holds `point`, the block's
 * tokens weighed again; a point past the end by a rounding takes its last token within the
 * gap. */
static Py_ssize_t find_in_block(const float *row, Py_ssize_t n, Py_ssize_t b, double point,
                                float best, float inverse_t, float gap)
{
    Py_ssize_t start = b * BLOCK, end = start + BLOCK < n ? start + BLOCK : n, last = -1;
    double running = 0.0;
    for (Py_ssize_t k = start; k < end; k++) {
        float x = offset(row[k], best, inverse_t);
        if (!(x >= -gap))
            continue;
        last = k;
        running += exp((double)x);
        if (point < running)
            return k;
    }
    return last;
}

/* A draw whose point fell `point` into the envelope: the token outside the gap whose exact
 * weight holds it, or (-1) none, in the envelope's slack. */
static Py_ssize_t find_beyond(const float *row, Py_ssize_t n, double point, float best,
                              float inverse_t, float gap)
{
    double running = 0.0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (offset(row[k], best, inverse_t) >= -gap)
            continue;
        running += exact_weight(row[k], best, inverse_t);
        if (point < running)
            return k;
    }
    return -1;
}

/* A draw from the whole exact distribution, with `u` in [0, 1). */
static Py_ssize_t draw_exactly(const float *row, Py_ssize_t n, double u, float best,
                               float inverse_t)
{
    double total = 0.0;
    for (Py_ssize_t k = 0; k < n; k++)
        total += exact_weight(row[k], best, inverse_t);
    double point = u * total, running = 0.0;
    Py_ssize_t last = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        double w = exact_weight(row[k], best, inverse_t);
        if (w == 0.0)
            continue;
        last = k;
        running += w;
        if (point < running)
            return k;
    }
    return last;
}

/* A C-contiguous buffer of `format` items ("f": float32, "d": float64) from `obj`, or an
 * error. */
static int take_buffer(PyObject *obj, Py_buffer *view, const char *format, int writable,
                       const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *got = view->format;
    if (got != NULL && (got[0] == '@' || got[0] == '=' || got[0] == (PY_LITTLE_ENDIAN ? '<' : '>')))
        got++; /* native byte order, spelled out (ctypes' arrays do) */
    if (got == NULL || strcmp(got, format) != 0) {
        PyErr_Format(PyExc_TypeError, "draw: %s must hold %s", what,
                     format[0] == 'f' ? "float32" : "float64");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The token of a point in [0, mass + envelope); -1 with an exception set. */
static Py_ssize_t pick_token(const float *row, Py_ssize_t n, double *sums, double *maxima,
                             float temperature, float gap, double u, PyObject *random)
{
    float inverse_t = 1.0f / temperature;
    Py_ssize_t nblocks = (n + BLOCK - 1) / BLOCK;
    float best = scan_row(row, n, maxima);
    if (!(best > -INFINITY)) {
        PyErr_SetString(PyExc_ValueError, "draw: the row has no finite logit");
        return -1;
    }
    Py_ssize_t inside = weigh_row(row, n, best, inverse_t, gap, maxima, sums);
    double mass = 0.0;
    for (Py_ssize_t b = 0; b < nblocks; b++)
        mass += sums[b];
    double point = u * (mass + (double)(n - inside) * exp(-(double)gap));
    if (point < mass || inside == n) {
        Py_ssize_t b = 0;
        for (; b < nblocks - 1 && point >= sums[b]; b++)
            point -= sums[b];
        Py_ssize_t token = find_in_block(row, n, b, point, best, inverse_t, gap);
        if (token >= 0)
            return token;
        point = mass; /* an empty block by a rounding: past the mass, as below */
    }
    Py_ssize_t token = find_beyond(row, n, point - mass, best, inverse_t, gap);
    if (token >= 0)
        return token;
    PyObject *again = PyObject_CallNoArgs(random);
    if (again == NULL)
        return -1;
    double v = PyFloat_AsDouble(again);
    Py_DECREF(again);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    return draw_exactly(row, n, v, best, inverse_t);
}

static PyObject *draw(PyObject *self, PyObject *args)
{
    PyObject *row_obj, *random, *scratch_obj;
    Py_buffer row, scratch;
    float temperature, gap;
    double u;
    (void)self;
    if (!PyArg_ParseTuple(args, "OffdOO", &row_obj, &temperature, &gap, &u, &random,
                          &scratch_obj))
        return NULL;
    if (take_buffer(row_obj, &row, "f", 0, "the row") < 0)
        return NULL;
    if (take_buffer(scratch_obj, &scratch, "d", 1, "scratch") < 0) {
        PyBuffer_Release(&row);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = row.len / (Py_ssize_t)sizeof(float);
    Py_ssize_t nblocks = (n + BLOCK - 1) / BLOCK;
    if (n == 0)
        PyErr_SetString(PyExc_ValueError, "draw: the row is empty");
    else if (scratch.len < 2 * nblocks * (Py_ssize_t)sizeof(double))
        PyErr_SetString(PyExc_ValueError, "draw: scratch shorter than 2 * ceil(n / 64)");
    else if (!(temperature > 0.0f) || !isfinite(1.0f / temperature))
        PyErr_SetString(PyExc_ValueError, "draw: the temperature must be positive and finite");
    else if (!(gap > 0.0f && gap <= MAX_GAP))
        PyErr_SetString(PyExc_ValueError, "draw: the gap must be in (0, 80]");
    else if (!PyCallable_Check(random))
        PyErr_SetString(PyExc_TypeError, "draw: random must be callable");
    else {
        double *sums = (double *)scratch.buf;
        Py_ssize_t token = pick_token((const float *)row.buf, n, sums, sums + nblocks,
                                      temperature, gap, u, random);
        if (token >= 0)
            result = PyLong_FromSsize_t(token);
    }
    PyBuffer_Release(&row);
    PyBuffer_Release(&scratch);
    return result;
}

static PyMethodDef methods[] = {
    {"draw", draw, METH_VARARGS,
     "draw(row, temperature, gap, u, random, scratch) -> token: one exact draw from "
     "softmax(row / temperature), u picking the point and random() giving another uniform "
     "in the rare case that needs one (see rowdraw.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowdraw",
    "One exact softmax draw from a float32 logit row, in one pass (see draw.py and rowdraw.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__rowdraw(void)
{
    return PyModule_Create(&module);
}
