/*
 * weightdiag.kernels._kernels: the exact-histogram hot loops in C (see weightdiag/kernels/__init__.py, which
 * checks every input before it calls them, for the numpy fallback and this code alike).
 *
 * Every function takes a 2-D buffer (rows x row_length, any row stride, contiguous rows) of raw
 * element codes and releases the GIL while it runs, so Python threads can split one tensor across
 * cores. Histograms add into caller-provided int64 buffers. Searches return flat indices in the
 * 2-D view (row * row_length + column), -1 when nothing matches.
 *
 * No numpy headers are needed: arrays travel through the buffer protocol.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef struct {
    Py_buffer view;
    const char *base;
    Py_ssize_t rows, cols, row_stride;
} Grid;

static int grid_open(PyObject *obj, Py_ssize_t itemsize, Grid *g) {
    if (PyObject_GetBuffer(obj, &g->view, PyBUF_STRIDES) < 0) return -1;
    Py_buffer *v = &g->view;
    if (v->itemsize != itemsize || v->ndim != 2 || v->strides[1] != itemsize) {
        PyErr_Format(PyExc_ValueError, "expected a 2-D buffer of %zd-byte items with contiguous rows", itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    g->base = (const char *)v->buf;
    g->rows = v->shape[0];
    g->cols = v->shape[1];
    g->row_stride = v->strides[0];
    return 0;
}

#define ROW(g, type, r) ((const type *)((g).base + (r) * (g).row_stride))

/* The vectorisable scans get AVX-512 and AVX2 clones chosen at load time (GCC/Clang on x86-64
 * Linux); elsewhere they compile once for the baseline ISA. The histogram loops are scatter-bound
 * and gain nothing from wider vectors. */
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#endif
#ifndef MULTIVERSION
#define MULTIVERSION
#endif

static void *out_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t nbytes) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view->len != nbytes) {
        PyErr_Format(PyExc_ValueError, "output buffer must be %zd bytes, not %zd", nbytes, view->len);
        PyBuffer_Release(view);
        return NULL;
    }
    return view->buf;
}

static const void *in_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t nbytes) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view->len != nbytes) {
        PyErr_Format(PyExc_ValueError, "table must be %zd bytes, not %zd", nbytes, view->len);
        PyBuffer_Release(view);
        return NULL;
    }
    return view->buf;
}

/* hist16(codes2d, counts[65536] int64): add the histogram of 16-bit codes. */
static PyObject *hist16(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *out;
    if (!PyArg_ParseTuple(args, "OO", &data, &out)) return NULL;
    Grid g;
    if (grid_open(data, 2, &g) < 0) return NULL;
    Py_buffer ob;
    int64_t *counts = out_buffer(out, &ob, 65536 * 8);
    if (!counts) { PyBuffer_Release(&g.view); return NULL; }
    /* 32-bit counters (half the cache footprint of int64), added into `counts` long before they
     * could overflow. Measured: one counter array is as fast as 2-, 4- or 8-way sub-histograms. */
    uint32_t *sub = calloc(65536, sizeof(uint32_t));
    if (!sub) { PyBuffer_Release(&g.view); PyBuffer_Release(&ob); return PyErr_NoMemory(); }
    Py_BEGIN_ALLOW_THREADS
    int64_t pending = 0;
    for (Py_ssize_t r = 0; r < g.rows; r++) {
        const uint16_t *restrict p = ROW(g, uint16_t, r);
        for (Py_ssize_t done = 0; done < g.cols;) {
            Py_ssize_t step = g.cols - done < ((Py_ssize_t)1 << 30) ? g.cols - done : ((Py_ssize_t)1 << 30);
            Py_ssize_t i = done, end = done + step;
            /* Eight codes loaded before their eight increments, so the loads do not wait behind the
             * read-modify-write of the previous counter (17-25% faster than one at a time), and loaded
             * as two 64-bit words where the byte order allows (8% more on AMD EPYC, Zen 4: one load
             * per four codes). Two or four interleaved tables were slower there: the counters of
             * trained weights' codes then no longer fit the 32 KiB L1 cache. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            for (; i + 8 <= end; i += 8) {
                uint64_t x, y;
                memcpy(&x, p + i, 8);  /* rows may start at any even address: an unaligned load */
                memcpy(&y, p + i + 4, 8);
                sub[x & 0xFFFF]++; sub[(x >> 16) & 0xFFFF]++; sub[(x >> 32) & 0xFFFF]++; sub[x >> 48]++;
                sub[y & 0xFFFF]++; sub[(y >> 16) & 0xFFFF]++; sub[(y >> 32) & 0xFFFF]++; sub[y >> 48]++;
            }
#else
            for (; i + 8 <= end; i += 8) {
                uint16_t a = p[i], b = p[i + 1], c = p[i + 2], d = p[i + 3];
                uint16_t e = p[i + 4], f = p[i + 5], g = p[i + 6], h = p[i + 7];
                sub[a]++; sub[b]++; sub[c]++; sub[d]++; sub[e]++; sub[f]++; sub[g]++; sub[h]++;
            }
#endif
            for (; i < end; i++) sub[p[i]]++;
            done += step;
            pending += step;
            if (pending >= ((int64_t)1 << 31)) {
                for (int k = 0; k < 65536; k++) counts[k] += sub[k];
                memset(sub, 0, 65536 * sizeof(uint32_t));
                pending = 0;
            }
        }
    }
    for (int k = 0; k < 65536; k++) counts[k] += sub[k];
    Py_END_ALLOW_THREADS
    free(sub);
    PyBuffer_Release(&g.view);
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* Does any element of p[0..n) have (x & mask) == target?  Branch-free, so it vectorises. */
MULTIVERSION static int any16(const uint16_t *restrict p, Py_ssize_t n, uint16_t mask, uint16_t target) {
    int hit = 0;
    for (Py_ssize_t i = 0; i < n; i++) hit |= (uint16_t)(p[i] & mask) == target;
    return hit;
}

MULTIVERSION static int any32(const uint32_t *restrict p, Py_ssize_t n, uint32_t mask, uint32_t target) {
    int hit = 0;
    for (Py_ssize_t i = 0; i < n; i++) hit |= (p[i] & mask) == target;
    return hit;
}

#define BLOCK 4096

