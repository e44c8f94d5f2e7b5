/* The vectors the kernels sum in, and the exact helpers every kernel shares: fused multiply-adds, fp16 and int8
 * widened to floats, e^x and GELU, sums of a row in a fixed order. Each lane takes the same operations at either
 * width (AVX-512's 16 floats, or two vectors of 8), and a sum across lanes goes 8 lanes at a time on every build,
 * so every build sums alike. */
#ifndef SIMD_H
#define SIMD_H
#include <math.h>
#include <stddef.h>
#include <string.h>

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

/* The sum of 8 lanes, in a fixed order. */
static inline float sum8(v8 a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

/* sum_i d_i (squares 0) or sum_i d_i^2 (squares 1), d_i = x[i] - centre, i < n, in one order on every build: eight
 * chains of 8 lanes (chain u takes floats 8u..8u+7 of every 64; the tail's, 8 at a time and padded with zeros,
 * chain 0), not one chain of single adds each waiting on the last; the chains summed pairwise, then the lanes. */
static inline __attribute__((always_inline)) float row_sum(const float *x, int n, float centre, int squares) {
    v8 acc[8] = {{0}}, c = splat(centre);
    int i = 0;
    for (; i + 64 <= n; i += 64)
        for (int u = 0; u < 8; u++) {
            v8 d = *(const v8 *)(x + i + 8 * u) - c;
            acc[u] += squares ? d * d : d;
        }
    for (; i < n; i += 8) {
        v8 d = {0};
        for (int e = 0; e < 8 && i + e < n; e++) d[e] = x[i + e] - centre;
        acc[0] += squares ? d * d : d;
    }
    return sum8(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}
#endif
