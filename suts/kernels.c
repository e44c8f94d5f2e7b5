/* The CPU fast path's kernels (built and loaded by suts/native.py, called by suts/fastpath.py).
 *
 * `linear`: linear layers of up to MAX_ROWS rows (decode steps, verify passes, batches) at the speed of their weights.
 * y[m, n] = b[n] + sum_k x[m, k] w[n, k]. The weights are packed once as panels of 16 outputs, p[n / 16][k][16] (N
 * padded with zeros to a multiple of 16): a panel streams from memory once, in order, while groups of up to 8 rows
 * (AVX-512: one vector each) or 6 (AVX2: two) keep their 16 sums each in registers. Every output is summed over k
 * in the same order with the same operations whatever M is and however many panels a pass takes: a row's result
 * does not depend on how many rows came with it.
 *
 * `forward`: a whole GPT forward of a short chunk per row against the KV cache (mlperf/model.py's, same math), in
 * one call: no Python, dispatch or small tensors between its ops. Every query's attention and every row's norms are
 * computed on their own, so a row's results depend neither on its batch nor on its chunk's length.
 *
 * `chain`: a forward, then greedy steps fed their own argmaxes: a draft model's proposals in one call.
 *
 * The names exported are none that libc exports: a call between them binds to a same-named symbol loaded first
 * (glibc's legacy `step`, for one).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The tunables in one block: choices of speed, each measured on the machines docs/measurements.md names (PANEL is
 * also the packed layout suts/packed.py writes, and MAX_ROWS what max_rows() tells suts/fastpath.py). */
#define MAX_ROWS 64 /* the most rows the fast path sends here; beyond, oneDNN's blocked kernels take over */
#define PANEL 16
#define GROUP (LANES == 16 ? 8 : 6) /* rows per pass over a panel: 16 sums per row, one AVX-512 register (32 of
                                     * them) or two of AVX2 (16: six rows' sums leave a register for the panel's
                                     * and one for the input) */
#define PANELS 4 /* panels one row takes a pass where its weights come from cache (a draft's): four chains of
                  * multiply-adds, not one waiting on its last (weights streamed from memory lose by it: hence
                  * CACHED); 2 or 3 rows take half as many */
#define STREAMS 2 /* panels a pass of 2 to FEW rows takes where its weights stream from memory (the target's): two
                   * chains on two streams half the range apart keep twice the loads in flight (four adjacent
                   * panels lose); one row takes ROW_STREAMS */
#define ROW_STREAMS(s, half) ((s) ? 4 : (half) ? 3 : 2) /* panels one row takes a pass where its weights stream:
                   * fp32 weights come from memory no faster with more streams, but narrow ones (in cache, widened
                   * as read) leave the multiply-adds to set the pace, and these take as many chains to hide their
                   * latency */
#define CACHED (512 * 1024) /* bytes of weights a pass reads that count as cached */
#define CHAIN_FETCH (8L << 20) /* bytes of weights a greedy chain asks L2 for before its first step */
#define FEW 4 /* rows that take their passes over streamed weights several panels at a time (STREAMS; one row
               * ROW_STREAMS) rather than in groups */
#define PREFETCH 256 /* panel rows ahead that a pass of several rows asks L2 for: its multiply-adds keep too few
                      * loads in flight to hide the memory's latency */
#define QUERIES 8 /* a row's queries of one head that one pass over its keys and values serves (a verify pass's, a
                   * prefill piece's): each key is read once for all of them, with Q times the multiply-adds per load */
#ifdef __AVX512F__
#define ACCS 16 /* accumulators an attention pass keeps in registers: AVX-512 has 32 vector registers, AVX2 16 */
#define WEIGHS 24 /* `weigh`'s, whose other registers hold a value row and a weight: up to 6 queries take all 64
                   * columns of a head in one pass */
#else
#define ACCS 8
#define WEIGHS 12
#endif

typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32), aligned(4)));
typedef signed char v8c __attribute__((vector_size(8), aligned(1)));

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* Multiply-adds are fused (one rounding) on every build, so that every build sums alike: AVX2's FMA instructions;
 * elsewhere fmaf per lane, which aarch64 compilers emit as its own fused instructions (vectorised into NEON's where
 * they pay) and x86-64 without FMA (a generic build) calls from libm. Nothing else is fused (-ffp-contract=off). */
#if defined(__AVX2__) && defined(__FMA__)
static inline v8 fma8(v8 a, v8 b, v8 c) { return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
static inline v8 fma8(v8 a, v8 b, v8 c) {
    for (int i = 0; i < 8; i++) c[i] = fmaf(a[i], b[i], c[i]);
    return c;
}
#endif

static inline float fma1(float a, float b, float c) { return fmaf(a, b, c); } /* one lane of fma8 */

static inline v8 splat(float s) { return (v8){s, s, s, s, s, s, s, s}; }

/* The vectors a panel row is summed in: one of AVX-512's 16 floats where the CPU has them, else two of 8. Each lane
 * takes the same multiply-adds either way, so the results are the same. */
#ifdef __AVX512F__
#define LANES 16
typedef float vec __attribute__((vector_size(64), aligned(4)));
typedef int veci __attribute__((vector_size(64), aligned(4)));
static inline vec vfma(vec a, vec b, vec c) { return (vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
static inline vec vsplat(float s) { return (vec)_mm512_set1_ps(s); }
static inline vec vwiden(const signed char *c) { /* 16 int8 as 16 floats, exactly */
    return (vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)c)));
}
#else
#define LANES 8
typedef v8 vec;
typedef v8i veci;
#define vfma fma8
#define vsplat splat
static inline v8 vwiden(const signed char *c) { /* 8 int8 as 8 floats, exactly */
#ifdef __AVX2__
    return (v8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)c)));