/* find16(codes2d, mask, target) / find32(...): first flat index with (x & mask) == target. */
#define DEFINE_FIND(name, type, anyfn)                                                         \
    static PyObject *name(PyObject *self, PyObject *args) {                                         \
        (void)self;                                                                                 \
        PyObject *data;                                                                             \
        unsigned long mask_, target_;                                                               \
        if (!PyArg_ParseTuple(args, "Okk", &data, &mask_, &target_)) return NULL;                    \
        Grid g;                                                                                     \
        if (grid_open(data, sizeof(type), &g) < 0) return NULL;                                     \
        type mask = (type)mask_, target = (type)target_;                                            \
        int64_t found = -1;                                                                         \
        Py_BEGIN_ALLOW_THREADS                                                                      \
        for (Py_ssize_t r = 0; r < g.rows && found < 0; r++) {                                      \
            const type *p = ROW(g, type, r);                                                        \
            for (Py_ssize_t b = 0; b < g.cols && found < 0; b += BLOCK) {                           \
                Py_ssize_t len = g.cols - b < BLOCK ? g.cols - b : BLOCK;                           \
                if (!anyfn(p + b, len, mask, target)) continue;                                      \
                for (Py_ssize_t i = b; i < b + len; i++) {                                          \
                    if ((type)(p[i] & mask) == target) { found = (int64_t)r * g.cols + i; break; }  \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        Py_END_ALLOW_THREADS                                                                        \
        PyBuffer_Release(&g.view);                                                                  \
        return PyLong_FromLongLong(found);                                                          \
    }

DEFINE_FIND(find16, uint16_t, any16)
DEFINE_FIND(find32, uint32_t, any32)

MULTIVERSION static uint32_t row_max_finite32(const uint32_t *restrict p, Py_ssize_t n) {
    uint32_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t a = p[i] & 0x7FFFFFFFu;
        uint32_t v = a < 0x7F800000u ? a + 1 : 0;
        m = v > m ? v : m;
    }
    return m;
}

/* max_finite32(bits2d) -> the largest finite |w| bit pattern (magnitude), -1 if none. */
static PyObject *max_finite32(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data;
    if (!PyArg_ParseTuple(args, "O", &data)) return NULL;
    Grid g;
    if (grid_open(data, 4, &g) < 0) return NULL;
    uint32_t best = 0; /* magnitude + 1, so 0 means "no finite element" */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < g.rows; r++) {
        uint32_t m = row_max_finite32(ROW(g, uint32_t, r), g.cols);
        best = m > best ? m : best;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&g.view);
    return PyLong_FromLongLong((int64_t)best - 1);
}

/* hist32(bits2d, thresholds[32768] u32, irregular[32768] i64 or None, counts[65536],
 *        above[32768], irregular_hist[n_irr * 65536]): one pass over F32 bit patterns. */
static PyObject *hist32(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *thr_obj, *irr_obj, *counts_obj, *above_obj, *irr_hist_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO", &data, &thr_obj, &irr_obj, &counts_obj, &above_obj, &irr_hist_obj))
        return NULL;
    Grid g;
    if (grid_open(data, 4, &g) < 0) return NULL;
    Py_buffer tb, ib, cb, ab, hb;
    const uint32_t *thr = NULL;
    const int64_t *irr = NULL;
    int64_t *counts = NULL, *above = NULL, *irr_hist = NULL;
    int have_irr = irr_obj != Py_None, got_t = 0, got_i = 0, got_c = 0, got_a = 0, got_h = 0;
    if ((thr = in_buffer(thr_obj, &tb, 32768 * 4))) got_t = 1;
    if (got_t && have_irr && (irr = in_buffer(irr_obj, &ib, 32768 * 8))) got_i = 1;
    if (got_t && (got_i || !have_irr) && (counts = out_buffer(counts_obj, &cb, 65536 * 8))) got_c = 1;
    if (got_c && (above = out_buffer(above_obj, &ab, 32768 * 8))) got_a = 1;
    if (got_a && have_irr) {
        if (PyObject_GetBuffer(irr_hist_obj, &hb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) == 0) {
            irr_hist = hb.buf;
            got_h = 1;
        }
    }
    if (!got_a || (have_irr && !got_h)) {
        if (got_t) PyBuffer_Release(&tb);
        if (got_i) PyBuffer_Release(&ib);
        if (got_c) PyBuffer_Release(&cb);
        if (got_a) PyBuffer_Release(&ab);
        PyBuffer_Release(&g.view);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < g.rows; r++) {
        const uint32_t *restrict p = ROW(g, uint32_t, r);
        if (irr) {
            for (Py_ssize_t i = 0; i < g.cols; i++) {
                uint32_t w = p[i], mag = w & 0x7FFFFFFFu, key = mag >> 16;
                counts[w >> 16]++;
                above[key] += mag >= thr[key];
                int64_t j = irr[key];
                if (j >= 0) irr_hist[j * 65536 + (mag & 0xFFFF)]++;
            }
        } else { /* the usual case: float32 log10 is monotone at every bin edge */
            for (Py_ssize_t i = 0; i < g.cols; i++) {
                uint32_t w = p[i], mag = w & 0x7FFFFFFFu, key = mag >> 16;
                counts[w >> 16]++;
                above[key] += mag >= thr[key];
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&tb);
    if (got_i) PyBuffer_Release(&ib);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&ab);
    if (got_h) PyBuffer_Release(&hb);
    PyBuffer_Release(&g.view);
    Py_RETURN_NONE;
}

/* power_sums(f32_2d, shift, sums[5] f64): adds sum d, d^2, d^3, d^4 for d = x - shift, and sum |x|
 * (all terms positive: no shift needed for the moments of |w|). */
static PyObject *power_sums(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *out;
    double shift;
    if (!PyArg_ParseTuple(args, "OdO", &data, &shift, &out)) return NULL;
    Grid g;
    if (grid_open(data, 4, &g) < 0) return NULL;
    Py_buffer ob;
    double *sums = out_buffer(out, &ob, 5 * sizeof(double));
    if (!sums) { PyBuffer_Release(&g.view); return NULL; }
    Py_BEGIN_ALLOW_THREADS
    /* Four independent accumulator sets keep the FP adds pipelined without -ffast-math. */
    double s[4][5] = {{0}};
    for (Py_ssize_t r = 0; r < g.rows; r++) {
        const float *restrict row = ROW(g, float, r);
        Py_ssize_t n4 = g.cols & ~(Py_ssize_t)3, i;
        for (i = 0; i < n4; i += 4) {
            for (int lane = 0; lane < 4; lane++) {
                double x = (double)row[i + lane], d = x - shift, d2 = d * d;
                s[lane][0] += d; s[lane][1] += d2; s[lane][2] += d2 * d; s[lane][3] += d2 * d2;
                s[lane][4] += fabs(x);
            }
        }
        for (; i < g.cols; i++) {
            double x = (double)row[i], d = x - shift, d2 = d * d;
            s[0][0] += d; s[0][1] += d2; s[0][2] += d2 * d; s[0][3] += d2 * d2;
            s[0][4] += fabs(x);
        }
    }
    for (int k = 0; k < 5; k++) sums[k] += s[0][k] + s[1][k] + s[2][k] + s[3][k];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob);
    PyBuffer_Release(&g.view);
    Py_RETURN_NONE;
}

/* count_nibbles(p, n, h): h[code] += how many of the 2n 4-bit codes of bytes p[0..n) are code (16 counters).
 * A group of 4-bit codes is counted by comparing every byte's two nibbles with each of the 16 codes, 32
 * bytes at a time (AVX2), into byte-wide accumulators summed once per run: one scatter increment per nibble
 * (the scalar loop) serialises on the few codes a group mostly holds. */
static void count_nibbles_scalar(const uint8_t *restrict p, Py_ssize_t n, int64_t *restrict h) {
    int64_t lo[16] = {0}, hi[16] = {0};  /* two sets: a byte's two increments never wait on each other */
    for (Py_ssize_t i = 0; i < n; i++) { lo[p[i] & 15]++; hi[p[i] >> 4]++; }
    for (int k = 0; k < 16; k++) h[k] += lo[k] + hi[k];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_NIBBLES_AVX2 1
__attribute__((target("avx2"))) static void count_nibbles_avx2(const uint8_t *p, Py_ssize_t n, int64_t *h) {
    const __m256i mask = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    Py_ssize_t i = 0;
    /* 64 bytes (128 codes, a usual group) at a time: their nibbles held in four registers, each code
     * compared with all four, the matches summed by one SAD; the four sums of a code land in the 16-bit
     * fields of four codes' 64-bit lanes, so four codes take one horizontal add. */
    for (; i + 64 <= n; i += 64) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(p + i));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + i + 32));
        __m256i l0 = _mm256_and_si256(v0, mask), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask);
        __m256i l1 = _mm256_and_si256(v1, mask), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask);
        for (int k0 = 0; k0 < 16; k0 += 4) {
            __m256i packed = zero;
            for (int j = 0; j < 4; j++) {
                __m256i code = _mm256_set1_epi8((char)(k0 + j));
                __m256i e = _mm256_add_epi8(_mm256_add_epi8(_mm256_cmpeq_epi8(l0, code), _mm256_cmpeq_epi8(h0, code)),
                                            _mm256_add_epi8(_mm256_cmpeq_epi8(l1, code), _mm256_cmpeq_epi8(h1, code)));
                __m256i s = _mm256_sad_epu8(_mm256_sub_epi8(zero, e), zero);  /* <= 32 in each 64-bit lane */
                packed = _mm256_or_si256(packed, _mm256_slli_epi64(s, 16 * j));
            }
            __m128i t = _mm_add_epi64(_mm256_castsi256_si128(packed), _mm256_extracti128_si256(packed, 1));
            uint64_t f = (uint64_t)_mm_cvtsi128_si64(t) + (uint64_t)_mm_extract_epi64(t, 1);  /* fields <= 128 */
            h[k0] += f & 0xFFFF; h[k0 + 1] += (f >> 16) & 0xFFFF; h[k0 + 2] += (f >> 32) & 0xFFFF; h[k0 + 3] += f >> 48;
        }
    }
    if (i < n) count_nibbles_scalar(p + i, n - i, h);
}
#endif

static int nibbles_avx2_ok = -1;

static void count_nibbles(const uint8_t *p, Py_ssize_t n, int64_t *h) {
#ifdef HAVE_NIBBLES_AVX2
    if (n >= 32) {
        if (nibbles_avx2_ok < 0) nibbles_avx2_ok = __builtin_cpu_supports("avx2") ? 1 : 0;
        if (nibbles_avx2_ok) { count_nibbles_avx2(p, n, h); return; }
    }
#endif
    count_nibbles_scalar(p, n, h);
}

/* count_slots(codes2d uint8, slots2d int32 [rows, groups], col0, group, bits, ncodes, out int64):
 * for quantized weights, how many elements of each (slot, code) a rectangle of packed codes holds. Row r's
 * element c (c counted from the rectangle's first column, col0 in the matrix) has code = its byte (bits 8)
 * or one nibble of byte c / 2 (bits 4: both nibbles of a byte are in one group, so which comes first
 * does not change the counts), and slot
 * slots[r][(col0 + c) / group - col0 / group]; out[slot * ncodes + code] += 1. Group boundaries never
 * split a byte (group and col0 are even for 4-bit codes). A code of ncodes or more (ncodes below 2^bits:
 * 4-bit codes kept one a byte) is an error, never a count in the next slot or past `out`. */
static PyObject *count_slots(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *slots_obj, *out;
    Py_ssize_t col0, group, ncodes;
    int bits;
    if (!PyArg_ParseTuple(args, "OOnninO", &data, &slots_obj, &col0, &group, &bits, &ncodes, &out))
        return NULL;
    Grid g, sg;
    if (grid_open(data, 1, &g) < 0) return NULL;
    if (grid_open(slots_obj, 4, &sg) < 0) { PyBuffer_Release(&g.view); return NULL; }
    Py_buffer ob;
    if (PyObject_GetBuffer(out, &ob, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&g.view); PyBuffer_Release(&sg.view); return NULL;
    }
    int64_t *counts = ob.buf;
    Py_ssize_t nslots_codes = ob.len / 8;
    Py_ssize_t per_byte = bits == 4 ? 2 : 1;
    Py_ssize_t elements = g.cols * per_byte;
    int bad = sg.rows != g.rows || group <= 0 || col0 < 0 || ncodes <= 0 || (bits != 4 && bits != 8) ||
              (bits == 4 && (group % 2 || col0 % 2));
    if (!bad && elements > 0 && (col0 + elements - 1) / group - col0 / group >= sg.cols) bad = 1;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "count_slots: inconsistent shapes");
        PyBuffer_Release(&g.view); PyBuffer_Release(&sg.view); PyBuffer_Release(&ob);
        return NULL;
    }
    int overflow = 0, bad_code = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t first_group = col0 / group;
    for (Py_ssize_t r = 0; r < g.rows && !overflow && !bad_code; r++) {  /* row by row: streams memory, scales with threads */
        const int32_t *srow = ROW(sg, int32_t, r);
        Py_ssize_t c = 0;
        while (c < elements) {
            Py_ssize_t gi = (col0 + c) / group;
            Py_ssize_t end = (gi + 1) * group - col0;
            if (end > elements) end = elements;
            int64_t base = (int64_t)srow[gi - first_group] * ncodes;
            if (base < 0 || base + ncodes > nslots_codes) { overflow = 1; break; }
            int64_t *restrict h = counts + base;
            const uint8_t *restrict p = ROW(g, uint8_t, r);
            if (bits == 8 && ncodes >= 256) {
                Py_ssize_t i = c;
                for (; i + 4 <= end; i += 4) { h[p[i]]++; h[p[i + 1]]++; h[p[i + 2]]++; h[p[i + 3]]++; }
                for (; i < end; i++) h[p[i]]++;
            } else if (bits == 8) {  /* codes below ncodes: checked, as the numpy fallback checks them */
                for (Py_ssize_t i = c; i < end; i++) {
                    if (p[i] >= ncodes) { bad_code = 1; break; }
                    h[p[i]]++;
                }
            } else if (ncodes == 16) {
                count_nibbles(p + c / 2, (end - c) / 2, h);
            } else {
                const uint8_t *restrict b = p + c / 2;
                Py_ssize_t n = (end - c) / 2;
                for (Py_ssize_t i = 0; i < n; i++) {
                    if (ncodes < 16 && ((b[i] & 15) >= ncodes || (b[i] >> 4) >= ncodes)) { bad_code = 1; break; }
                    h[b[i] & 15]++; h[b[i] >> 4]++;
                }
            }
            if (bad_code) break;
            c = end;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&g.view);
    PyBuffer_Release(&sg.view);
    PyBuffer_Release(&ob);
    if (overflow) { PyErr_SetString(PyExc_ValueError, "count_slots: slot out of range"); return NULL; }
    if (bad_code) { PyErr_SetString(PyExc_ValueError, "count_slots: code out of range"); return NULL; }
    Py_RETURN_NONE;
}