#else
    return __builtin_convertvector(*(const v8c *)c, v8);
#endif
}
#endif
#define VECS (PANEL / LANES) /* vectors a panel row takes */

/* LANES IEEE halves as floats, exactly (every half is a float): fp16 panels are widened as they are read, so the
 * sums are the ones their fp32 copy gives, from half the bytes. */
#if defined(__AVX512F__)
static inline vec vhalf(const unsigned short *h) {
    return (vec)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}
#elif defined(__AVX2__) && defined(__F16C__)
static inline vec vhalf(const unsigned short *h) { return (vec)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }
#else
static inline float half1(unsigned short h) {
    unsigned sign = (unsigned)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (!exp) { /* zero or subnormal: man x 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    bits = sign | (exp == 0x1fu ? 0x7f800000u : (exp + 112u) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline vec vhalf(const unsigned short *h) {
    vec v;
    for (int i = 0; i < LANES; i++) v[i] = half1(h[i]);
    return v;
}
#endif

/* The 16 outputs each of P panels, `apart` panels apart, for G rows (G <= GROUP, P <= PANELS; constants once
 * inlined). Float weights: w is the first panel (K, 16), fp32 or (half) fp16, the sums start at the bias. Int8
 * weights (s, the panels' scales, not NULL): w is the first panel of int8 (K, 16), each weight widened to float as
 * it is read, and the scale applied to the sums before the bias. */
static inline __attribute__((always_inline)) void group(int G, int P, const float *x, const void *w, const float *b,
                                                        const float *s, float *y, int K, int N, int n0, int apart,
                                                        int half) {
    vec acc[8][PANELS > 4 ? PANELS : 4][VECS]; /* G <= 8 (GROUP, or AVX2's group of 7); P <= PANELS, ROW_STREAMS or 2 */
    size_t width = s ? 1 : half ? 2 : sizeof(float), panel = (size_t)K * PANEL * width * apart; /* bytes of a weight,
                                                                                                * from a panel to
                                                                                                * the next taken */
    for (int m = 0; m < G; m++)
        for (int p = 0; p < P; p++)
            for (int i = 0; i < VECS; i++) acc[m][p][i] = s ? vsplat(0) : ((const vec *)(b + PANEL * apart * p))[i];
    for (int k = 0; k < K; k++) {
        if (G > 1 && (P == 1 || G >= FEW)) /* read (0), into L2 (2), each panel taken: a pass of FEW or more rows
                                             * gains by it, one of 2 or 3 rows over STREAMS panels loses */
            for (int p = 0; p < P; p++)
                __builtin_prefetch((const char *)w + p * panel + (size_t)(k + PREFETCH) * PANEL * width, 0, 2);
        for (int p = 0; p < P; p++) {
            const char *wk = (const char *)w + p * panel + (size_t)k * PANEL * width;
            vec wp[VECS];
            for (int i = 0; i < VECS; i++)
                wp[i] = s      ? vwiden((const signed char *)wk + LANES * i)
                        : half ? vhalf((const unsigned short *)wk + LANES * i)
                               : ((const vec *)wk)[i];
            for (int m = 0; m < G; m++) {
                vec xs = vsplat(x[(size_t)m * K + k]);
                for (int i = 0; i < VECS; i++) acc[m][p][i] = vfma(xs, wp[i], acc[m][p][i]);
            }
        }
    }
    for (int m = 0; s && m < G; m++)
        for (int p = 0; p < P; p++)
            for (int i = 0; i < VECS; i++)
                acc[m][p][i] = vfma(acc[m][p][i], ((const vec *)(s + PANEL * apart * p))[i],
                                    ((const vec *)(b + PANEL * apart * p))[i]);
    for (int m = 0; m < G; m++)
        for (int p = 0; p < P; p++)
            for (int e = 0, n = n0 + PANEL * apart * p; e < PANEL && n + e < N; e++)
                y[(size_t)m * N + n + e] = acc[m][p][e / LANES][e % LANES];
}

#define GROUPS(P, apart, q, h)                                                                                         \
    switch (G) {                                                                                                       \
    case 1: group(1, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                           \
    case 2: group(2, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                           \
    case 3: group(3, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                           \
    case 4: group(4, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                           \
    case 5: group(5, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                           \
    case 6: group(6, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                           \
    case 7: group(7, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                           \
    default: group(8, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h); break;                                          \
    }

/* G <= FEW rows' pass over panel j and the P - 1 panels `apart` after it. */
static inline __attribute__((always_inline)) void few_rows(int G, int P, int apart, const float *x, const char *p,
                                                           const float *b, const float *s, float *y, int K, int N,
                                                           int j, size_t panel, int half) {
    if (s) /* apart, as GROUPS: each kind of weight a pass inlined with its s and half constants */
        group(G, P, x, p + j * panel, b + j * PANEL, s + j * PANEL, y, K, N, j * PANEL, apart, 0);
    else if (half)
        group(G, P, x, p + j * panel, b + j * PANEL, NULL, y, K, N, j * PANEL, apart, 1);
    else
        group(G, P, x, p + j * panel, b + j * PANEL, NULL, y, K, N, j * PANEL, apart, 0);
}

/* Panel j and, for P = 2, panel j + apart, for all M rows in groups of up to GROUP rows: a panel comes from memory
 * for the first group and from cache for the others, so the weights stream once whatever M is. Where the weights
 * stream, the first group is a full one, the most work while the panel comes in; where they count as cached, the
 * rows are split evenly, so that no group is left with too few chains of multiply-adds (9 rows as 4 and 5, not 8
 * and 1). With AVX2, 7 rows over streamed fp32 weights (a verify pass of gamma 6) go as one group: the memory sets
 * the pace, and the sums spilled from its 16 registers cost less than a second group's pass. */
static inline __attribute__((always_inline)) void groups(int P, int apart, int M, const float *x, const void *p,
                                                         const float *b, const float *s, float *y, int K, int N,
                                                         int j, size_t panel, int cached, int half) {
    const void *w = (const char *)p + j * panel;
    const float *bj = b + j * PANEL, *sj = s ? s + j * PANEL : NULL;
    int most = VECS == 2 && M == GROUP + 1 && !cached && !half && !s ? M : GROUP;
    for (int g = 0, count = (M + most - 1) / most, m = 0, G; g < count; g++, m += G) {
        G = cached ? (M - m) / (count - g) : M - m < most ? M - m : most;
        const float *xm = x + (size_t)m * K;
        float *ym = y + (size_t)m * N;
        if (sj) GROUPS(P, apart, sj, 0) else if (half) GROUPS(P, apart, NULL, 1) else GROUPS(P, apart, NULL, 0)
    }
}

/* Panels lo..hi-1 for all M rows. A single row takes PANELS adjacent panels a pass where its weights count as
 * cached, 2 or 3 rows half as many; where they stream, one row takes ROW_STREAMS panels and up to FEW rows STREAMS,
 * from as many parts of the range. More rows go in groups (`groups`), over two panels a pass from the two halves of
 * the range where the multiply-adds set the pace (fp16 weights, widened as read; or more than one group, which
 * reads the panels again from cache; AVX-512, whose 32 registers hold the sums), else one (fp32 weights streamed
 * by one group, and int8 weights, lose by two: measured, docs/measurements.md). */
static void rows(int M, const float *x, const void *p, const float *b, const float *s, float *y, int K, int N,
                 int lo, int hi, int half) {
    size_t panel = (size_t)K * PANEL * (s ? 1 : half ? 2 : sizeof(float));
    int cached = panel * (hi - lo) <= CACHED, streams = M == 1 ? ROW_STREAMS(s, half) : STREAMS;
    int taken = !cached ? streams : M == 1 ? PANELS : PANELS / 2;
    int passes = M <= (cached ? 3 : FEW) ? (hi - lo) / taken : 0;
    for (int q = 0; q < passes; q++)
        if (cached)
            switch (M) {
            case 1: few_rows(1, PANELS, 1, x, p, b, s, y, K, N, lo + q * PANELS, panel, half); break;
            case 2: few_rows(2, PANELS / 2, 1, x, p, b, s, y, K, N, lo + q * (PANELS / 2), panel, half); break;
            default: few_rows(3, PANELS / 2, 1, x, p, b, s, y, K, N, lo + q * (PANELS / 2), panel, half); break;
            }
        else
            switch (M) { /* up to FEW: a constant row count, each inlined as its own loop */
            case 1:
                if (s) few_rows(1, ROW_STREAMS(1, 0), passes, x, p, b, s, y, K, N, lo + q, panel, half);
                else if (half) few_rows(1, ROW_STREAMS(0, 1), passes, x, p, b, s, y, K, N, lo + q, panel, half);
                else few_rows(1, ROW_STREAMS(0, 0), passes, x, p, b, s, y, K, N, lo + q, panel, half);
                break;
            case 2: few_rows(2, STREAMS, passes, x, p, b, s, y, K, N, lo + q, panel, half); break;
            case 3: few_rows(3, STREAMS, passes, x, p, b, s, y, K, N, lo + q, panel, half); break;
            default: few_rows(4, STREAMS, passes, x, p, b, s, y, K, N, lo + q, panel, half); break;
            }
    int j = lo + taken * passes, paired = VECS == 1 && M > FEW && !s && (half || M > GROUP);
    int pairs = paired ? (hi - j) / 2 : 0, apart = cached ? 1 : pairs; /* apart: the second panel's distance */
    for (int q = 0; q < pairs; q++, j += q % apart ? 1 : apart + 1)
        groups(2, apart, M, x, p, b, s, y, K, N, j, panel, cached, half);
    for (; j < hi; j++) groups(1, 1, M, x, p, b, s, y, K, N, j, panel, cached, half);
}

int max_rows(void) { return MAX_ROWS; }

/* x (M, K) and y (M, N) contiguous; p the packed weights, fp32, fp16 (half) or (with s, their scales) int8; b the
 * bias padded like them (zeros when there is none); the panels split between `threads` OpenMP threads (the torch
 * process's own pool). */
void linear(const float *x, const void *p, const float *b, const float *s, float *y, int M, int K, int N,
            int threads, int half) {
    int panels = (N + PANEL - 1) / PANEL;
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            rows(M, x, p, b, s, y, K, N, panels * t / n, panels * (t + 1) / n, half);
        }
        return;
    }
#else
    (void)threads; /* one thread without OpenMP */
#endif
    rows(M, x, p, b, s, y, K, N, 0, panels, half);
}

/* e^x, x clamped to [-87, 88]: 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2, and e^r by its Taylor polynomial
 * to r^6 (relative error below 2e-7). Each lane the same operations at either width: the same results. */
static inline vec vexp(vec x) {
#ifdef __AVX512F__
    x = (vec)_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), (__m512)x)); /* NaN stays */
#elif defined(__AVX__)
    x = (vec)_mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), (__m256)x));
#else
    veci low = x < vsplat(-87.0f), high = x > vsplat(88.0f);
    x = (vec)(((veci)x & ~(low | high)) | ((veci)vsplat(-87.0f) & low) | ((veci)vsplat(88.0f) & high));
#endif
    veci n = __builtin_convertvector(x * 1.44269504f + 200.5f, veci) - 200; /* the offset makes truncation floor */
    vec f = __builtin_convertvector(n, vec);
    vec r = (x - f * 0.693359375f) + f * 2.12194440e-4f; /* ln 2 in two parts, so that r stays exact */
    vec e = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    return e * (vec)((n + 127) << 23);
}

static inline vec vgelu(vec x) { /* GPT-2's tanh approximation; tanh(u) = 1 - 2 / (1 + e^2u) */
    vec u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (2.0f - 2.0f / (1.0f + vexp(2.0f * u)));
}

/* a[0..n) in place, LANES at a time (the last LANES padded with zeros): f, an expression of them as 'lane'. */
#define EACH(a, n, f)                                                           \
    for (size_t i_ = 0; i_ < (n); i_ += LANES) {                                \
        vec lane = {0};                                                         \
        size_t m_ = (n) - i_ < LANES ? (n) - i_ : LANES;                        \
        if (m_ == LANES) {                                                      \
            lane = *(vec *)((a) + i_), lane = (f), *(vec *)((a) + i_) = lane;   \
            continue;                                                           \
        }                                                                       \
        for (size_t e_ = 0; e_ < m_; e_++) lane[e_] = (a)[i_ + e_];             \
        lane = (f);                                                             \
        for (size_t e_ = 0; e_ < m_; e_++) (a)[i_ + e_] = lane[e_];             \
    }

/* The sum of a vector's lanes, in a fixed order. */
static inline float vsum(vec a) {
#ifdef __AVX512F__
    return _mm512_reduce_add_ps((__m512)a);
#else
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
#endif
}

/* sum_i d_i (squares 0) or sum_i d_i^2 (squares 1), d_i = x[i] - centre, i < n: four chains of LANES lanes, not
 * one chain of single adds each waiting on the last. */
static inline __attribute__((always_inline)) float row_sum(const float *x, int n, float centre, int squares) {
    vec acc[4] = {{0}}, c = vsplat(centre);
    int i = 0;
    for (; i + 4 * LANES <= n; i += 4 * LANES)
        for (int u = 0; u < 4; u++) {
            vec d = *(const vec *)(x + i + LANES * u) - c;
            acc[u] += squares ? d * d : d;
        }
    for (; i < n; i += LANES) {
        vec d = {0};
        for (int e = 0; e < LANES && i + e < n; e++) d[e] = x[i + e] - centre;
        acc[0] += squares ? d * d : d;
    }
    return vsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

static void layernorm(const float *x, const float *w, const float *b, float *y, int M, int C) {
    for (int m = 0; m < M; m++) {
        const float *xm = x + (size_t)m * C;
        float *ym = y + (size_t)m * C, mean = row_sum(xm, C, 0, 0) / C;
        float inv = 1.0f / sqrtf(row_sum(xm, C, mean, 1) / C + 1e-5f);
        for (int i = 0; i < C; i++) ym[i] = (xm[i] - mean) * inv * w[i] + b[i];
    }
}

/* Bytes at..end that an attention pass asks L2 for as it goes, a line per 64 bytes it reads itself: the keys or
 * values of the pass after it, which the linears before have pushed out of every cache. */
struct ahead {
    const char *at, *end;
};

static inline struct ahead span(const float *p, long floats) {
    return (struct ahead){(const char *)p, (const char *)(p + floats)};
}

static inline void fetch(struct ahead *a, size_t bytes) {
    for (const char *stop = a->at + bytes; a->at < stop && a->at < a->end; a->at += 64) __builtin_prefetch(a->at, 0, 2);
}

/* The lanes of 8 accumulators summed, each in the order ((0+1)+(2+3))+((4+5)+(6+7)), as one vector: lane u is
 * acc[u]'s sum. With AVX all eight at once by horizontal adds (lanes 0-3, then 4-7, of four accumulators at a time). */
static inline v8 lanes8(const v8 *acc) {
#ifdef __AVX__
    __m256 h[4], g[2];
    for (int e = 0; e < 4; e++) h[e] = _mm256_hadd_ps((__m256)acc[2 * e], (__m256)acc[2 * e + 1]);
    for (int e = 0; e < 2; e++) g[e] = _mm256_hadd_ps(h[2 * e], h[2 * e + 1]);
    return (v8)_mm256_add_ps(_mm256_permute2f128_ps(g[0], g[1], 0x20), _mm256_permute2f128_ps(g[0], g[1], 0x31));
#else
    v8 d;
    for (int e = 0; e < 8; e++)
        d[e] = ((acc[e][0] + acc[e][1]) + (acc[e][2] + acc[e][3])) + ((acc[e][4] + acc[e][5]) + (acc[e][6] + acc[e][7]));
    return d;
#endif
}

/* The lanes of n accumulators summed as lanes8 sums them: d[u], acc[u]'s sum. */
static inline __attribute__((always_inline)) void lanes(int n, const v8 *acc, float *d) {
    for (int u = 0; u < n; u += 8) {
        v8 a[8], sum;
        for (int e = 0; e < 8; e++) a[e] = u + e < n ? acc[u + e] : splat(0);
        sum = lanes8(a);
        for (int e = 0; e < 8 && u + e < n; e++) d[u + e] = sum[e];
    }
}

/* s[q ss + j] = scale (q_q . k_j) for Q queries q_q = q + q qs and U keys k_j = k + j D (constants once inlined):
 * Q U chains of multiply-adds in flight, each key read once for all Q. Every product is summed in the same order
 * whatever Q and U are: eight lanes over D, the lanes as `lanes` sums them, then the tail past D's multiple of 8. */
static inline __attribute__((always_inline)) void score(int Q, int U, const float *q, size_t qs, const float *k,
                                                        int D, float scale, float *s, size_t ss, struct ahead *next) {
    v8 acc[16] = {{0}}; /* Q U <= 16 */
    float d[16];
    int i = 0;
    fetch(next, (size_t)U * D * sizeof(float));
    for (; i + 8 <= D; i += 8) {
        v8 kj[8];
        for (int u = 0; u < U; u++) kj[u] = *(const v8 *)(k + (size_t)u * D + i);
        for (int r = 0; r < Q; r++) {
            v8 qr = *(const v8 *)(q + r * qs + i);
            for (int u = 0; u < U; u++) acc[r * U + u] = fma8(qr, kj[u], acc[r * U + u]);
        }
    }
    lanes(Q * U, acc, d);
    for (int r = 0; r < Q; r++)
        for (int u = 0; u < U; u++) {
            float dot = d[r * U + u];
            for (int t = i; t < D; t++) dot += q[r * qs + t] * k[(size_t)u * D + t];
            s[r * ss + u] = dot * scale;
        }
}

/* One query's scores against 8 keys (D a multiple of 8): as `score` computes them, stored 8 at once. */
static inline __attribute__((always_inline)) void score8(const float *q, const float *k, int D, float scale,
                                                         float *s) {
    v8 acc[8] = {{0}};
    for (int i = 0; i < D; i += 8) {
        v8 qi = *(const v8 *)(q + i);
        for (int u = 0; u < 8; u++) acc[u] = fma8(qi, *(const v8 *)(k + (size_t)u * D + i), acc[u]);
    }
    *(v8 *)s = lanes8(acc) * splat(scale);
}

/* Q queries' scores (rows ss apart) against n keys from k: where D is a multiple of 8, 8 keys at a time, each query
 * in turn while they sit in L1, its 8 scores summed, scaled and stored as one vector (the same sums as `score`
 * alone, which stores them one by one). */
static inline __attribute__((always_inline)) void scores_of(int Q, const float *q, size_t qs, const float *k, long n,
                                                            int D, float scale, float *s, size_t ss,
                                                            struct ahead *next) {
    long j = 0;
    if (D % 8 == 0)
        for (; j + 8 <= n; j += 8) {
            fetch(next, (size_t)8 * D * sizeof(float));
            for (int r = 0; r < Q; r++) score8(q + r * qs, k + j * D, D, scale, s + r * ss + j);
        }
    const int U = ACCS / Q > 8 ? 8 : ACCS / Q > 1 ? ACCS / Q : 1;
    for (; j + U <= n; j += U) score(Q, U, q, qs, k + j * D, D, scale, s + j, ss, next);
    for (; j < n; j++) score(Q, 1, q, qs, k + j * D, D, scale, s + j, ss, next);
}

/* out_q[0..LANES W) += sum_j p_q[j] v_j[0..LANES W) over j < n, v_j = v + j D, for Q queries (p_q = p + q ps, out_q =
 * out + q os), in the order of j, the sums in registers, each v_j read once for all Q. */
static inline __attribute__((always_inline)) void weigh(int Q, int W, const float *p, size_t ps, const float *v,
                                                        long n, int D, float *out, size_t os, struct ahead *next) {
    vec acc[WEIGHS]; /* Q W <= WEIGHS */
    for (int r = 0; r < Q; r++)
        for (int u = 0; u < W; u++) acc[r * W + u] = *(const vec *)(out + r * os + LANES * u);
    for (long j = 0; j < n; j++) {
        vec vj[64 / LANES];
        fetch(next, LANES * W * sizeof(float));
        for (int u = 0; u < W; u++) vj[u] = *(const vec *)(v + j * D + LANES * u);
        for (int r = 0; r < Q; r++) {
            vec pr = vsplat(p[r * ps + j]);
            for (int u = 0; u < W; u++) acc[r * W + u] = vfma(pr, vj[u], acc[r * W + u]);
        }
    }
    for (int r = 0; r < Q; r++)
        for (int u = 0; u < W; u++) *(vec *)(out + r * os + LANES * u) = acc[r * W + u];
}

/* out_q += sum_j p_q[j] v_j over j < n, for Q queries: D's columns a block of registers at a time (one block for up
 * to 6 queries of 64 columns with AVX-512), then one by one. Each output is summed over j in order with the same
 * multiply-adds whatever the block, so a query's result does not depend on Q. */
static inline __attribute__((always_inline)) void accumulate_of(int Q, const float *p, size_t ps, const float *v,
                                                                long n, int D, float *out, size_t os,
                                                                struct ahead *next) {
    const int W = WEIGHS / Q < 64 / LANES ? WEIGHS / Q : 64 / LANES;
    int c = 0;
    for (; c + LANES * W <= D; c += LANES * W) weigh(Q, W, p, ps, v + c, n, D, out + c, os, next);
    for (; c + LANES <= D; c += LANES) weigh(Q, 1, p, ps, v + c, n, D, out + c, os, next);
    for (; c < D; c++)
        for (int r = 0; r < Q; r++)
            for (long j = 0; j < n; j++) out[r * os + c] = fma1(p[r * ps + j], v[j * D + c], out[r * os + c]);
}

#define EACH_Q(f)                    \
    switch (Q) {                     \
    case 1: f(1, ARGS); break;       \
    case 2: f(2, ARGS); break;       \
    case 3: f(3, ARGS); break;       \
    case 4: f(4, ARGS); break;       \
    case 5: f(5, ARGS); break;       \
    case 6: f(6, ARGS); break;       \
    case 7: f(7, ARGS); break;       \
    default: f(8, ARGS); break;      \
    }

static void scores(int Q, const float *q, size_t qs, const float *k, long n, int D, float scale, float *s, size_t ss,
                   struct ahead *next) {
#define ARGS q, qs, k, n, D, scale, s, ss, next
    EACH_Q(scores_of)
#undef ARGS
}

static void accumulate(int Q, const float *p, size_t ps, const float *v, long n, int D, float *out, size_t os,
                       struct ahead *next) {
#define ARGS p, ps, v, n, D, out, os, next
    EACH_Q(accumulate_of)
#undef ARGS
}

/* The attention of Q <= QUERIES queries of one row for one head, softmax(q k / sqrt(D)) v: query r (q + r qs, out +
 * r os) over its row's slots 0..ctx[r]-1 and, in a token tree, the slots tree + j of the nodes j it sees (vis + r
 * nodes, vis[j]: its ancestors and itself; vis NULL: no tree). The keys and values all Q see are read once for all;
 * each query's result is what it would be alone. s: Q rows of scores, ss apart. */
static void attend(int Q, const float *q, size_t qs, const float *k, const float *v, const long *ctx, long tree,
                   const unsigned char *vis, int nodes, int D, float *s, size_t ss, float *out, size_t os,
                   struct ahead nk, struct ahead nv) {
    long shared = ctx[0];
    float scale = 1.0f / sqrtf((float)D);
    for (int r = 1; r < Q; r++) shared = ctx[r] < shared ? ctx[r] : shared;
    scores(Q, q, qs, k, shared, D, scale, s, ss, &nk);
    for (int r = 0; r < Q; r++) {
        float *sr = s + r * ss;
        long n = ctx[r], i = 0;
        scores(1, q + r * qs, 0, k + shared * D, ctx[r] - shared, D, scale, sr + shared, 0, &nk);
        for (int j = 0; vis && j < nodes; j++)
            if (vis[r * nodes + j]) scores(1, q + r * qs, 0, k + (tree + j) * D, 1, D, scale, sr + n++, 0, &nk);
        v8 tops = splat(-INFINITY);
        vec sums = {0};
        for (; i + 8 <= n; i += 8) {
            v8 x = *(const v8 *)(sr + i);
            v8i above = x > tops;
            tops = (v8)(((v8i)x & above) | ((v8i)tops & ~above));
        }
        float top = -INFINITY;
        for (int e = 0; e < 8; e++) top = tops[e] > top ? tops[e] : top;
        for (; i < n; i++) top = sr[i] > top ? sr[i] : top;
        EACH(sr, (size_t)n, vexp(lane - top))
        EACH(sr, (size_t)n, (sums += lane, lane)) /* the tail's padding adds zeros */
        float inv = 1 / vsum(sums);
        EACH(sr, (size_t)n, lane * inv)
        for (int e = 0; e < D; e++) out[r * os + e] = 0;
    }
    accumulate(Q, s, ss, v, shared, D, out, os, &nv);
    for (int r = 0; r < Q; r++) {
        long n = ctx[r];
        float *sr = s + r * ss, *o = out + r * os;
        accumulate(1, sr + shared, 0, v + shared * D, ctx[r] - shared, D, o, 0, &nv);
        for (int j = 0; vis && j < nodes; j++)
            if (vis[r * nodes + j]) accumulate(1, sr + n++, 0, v + (tree + j) * D, 1, D, o, 0, &nv);
    }
}

/* A block's weights; a linear's panels (_p), padded bias (_b) and, for int8 panels, scales (_s; NULL: float). */
struct layer {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    const void *attn_p, *proj_p, *fc_p, *out_p;
    const float *attn_b, *proj_b, *fc_b, *out_b, *attn_s, *proj_s, *fc_s, *out_s;
};
/* A GPT; or an EAGLE head: no position embeddings (wpe NULL), an input layer over each token's embedding and the
 * features beside it (in_p), no logits (head_p NULL). Linear weights are packed as `linear` reads them. */
struct model {
    int n_layer, n_head, n_embd, vocab;
    const float *wte, *wpe, *in_b, *lnf_w, *lnf_b, *head_b, *head_s;
    const void *in_p, *head_p;
    const struct layer *layers;
    const char *weights; /* its packed weights end to end (NULL where they are not), and their bytes */
    long weights_bytes;
    int half; /* its float panels are fp16 (its int8 ones are int8 either way) */
};

/* One call's arguments, for `forward` and `chain` alike. suts/native.py declares this struct (and `model` and `layer`
 * above) to ctypes by reading these definitions, so a field is added here and nowhere else. */
struct call {
    const struct model *m;
    const long *tokens;           /* M token ids, one row's after another (M = sum of lens) */
    const float *feats;           /* an EAGLE head's features beside them (M, n_embd); NULL for a GPT */
    long *starts;                 /* each row's cache length: its tokens go to slots starts[b].., moved on after */
    int B;                        /* rows */
    const int *lens;              /* each row's new tokens */
    const long *depths;           /* a token tree's: each node's depth (NULL: no tree) */
    const unsigned char *visible; /* a token tree's: which nodes each of the last T nodes sees */
    int nodes;                    /* a token tree's nodes */
    float *k, *v;                 /* the cache: (layers, rows, heads, max_len, head dim) */
    long layer_stride, row_stride;
    int max_len;
    float *work;                  /* scratch: 10 M n_embd floats */
    float *hidden, *logits;       /* outputs: final hidden states and their logits */
    int last_only;                /* outputs for each row's last token alone (B of them), else for all M */
    long limit;                   /* the context: no row may grow past it */
    int threads;                  /* OpenMP threads */
    int n;                        /* chain: greedy steps */
    long *drafts;                 /* chain: their argmaxes */
};

/* B rows with lens[b] new tokens each, packed one row after another in tokens: row b's go to cache slots
 * starts[b].. and attend to every slot before theirs. Or, with `visible`, every row's lens[b] = T tokens are the
 * last T nodes of a token tree of `nodes` nodes (a parent before its children) whose root sits at slot
 * starts[b] - (nodes - T): node i's position is the root's plus depths[i], and it attends to the slots before the
 * root and to the nodes j it sees, visible[(i - (nodes - T)) * nodes + j]. Writes the final hidden states (M, n_embd;
 * only each row's last token's, B of them, when last_only) into hidden, and their logits into logits, and moves
 * each row's length (starts) on by its tokens. Returns 0; or, having written nothing, 1 when a token id lies outside
 * the vocabulary, 2 when the longest row's start plus the longest row's tokens exceed `limit`. */
int forward(const struct call *c) {
    const struct model *m = c->m;
    const long *tokens = c->tokens, *depths = c->depths;
    const float *feats = c->feats;
    long *starts = c->starts, layer_stride = c->layer_stride, row_stride = c->row_stride;
    const int *lens = c->lens;
    const unsigned char *visible = c->visible;
    int B = c->B, nodes = c->nodes, max_len = c->max_len, last_only = c->last_only, threads = c->threads;
    float *k = c->k, *v = c->v, *work = c->work, *hidden = c->hidden, *logits = c->logits;
    int C = m->n_embd, H = m->n_head, D = C / H, M = 0;
    long longest = 0, latest = 0;
    for (int b = 0; b < B; b++) {
        M += lens[b];
        longest = lens[b] > longest ? lens[b] : longest;
        latest = starts[b] > latest ? starts[b] : latest;
    }
    for (int r = 0; r < M; r++)
        if (tokens[r] < 0 || tokens[r] >= m->vocab) return 1;
    if (latest + longest > c->limit) return 2;
    int row[M], last[B], first[M], blocks = 0; /* first[i]: block i's first token; a block is QUERIES of a row */
    long pos[M], slot[M], ctx[M], root[M];
    for (int b = 0, r = 0; b < B; b++)
        for (int t = 0; t < lens[b]; t++, r++) {
            int node = nodes - lens[b] + t;
            row[r] = b, slot[r] = starts[b] + t, last[b] = r;
            if (t % QUERIES == 0) first[blocks++] = r;
            root[r] = starts[b] - (visible ? nodes - lens[b] : 0);
            pos[r] = visible ? root[r] + depths[node] : slot[r];
            ctx[r] = visible ? root[r] : slot[r] + 1;
        }
    float *x = work, *h = x + (size_t)M * C, *qkv = h + (size_t)M * C, *y = qkv + (size_t)M * 3 * C;
    float *f = y + (size_t)M * C;
    for (int r = 0; r < M; r++) {
        const float *e = m->wte + (size_t)tokens[r] * C;
        float *xr = m->in_p ? f + (size_t)r * 2 * C : x + (size_t)r * C;
        for (int i = 0; i < C; i++) xr[i] = m->wpe ? e[i] + m->wpe[(size_t)pos[r] * C + i] : e[i];
        for (int i = 0; m->in_p && i < C; i++) xr[C + i] = feats[(size_t)r * C + i];
    }
    if (m->in_p) linear(f, m->in_p, m->in_b, NULL, x, M, 2 * C, C, threads, m->half);
    for (int l = 0; l < m->n_layer; l++) {
        const struct layer *L = &m->layers[l];
        float *kl = k + l * layer_stride, *vl = v + l * layer_stride;
        struct ahead k0 = span(kl, ctx[0] * D), v0 = span(vl, ctx[0] * D); /* the first pass's, while QKV runs */
        fetch(&k0, ctx[0] * D * sizeof(float));
        fetch(&v0, ctx[0] * D * sizeof(float));
        layernorm(x, L->ln1_w, L->ln1_b, h, M, C);
        linear(h, L->attn_p, L->attn_b, L->attn_s, qkv, M, C, 3 * C, threads, m->half);
        for (int r = 0; r < M; r++)
            for (int hd = 0; hd < H; hd++) {
                size_t at = row[r] * row_stride + ((size_t)hd * max_len + slot[r]) * D;
                for (int i = 0; i < D; i++) {
                    kl[at + i] = qkv[(size_t)r * 3 * C + C + hd * D + i];
                    vl[at + i] = qkv[(size_t)r * 3 * C + 2 * C + hd * D + i];
                }
            }
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
        for (int job = 0; job < blocks * H; job++) { /* head by head: a row's keys stay in cache for its next block */
            int hd = job / blocks, r = first[job % blocks], b = row[r];
            int Q = last[b] - r < QUERIES ? last[b] - r + 1 : QUERIES;
            float s[(size_t)QUERIES * max_len];
            size_t head = b * row_stride + (size_t)hd * max_len * D;
            const unsigned char *vis = visible ? visible + (size_t)(r % lens[b]) * nodes : NULL;
            int after = job + 1 < blocks * H ? job + 1 : job, ra = first[after % blocks]; /* the next pass's */
            size_t next = row[ra] * row_stride + (size_t)(after / blocks) * max_len * D;
            long n = after == job ? 0 : ctx[ra] * D;
            attend(Q, qkv + (size_t)r * 3 * C + hd * D, 3 * C, kl + head, vl + head, ctx + r, root[r], vis, nodes, D,
                   s, max_len, y + (size_t)r * C + hd * D, C, span(kl + next, n), span(vl + next, n));
        }
        linear(y, L->proj_p, L->proj_b, L->proj_s, h, M, C, C, threads, m->half);
        for (size_t i = 0; i < (size_t)M * C; i++) x[i] += h[i];
        layernorm(x, L->ln2_w, L->ln2_b, h, M, C);
        linear(h, L->fc_p, L->fc_b, L->fc_s, f, M, C, 4 * C, threads, m->half);
        EACH(f, (size_t)M * 4 * C, vgelu(lane))
        linear(f, L->out_p, L->out_b, L->out_s, h, M, 4 * C, C, threads, m->half);
        for (size_t i = 0; i < (size_t)M * C; i++) x[i] += h[i];
    }
    int rows = last_only ? B : M;
    for (int r = 0; r < rows; r++)
        layernorm(x + (size_t)(last_only ? last[r] : r) * C, m->lnf_w, m->lnf_b, hidden + (size_t)r * C, 1, C);
    if (m->head_p) linear(hidden, m->head_p, m->head_b, m->head_s, logits, rows, C, m->vocab, threads, m->half);
    for (int b = 0; b < B; b++) starts[b] += lens[b];
    return 0;
}

/* Greedy drafting in one call: `forward` with the call's arguments (last tokens only), then n - 1 more steps,
 * each on every row's argmax of the last: its first largest logit, as torch's argmax takes it (NaN above all); an
 * EAGLE head's steps read its own last hidden states as their features (its logits: its target's LM head, head_p).
 * drafts (B, n): each row's n argmaxes. Or, with every token's outputs (last_only 0, a tree's nodes or a greedy
 * verify pass's tokens) and n = 1, drafts (M, 1): each token's argmax. Returns what forward returns; 2, having
 * written nothing, when the n steps would run past `limit`. */
int chain(const struct call *c) {
    const struct model *m = c->m;
    int B = c->B, n = c->n, ones[B], rows = 0;
    long next[B];
    for (int b = 0; b < B; b++) ones[b] = 1, rows += c->last_only ? 1 : c->lens[b];
    if (m->weights && m->weights_bytes <= CHAIN_FETCH) { /* a draft's weights, which the target's pass before has
                                                           * pushed out of every cache: all asked for at once */
        struct ahead all = {m->weights, m->weights + m->weights_bytes};
        fetch(&all, m->weights_bytes);
    }
    struct call first = *c, step = *c;
    first.limit = c->limit - (n - 1); /* the first forward's own check, with room left for the n - 1 steps after it */
    step.tokens = next, step.feats = m->in_p ? c->hidden : NULL, step.lens = ones, step.depths = NULL;
    step.visible = NULL, step.nodes = 0;
    step.last_only = 1;
    int code = forward(&first);
    for (int i = 0; code == 0 && i < n; i++) {
        for (int r = 0; r < rows; r++) {
            const float *l = c->logits + (size_t)r * m->vocab;
            int best = 0;
            for (int t = 1; t < m->vocab && !isnan(l[best]); t++)
                if (l[t] > l[best] || isnan(l[t])) best = t;
            c->drafts[(size_t)r * n + i] = best;
            if (r < B) next[r] = best;
        }
        if (i + 1 < n) code = forward(&step);
    }
    return code;
}