/* locate_slots(codes2d uint8, slots2d int32, col0, group, bits, ncodes, wanted uint8[slots * ncodes],
 * high_first) -> the rectangle's first element (row-major: r * elements + c) whose (slot, code) is wanted,
 * -1 when none; elements, slots and codes as count_slots reads them (high_first: a byte's high nibble is
 * its first element). Groups whose slot holds no wanted code are skipped whole. */
static PyObject *locate_slots(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *slots_obj, *wanted_obj;
    Py_ssize_t col0, group, ncodes;
    int bits, high_first;
    if (!PyArg_ParseTuple(args, "OOnninOp", &data, &slots_obj, &col0, &group, &bits, &ncodes, &wanted_obj, &high_first))
        return NULL;
    Grid g, sg;
    if (grid_open(data, 1, &g) < 0) return NULL;
    if (grid_open(slots_obj, 4, &sg) < 0) { PyBuffer_Release(&g.view); return NULL; }
    Py_buffer wb;
    if (PyObject_GetBuffer(wanted_obj, &wb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&g.view); PyBuffer_Release(&sg.view); return NULL;
    }
    const uint8_t *wanted = wb.buf;
    Py_ssize_t nslots = ncodes > 0 ? wb.len / ncodes : 0;
    Py_ssize_t per_byte = bits == 4 ? 2 : 1;
    Py_ssize_t elements = g.cols * per_byte;
    int bad = sg.rows != g.rows || group <= 0 || col0 < 0 || ncodes <= 0 || (bits != 4 && bits != 8) ||
              (bits == 4 && (group % 2 || col0 % 2));
    if (!bad && elements > 0 && (col0 + elements - 1) / group - col0 / group >= sg.cols) bad = 1;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "locate_slots: inconsistent shapes");
        PyBuffer_Release(&g.view); PyBuffer_Release(&sg.view); PyBuffer_Release(&wb);
        return NULL;
    }
    uint8_t *any_wanted = calloc(nslots ? nslots : 1, 1);  /* per slot: does it hold a wanted code */
    if (!any_wanted) {
        PyBuffer_Release(&g.view); PyBuffer_Release(&sg.view); PyBuffer_Release(&wb);
        return PyErr_NoMemory();
    }
    Py_ssize_t found = -1;
    int overflow = 0, bad_code = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < nslots * ncodes; k++) if (wanted[k]) any_wanted[k / ncodes] = 1;
    Py_ssize_t first_group = col0 / group;
    for (Py_ssize_t r = 0; r < g.rows && found < 0 && !overflow && !bad_code; r++) {
        const int32_t *srow = ROW(sg, int32_t, r);
        const uint8_t *p = ROW(g, uint8_t, r);
        Py_ssize_t c = 0;
        while (c < elements && found < 0) {
            Py_ssize_t gi = (col0 + c) / group;
            Py_ssize_t end = (gi + 1) * group - col0;
            if (end > elements) end = elements;
            int64_t slot = srow[gi - first_group];
            if (slot < 0 || slot >= nslots) { overflow = 1; break; }
            const uint8_t *w = wanted + slot * ncodes;
            if (any_wanted[slot]) {
                for (Py_ssize_t i = c; i < end; i++) {
                    unsigned code;
                    if (bits == 8) code = p[i];
                    else {
                        uint8_t b = p[i / 2];
                        code = ((i & 1) ^ (high_first != 0)) ? b >> 4 : b & 15;
                    }
                    if (code >= (unsigned)ncodes) { bad_code = 1; break; }  /* never a read past `wanted` */
                    if (w[code]) { found = r * elements + i; break; }
                }
            }
            if (bad_code) break;
            c = end;
        }
    }
    Py_END_ALLOW_THREADS
    free(any_wanted);
    PyBuffer_Release(&g.view);
    PyBuffer_Release(&sg.view);
    PyBuffer_Release(&wb);
    if (overflow) { PyErr_SetString(PyExc_ValueError, "locate_slots: slot out of range"); return NULL; }
    if (bad_code) { PyErr_SetString(PyExc_ValueError, "locate_slots: code out of range"); return NULL; }
    return PyLong_FromSsize_t(found);
}

/* weighted32(values f32[m], weights int64[m], shift, counts int64[65536] or None, sums f64[5] or None): the F32
 * reduction of elements given as distinct values held weights[i] times each (quantized weights counted per
 * scale group and code). Adds weights into counts by the top 16 bits; adds sum w*d, w*d^2, w*d^3, w*d^4 for
 * d = x - shift and sum w*|x| over the finite values. */
static PyObject *weighted32(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *vals_obj, *w_obj, *counts_obj, *sums_obj;
    double shift;
    if (!PyArg_ParseTuple(args, "OOdOO", &vals_obj, &w_obj, &shift, &counts_obj, &sums_obj)) return NULL;
    Py_buffer vb, wb, cb, sb;
    if (PyObject_GetBuffer(vals_obj, &vb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(w_obj, &wb, PyBUF_C_CONTIGUOUS) < 0) { PyBuffer_Release(&vb); return NULL; }
    Py_ssize_t m = vb.len / 4;
    int64_t *counts = NULL;
    double *sums = NULL;
    int got_c = 0, got_s = 0;
    if (wb.len != m * 8) {
        PyErr_SetString(PyExc_ValueError, "weighted32: values and weights differ in length");
        goto fail;
    }
    if (counts_obj != Py_None) {
        if (!(counts = out_buffer(counts_obj, &cb, 65536 * 8))) goto fail;
        got_c = 1;
    }
    if (sums_obj != Py_None) {
        if (!(sums = out_buffer(sums_obj, &sb, 5 * sizeof(double)))) goto fail;
        got_s = 1;
    }
    const uint32_t *bits = vb.buf;
    const float *x = vb.buf;
    const int64_t *w = wb.buf;
    Py_BEGIN_ALLOW_THREADS
    if (counts)
        for (Py_ssize_t i = 0; i < m; i++) counts[bits[i] >> 16] += w[i];
    if (sums) {
        double s[5] = {0};
        for (Py_ssize_t i = 0; i < m; i++) {
            if (!w[i] || (bits[i] & 0x7F800000u) == 0x7F800000u) continue;
            double wi = (double)w[i], v = (double)x[i], d = v - shift, d2 = d * d;
            s[0] += wi * d; s[1] += wi * d2; s[2] += wi * d2 * d; s[3] += wi * d2 * d2; s[4] += wi * fabs(v);
        }
        for (int k = 0; k < 5; k++) sums[k] += s[k];
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&vb);
    PyBuffer_Release(&wb);
    if (got_c) PyBuffer_Release(&cb);
    if (got_s) PyBuffer_Release(&sb);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&vb);
    PyBuffer_Release(&wb);
    if (got_c) PyBuffer_Release(&cb);
    return NULL;
}

/* reduce_slots(counts int64[n], table f32[n], first int32[32768], last int32[32768], counts16 int64[65536],
 * hist int64[1024], split int64[n], tops int64[TOPS]) -> (n_split, n_inf, top, n_tops): one pass over a
 * quantized piece counted per (slot, code), entry i being table[i] held counts[i] times. Adds the entries'
 * top-16-bit counts into counts16 and, where the value's 16-bit magnitude bucket lies inside one cohort bin
 * (first == last), its count into hist; entries in a bucket a bin edge splits are listed in split (their
 * bins need the cohort's float32 log10, taken by the caller). n_inf: elements that are +-Inf. top: the
 * largest finite |value| held (-1 when none); tops lists the entries holding it (n_tops may exceed TOPS:
 * then the caller finds them itself). */
#define TOPS 64
static PyObject *reduce_slots(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *c_obj, *t_obj, *f_obj, *l_obj, *c16_obj, *h_obj, *s_obj, *tops_obj;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &c_obj, &t_obj, &f_obj, &l_obj, &c16_obj, &h_obj, &s_obj, &tops_obj))
        return NULL;
    Py_buffer cb, tb, fb, lb, c16b, hb, sb, topb;
    int got = 0;
    if (PyObject_GetBuffer(c_obj, &cb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    got = 1;
    Py_ssize_t n = cb.len / 8;
    if (!in_buffer(t_obj, &tb, n * 4)) goto fail;
    got = 2;
    if (!in_buffer(f_obj, &fb, 32768 * 4)) goto fail;
    got = 3;
    if (!in_buffer(l_obj, &lb, 32768 * 4)) goto fail;
    got = 4;
    if (!out_buffer(c16_obj, &c16b, 65536 * 8)) goto fail;
    got = 5;
    if (!out_buffer(h_obj, &hb, 1024 * 8)) goto fail;
    got = 6;
    if (!out_buffer(s_obj, &sb, n * 8)) goto fail;
    got = 7;
    if (!out_buffer(tops_obj, &topb, TOPS * 8)) goto fail;
    got = 8;
    const int64_t *w = cb.buf;
    const uint32_t *bits = tb.buf;
    const int32_t *first = fb.buf, *last = lb.buf;
    int64_t *counts16 = c16b.buf, *hist = hb.buf, *split = sb.buf, *tops = topb.buf;
    Py_ssize_t n_split = 0, n_tops = 0;
    int64_t n_inf = 0;
    uint32_t top = 0;
    int have_top = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t wi = w[i];
        if (!wi) continue;
        uint32_t b = bits[i], mag = b & 0x7FFFFFFFu;
        counts16[b >> 16] += wi;
        if (mag >= 0x7F800000u) {  /* Inf or NaN: outside the histogram, never the largest |w| */
            if (mag == 0x7F800000u) n_inf += wi;
            continue;
        }
        uint32_t key = mag >> 16;
        int32_t bin = first[key];
        if (bin != last[key]) split[n_split++] = i;
        else if (bin >= 0 && bin < 1024) hist[bin] += wi;
        /* finite magnitudes order as their bit patterns */
        if (!have_top || mag > top) { top = mag; have_top = 1; n_tops = 0; }
        if (mag == top) { if (n_tops < TOPS) tops[n_tops] = i; n_tops++; }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&cb); PyBuffer_Release(&tb); PyBuffer_Release(&fb); PyBuffer_Release(&lb);
    PyBuffer_Release(&c16b); PyBuffer_Release(&hb); PyBuffer_Release(&sb); PyBuffer_Release(&topb);
    float topf;
    memcpy(&topf, &top, 4);
    return Py_BuildValue("nLdn", n_split, (long long)n_inf, have_top ? (double)topf : -1.0, n_tops);
fail:
    if (got > 0) PyBuffer_Release(&cb);
    if (got > 1) PyBuffer_Release(&tb);
    if (got > 2) PyBuffer_Release(&fb);
    if (got > 3) PyBuffer_Release(&lb);
    if (got > 4) PyBuffer_Release(&c16b);
    if (got > 5) PyBuffer_Release(&hb);
    if (got > 6) PyBuffer_Release(&sb);
    if (got > 7) PyBuffer_Release(&topb);
    return NULL;
}

/* pair16(base, tuned, values_b, values_t, limit_b, limit_t, thresholds u32[32768], codes u16[5 * 65536],
 *        counts i64[5 * 65536], delta f32[n] or None, tables u32[5 * 65536] zeroed) -> (unchanged, flips,
 *        nonfinite, top_b, at_b, top_t,
 *        at_t, top_d, at_d, top_r, at_r, s0, s1, s2, s3, s4, n_b, n_t, n_d, n_above, n_r, shift)
 * One pass over a block of a diff's pair: n 16-bit elements a side (contiguous), each side BF16 (values_x
 * None: the value is the code shifted into a float32) or any 16-bit float dtype given by its float32 value
 * table. Per element: both sides' codes counted; stored bits equal (unchanged); opposite nonzero signs
 * (flips); d = t - b in float32, counted by its top 16 bits, with the F32 path's cohort-bin corrections
 * ("above": as hist32 without irregular buckets); r = |d| / |b| in float32, counted by its top 16 bits;
 * float64 sums of y, y^2, y^3, y^4 (y = d - shift) and |d|, shift the mean of the first tile's finite d
 * (returned last); d written to delta when given. The five counts come
 * back packed, as their nonzero entries in code order: table j's n_j codes and counts at j * 65536 in
 * codes/counts (j: base, tuned, delta, above, ratio). top_x: the largest finite magnitude (16-bit codes
 * below limit_x for the sides, the float32 bits for d, the top 16 bits for r), plus one (0: none); at_x its
 * first index. nonfinite: elements whose d is not finite (either side Inf/NaN, or an overflow): the caller
 * then takes its float64 path for the block. n must be below 2^32 (the counters are 32-bit).
 * Two steps per tile: the float arithmetic over arrays (vectorised), then the counting (scalar). */
#define PAIR_TILE 2048

typedef struct {
    uint32_t top_b, top_t, top_d, top_r;  /* largest finite magnitude + 1 in the tile (0: none) */
    int64_t unchanged, flips, nonfinite;
} PairTile;

/* Float64 sums of y, y^2, y^3, y^4 (y = d - shift) and of |d| over a tile, in eight independent lanes per
 * sum (GCC/Clang vector types: left to the auto-vectoriser, this loop came out mostly scalar). */
typedef float pair_v8f __attribute__((vector_size(32)));
typedef double pair_v8d __attribute__((vector_size(64)));
typedef int64_t pair_v8l __attribute__((vector_size(64)));
MULTIVERSION static void pair_sums(const float *restrict d, Py_ssize_t n, double shift, double sums[5][8]) {
    pair_v8d acc[5];
    memcpy(acc, sums, sizeof acc);
    const pair_v8l magnitude = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    const pair_v8d s = {shift, shift, shift, shift, shift, shift, shift, shift};
    Py_ssize_t n8 = n & ~(Py_ssize_t)7, i;
    for (i = 0; i < n8; i += 8) {
        pair_v8f f;
        memcpy(&f, d + i, sizeof f);
        pair_v8d x = __builtin_convertvector(f, pair_v8d), y = x - s, y2 = y * y;
        acc[0] += y; acc[1] += y2; acc[2] += y2 * y; acc[3] += y2 * y2;
        acc[4] += (pair_v8d)((pair_v8l)x & magnitude);
    }
    memcpy(sums, acc, sizeof acc);
    for (; i < n; i++) {
        double x = (double)d[i], y = x - shift, y2 = y * y;
        sums[0][0] += y; sums[1][0] += y2; sums[2][0] += y2 * y; sums[3][0] += y2 * y2; sums[4][0] += fabs(x);
    }
}

/* The mean of the finite values of a tile (0 when none): the shift every sum of a call is taken around.
 * Sums taken around 0 and moved to the mean afterwards cancel when |mean| >> std (a LayerNorm-like ΔW);
 * around a value from the data they do not (what is left is the spread between tiles, itself large). */
static double tile_mean(const float *p, Py_ssize_t n) {
    double total = 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (isfinite(p[i])) { total += p[i]; k++; }
    }
    return k ? total / (double)k : 0.0;
}

/* The float arithmetic and everything that needs no table, over a tile (vectorised): d = t - b, the
 * index of d's counter (top 16 bits, then whether its magnitude reaches its bucket's cohort-bin threshold:
 * one counter array holds both hist32 outputs), the top 16 bits of |d| / |b|, the power sums, the
 * tile's largest magnitudes and the counts of equal codes, sign flips and non-finite d. */
MULTIVERSION static void pair_tile(const uint16_t *restrict ub, const uint16_t *restrict ut,
                                   const float *restrict vb, const float *restrict vt, Py_ssize_t n,
                                   uint32_t limit_b, uint32_t limit_t,
                                   float *restrict d, uint16_t *restrict rcode, PairTile *out) {
    if (!vb && !vt) {  /* BF16: the value is the code shifted (a loop of its own, so that it vectorises) */
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t wb = (uint32_t)ub[i] << 16, wt = (uint32_t)ut[i] << 16;
            float fb, ft;
            memcpy(&fb, &wb, 4);
            memcpy(&ft, &wt, 4);
            float di = ft - fb, ri = fabsf(di) / fabsf(fb);
            uint32_t rw;
            memcpy(&rw, &ri, 4);
            d[i] = di;
            rcode[i] = (uint16_t)(rw >> 16);
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            float fb, ft;
            if (vb) fb = vb[ub[i]]; else { uint32_t w = (uint32_t)ub[i] << 16; memcpy(&fb, &w, 4); }
            if (vt) ft = vt[ut[i]]; else { uint32_t w = (uint32_t)ut[i] << 16; memcpy(&ft, &w, 4); }
            float di = ft - fb, ri = fabsf(di) / fabsf(fb);
            uint32_t rw;
            memcpy(&rw, &ri, 4);
            d[i] = di;
            rcode[i] = (uint16_t)(rw >> 16);
        }
    }
    /* separate loops with branch-free masks: each one vectorises (a loop doing all of it did not) */
    uint32_t top_b = 0, top_t = 0, top_d = 0, top_r = 0;
    uint32_t unchanged = 0, flips = 0, nonfinite = 0;  /* a tile is far below 2^32 elements */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t b = ub[i], t = ut[i], mb = b & 0x7FFFu, mt = t & 0x7FFFu;
        unchanged += b == t;
        flips += ((b ^ t) >> 15) & (mb != 0) & (mt != 0);
        uint32_t vb1 = (mb + 1) & -(uint32_t)(mb < limit_b), vt1 = (mt + 1) & -(uint32_t)(mt < limit_t);
        top_b = top_b < vb1 ? vb1 : top_b;
        top_t = top_t < vt1 ? vt1 : top_t;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, &d[i], 4);
        uint32_t mag = w & 0x7FFFFFFFu, bad = mag >= 0x7F800000u;
        nonfinite += bad;
        uint32_t vd1 = (mag + 1) & (bad - 1);
        top_d = top_d < vd1 ? vd1 : top_d;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t rm = rcode[i] & 0x7FFFu, vr1 = (rm + 1) & -(uint32_t)(rm < 0x7F80u);
        top_r = top_r < vr1 ? vr1 : top_r;
    }
    out->top_b = top_b; out->top_t = top_t; out->top_d = top_d; out->top_r = top_r;
    out->unchanged = unchanged; out->flips = flips; out->nonfinite = nonfinite;
}

/* First i in [0, n) whose magnitude (+1, as pair_tile computes it) is `top`. */
/* The counter a float32 pattern goes to when its counts and hist32's cohort-bin corrections share one array:
 * 2 * its top 16 bits + (its magnitude reaches its bucket's threshold). */
static inline uint32_t f32_pair_key(uint32_t w, const uint32_t *thr) {
    uint32_t m = w & 0x7FFFFFFFu;
    return ((w >> 16) << 1) | (m >= thr[m >> 16]);
}

static Py_ssize_t pair_first16(const uint16_t *p, Py_ssize_t n, uint32_t limit, uint32_t top) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t m = p[i] & 0x7FFFu;
        if (m < limit && m + 1 == top) return i;
    }
    return -1;
}

static Py_ssize_t pair_first32(const float *p, Py_ssize_t n, uint32_t top) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, &p[i], 4);
        if ((w & 0x7FFFFFFFu) + 1 == top) return i;
    }
    return -1;
}

/* Append the nonzero entries of table[0..size) (code order) to codes/counts and zero them; how many. */
static Py_ssize_t pair_pack(uint32_t *restrict table, Py_ssize_t size, uint16_t *restrict codes,
                            int64_t *restrict counts) {
    Py_ssize_t k = 0;
    for (Py_ssize_t c = 0; c < size; c++) {
        if (table[c]) { codes[k] = (uint16_t)c; counts[k] = table[c]; k++; table[c] = 0; }
    }
    return k;
}

/* The counting tables (u32[PAIR_TABLES], the caller's, one per thread, zero on entry and left zero: fresh
 * arrays per block cost more in page faults than the counting): base, tuned, ratio: 65,536 each; ΔW: 2 x
 * 65,536 pairs [2 * top16 + (magnitude >= its bucket's threshold)], split into its counts and "above" when
 * packed. */
#define PAIR_TABLES (5 * 65536)

static PyObject *pair16(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *b_obj, *t_obj, *vb_obj, *vt_obj, *thr_obj, *codes_obj, *counts_obj, *d_obj, *tables_obj;
    unsigned int limit_b, limit_t;
    if (!PyArg_ParseTuple(args, "OOOOIIOOOOO", &b_obj, &t_obj, &vb_obj, &vt_obj, &limit_b, &limit_t, &thr_obj,
                          &codes_obj, &counts_obj, &d_obj, &tables_obj))
        return NULL;
    Py_buffer v[9];
    int got = 0;
    PyObject *result = NULL;
    const float *vb = NULL, *vt = NULL;
    float *delta = NULL;
    if (PyObject_GetBuffer(b_obj, &v[0], PyBUF_C_CONTIGUOUS) < 0) return NULL;
    got = 1;
    Py_ssize_t n = v[0].len / 2;
    if (!in_buffer(t_obj, &v[1], n * 2)) goto done;
    got = 2;
    if (vb_obj != Py_None) { if (!in_buffer(vb_obj, &v[2], 65536 * 4)) goto done; vb = v[2].buf; }
    got = 3;
    if (vt_obj != Py_None) { if (!in_buffer(vt_obj, &v[3], 65536 * 4)) goto done; vt = v[3].buf; }
    got = 4;
    if (!in_buffer(thr_obj, &v[4], 32768 * 4)) goto done;
    got = 5;
    if (!out_buffer(codes_obj, &v[5], PAIR_TABLES * 2)) goto done;
    got = 6;
    if (!out_buffer(counts_obj, &v[6], PAIR_TABLES * 8)) goto done;
    got = 7;
    if (d_obj != Py_None) { if (!out_buffer(d_obj, &v[7], n * 4)) goto done; delta = v[7].buf; }
    got = 8;
    if (!out_buffer(tables_obj, &v[8], PAIR_TABLES * 4)) goto done;
    got = 9;
    if ((uint64_t)n >= ((uint64_t)1 << 32)) {
        PyErr_SetString(PyExc_ValueError, "pair16: a block must hold fewer than 2^32 elements");
        goto done;
    }
    {
        uint32_t *pair_tables = v[8].buf;
        const uint16_t *pb = v[0].buf, *pt = v[1].buf;
        const uint32_t *restrict thr = v[4].buf;
        uint16_t *codes = v[5].buf;
        int64_t *counts = v[6].buf;
        uint32_t *restrict cb = pair_tables, *restrict ct = pair_tables + 65536, *restrict cr = pair_tables + 2 * 65536;
        uint32_t *restrict dpair = pair_tables + 3 * 65536;
        int64_t unchanged = 0, flips = 0, nonfinite = 0;
        int64_t at_b = -1, at_t = -1, at_d = -1, at_r = -1;
        uint32_t top_b = 0, top_t = 0, top_d = 0, top_r = 0;
        double sums[5][8] = {{0}}, shift = 0.0;
        Py_ssize_t packed[5];
        Py_BEGIN_ALLOW_THREADS
        float dbuf[PAIR_TILE];
        uint16_t rcode[PAIR_TILE];
        for (Py_ssize_t lo = 0; lo < n; lo += PAIR_TILE) {
            Py_ssize_t len = n - lo < PAIR_TILE ? n - lo : PAIR_TILE;
            const uint16_t *restrict b = pb + lo, *restrict t = pt + lo;
            float *d = delta ? delta + lo : dbuf;
            PairTile tile;
            pair_tile(b, t, vb, vt, len, limit_b, limit_t, d, rcode, &tile);
            if (lo == 0) shift = tile_mean(d, len);
            pair_sums(d, len, shift, sums);
            unchanged += tile.unchanged;
            flips += tile.flips;
            nonfinite += tile.nonfinite;
            /* a new largest magnitude: find where it first is (rare after the first tiles) */
            if (tile.top_b > top_b) { top_b = tile.top_b; at_b = lo + pair_first16(b, len, limit_b, top_b); }
            if (tile.top_t > top_t) { top_t = tile.top_t; at_t = lo + pair_first16(t, len, limit_t, top_t); }
            if (tile.top_d > top_d) { top_d = tile.top_d; at_d = lo + pair_first32(d, len, top_d); }
            if (tile.top_r > top_r) { top_r = tile.top_r; at_r = lo + pair_first16(rcode, len, 0x7F80u, top_r); }
            /* the counting: four increments an element (one table at a time was slower) */
            Py_ssize_t i = 0;
            for (; i + 4 <= len; i += 4) {
                uint32_t w[4];
                memcpy(w, d + i, sizeof w);
                uint32_t k[4];
                for (int j = 0; j < 4; j++) k[j] = f32_pair_key(w[j], thr);
                cb[b[i]]++; cb[b[i + 1]]++; cb[b[i + 2]]++; cb[b[i + 3]]++;
                ct[t[i]]++; ct[t[i + 1]]++; ct[t[i + 2]]++; ct[t[i + 3]]++;
                dpair[k[0]]++; dpair[k[1]]++; dpair[k[2]]++; dpair[k[3]]++;
                cr[rcode[i]]++; cr[rcode[i + 1]]++; cr[rcode[i + 2]]++; cr[rcode[i + 3]]++;
            }
            for (; i < len; i++) {
                uint32_t w;
                memcpy(&w, d + i, 4);
                cb[b[i]]++;
                ct[t[i]]++;
                dpair[f32_pair_key(w, thr)]++;
                cr[rcode[i]]++;
            }
        }
        packed[0] = pair_pack(cb, 65536, codes, counts);
        packed[1] = pair_pack(ct, 65536, codes + 65536, counts + 65536);
        packed[4] = pair_pack(cr, 65536, codes + 4 * 65536, counts + 4 * 65536);
        /* ΔW: its counts per top 16 bits, and "above" per magnitude bucket (both signs) */
        Py_ssize_t nd = 0, na = 0;
        uint16_t *dc = codes + 2 * 65536, *ac = codes + 3 * 65536;
        int64_t *dn = counts + 2 * 65536, *an = counts + 3 * 65536;
        for (Py_ssize_t key = 0; key < 32768; key++) {
            uint32_t *pos = dpair + 2 * key, *neg = dpair + 2 * (key | 0x8000);
            uint32_t up = pos[1] + neg[1];
            if (up) { ac[na] = (uint16_t)key; an[na] = up; na++; }
        }
        for (Py_ssize_t c = 0; c < 65536; c++) {
            uint32_t *pair = dpair + 2 * c;
            if (pair[0] | pair[1]) { dc[nd] = (uint16_t)c; dn[nd] = (int64_t)pair[0] + pair[1]; nd++; pair[0] = pair[1] = 0; }
        }
        packed[2] = nd;
        packed[3] = na;
        Py_END_ALLOW_THREADS
        double s[5];
        for (int k = 0; k < 5; k++) {
            s[k] = 0;
            for (int j = 0; j < 8; j++) s[k] += sums[k][j];
        }
        result = Py_BuildValue("LLLkLkLkLkLdddddnnnnnd", (long long)unchanged, (long long)flips,
                               (long long)nonfinite, (unsigned long)top_b, (long long)at_b, (unsigned long)top_t,
                               (long long)at_t, (unsigned long)top_d, (long long)at_d, (unsigned long)top_r,
                               (long long)at_r, s[0], s[1], s[2], s[3], s[4], packed[0], packed[1], packed[2],
                               packed[3], packed[4], shift);
    }
done:
    for (int k = 0; k < got; k++) {
        if ((k == 2 && !vb) || (k == 3 && !vt) || (k == 7 && !delta)) continue;
        PyBuffer_Release(&v[k]);
    }
    return result;
}

/* f32_pass(bits2d, thresholds u32[32768], counts i64[65536], above i64[32768], sums f64[5]) ->
 * (top, at, n_inf, nonfinite, shift): the F32 reduction in one pass over float32 bit patterns, instead of hist32,
 * max_finite32, find32 and power_sums one after the other: counts per top 16 bits, "above" (hist32's
 * cohort-bin corrections, without irregular buckets), the float64 sums of y, y^2, y^3, y^4 (y = x - shift)
 * and |x| over the finite x, the largest finite magnitude plus one (0: none) and its first flat index, how
 * many elements are +-Inf and how many not finite, and the shift (the mean of the first tile's finite x). Tiles as pair16: the maxima and sums
 * vectorised, then the counting. */
MULTIVERSION static void f32_tile(const uint32_t *restrict p, Py_ssize_t n, uint32_t *top, uint32_t *inf,
                                  uint32_t *nonfinite) {
    uint32_t best = 0, n_inf = 0, bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t mag = p[i] & 0x7FFFFFFFu, not_finite = mag >= 0x7F800000u;
        bad += not_finite;
        n_inf += mag == 0x7F800000u;
        uint32_t v = (mag + 1) & (not_finite - 1);
        best = best < v ? v : best;
    }
    *top = best;
    *inf = n_inf;
    *nonfinite = bad;
}

static PyObject *f32_pass(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *thr_obj, *c_obj, *a_obj, *s_obj;
    if (!PyArg_ParseTuple(args, "OOOOO", &data, &thr_obj, &c_obj, &a_obj, &s_obj)) return NULL;
    Grid g;
    if (grid_open(data, 4, &g) < 0) return NULL;
    Py_buffer v[4];
    int got = 0;
    PyObject *result = NULL;
    if (!in_buffer(thr_obj, &v[0], 32768 * 4)) goto done;
    got = 1;
    if (!out_buffer(c_obj, &v[1], 65536 * 8)) goto done;
    got = 2;
    if (!out_buffer(a_obj, &v[2], 32768 * 8)) goto done;
    got = 3;
    if (!out_buffer(s_obj, &v[3], 5 * 8)) goto done;
    got = 4;
    {
        const uint32_t *restrict thr = v[0].buf;
        int64_t *restrict counts = v[1].buf, *restrict above = v[2].buf;
        double *out_sums = v[3].buf;
        int64_t *restrict pairs = calloc(2 * 65536, sizeof(int64_t));
        if (!pairs) { PyErr_NoMemory(); goto done; }
        uint32_t top = 0;
        int64_t at = -1, n_inf = 0, nonfinite = 0;
        double sums[5][8] = {{0}}, shift = 0.0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < g.rows; r++) {
            const uint32_t *row = ROW(g, uint32_t, r);
            for (Py_ssize_t lo = 0; lo < g.cols; lo += PAIR_TILE) {
                Py_ssize_t len = g.cols - lo < PAIR_TILE ? g.cols - lo : PAIR_TILE;
                const uint32_t *restrict p = row + lo;
                uint32_t tile_top, tile_inf, tile_bad;
                f32_tile(p, len, &tile_top, &tile_inf, &tile_bad);
                n_inf += tile_inf;
                nonfinite += tile_bad;
                if (tile_top > top) {  /* a new largest magnitude: where it first is (rare after a few tiles) */
                    top = tile_top;
                    at = (int64_t)r * g.cols + lo + pair_first32((const float *)p, len, top);
                }
                if (r == 0 && lo == 0) shift = tile_mean((const float *)p, len);
                if (tile_bad == 0) {
                    pair_sums((const float *)p, len, shift, sums);
                } else {  /* Inf/NaN: left out of the sums */
                    for (Py_ssize_t i = 0; i < len; i++) {
                        if ((p[i] & 0x7FFFFFFFu) >= 0x7F800000u) continue;
                        float f;
                        memcpy(&f, &p[i], 4);
                        double x = (double)f, y = x - shift, y2 = y * y;
                        sums[0][0] += y; sums[1][0] += y2; sums[2][0] += y2 * y; sums[3][0] += y2 * y2;
                        sums[4][0] += fabs(x);
                    }
                }
                Py_ssize_t i = 0;
                for (; i + 4 <= len; i += 4) {
                    uint32_t k[4];
                    for (int j = 0; j < 4; j++) k[j] = f32_pair_key(p[i + j], thr);
                    pairs[k[0]]++; pairs[k[1]]++; pairs[k[2]]++; pairs[k[3]]++;
                }
                for (; i < len; i++) pairs[f32_pair_key(p[i], thr)]++;
            }
        }
        for (Py_ssize_t c = 0; c < 65536; c++) {
            counts[c] += pairs[2 * c] + pairs[2 * c + 1];
            above[c & 0x7FFF] += pairs[2 * c + 1];
        }
        for (int k = 0; k < 5; k++)
            for (int j = 0; j < 8; j++) out_sums[k] += sums[k][j];
        Py_END_ALLOW_THREADS
        free(pairs);
        result = Py_BuildValue("kLLLd", (unsigned long)top, (long long)at, (long long)n_inf, (long long)nonfinite,
                               shift);
    }
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&v[k]);
    PyBuffer_Release(&g.view);
    return result;
}

static PyMethodDef methods[] = {
    {"hist16", hist16, METH_VARARGS, "Add the 65,536-bin histogram of 16-bit codes."},
    {"find16", find16, METH_VARARGS, "First flat index with (x & mask) == target (16-bit)."},
    {"find32", find32, METH_VARARGS, "First flat index with (x & mask) == target (32-bit)."},
    {"max_finite32", max_finite32, METH_VARARGS, "Largest finite F32 magnitude bit pattern, -1 if none."},
    {"hist32", hist32, METH_VARARGS, "One pass over F32 bit patterns (codes, bin corrections)."},
    {"power_sums", power_sums, METH_VARARGS, "Add float64 power sums of (x - shift) and the sum of |x|."},
    {"count_slots", count_slots, METH_VARARGS, "Count quantized codes per (slot, code) over a rectangle."},
    {"weighted32", weighted32, METH_VARARGS, "Counts and power sums of F32 values held a weight each."},
    {"locate_slots", locate_slots, METH_VARARGS, "First element whose (slot, code) is wanted, -1 if none."},
    {"f32_pass", f32_pass, METH_VARARGS, "The F32 reduction in one pass: counts, bin corrections, sums, largest."},
    {"pair16", pair16, METH_VARARGS, "One pass over a diff block of two 16-bit sides: counts, dW, ratio, sums."},
    {"reduce_slots", reduce_slots, METH_VARARGS, "One pass over counted (slot, code) entries: counts, bins, top."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
