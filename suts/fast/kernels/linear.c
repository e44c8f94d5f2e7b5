/* `linear`: linear layers of up to MAX_ROWS rows (decode steps, verify passes, batches) at the speed of their
 * weights. y[m, n] = b[n] + sum_k x[m, k] w[n, k]. The weights are packed once as panels of 16 outputs,
 * p[n / 16][k][16] (N padded with zeros to a multiple of 16): a panel streams from memory once, in order, while
 * groups of up to 8 rows (AVX-512: one vector each) or 6 (AVX2: two) keep their 16 sums each in registers. Every
 * output is summed over k in the same order with the same operations whatever M is and however many panels a pass
 * takes: a row's result does not depend on how many rows came with it. */
#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* The 16 outputs each of P panels, `apart` panels apart, for G rows (G <= GROUP, P <= PANELS; constants once
 * inlined). Float weights: w is the first panel (K, 16), fp32 or (half) fp16, the sums start at the bias. Int8
 * weights (s, the panels' scales, not NULL): w is the first panel of int8 (K, 16), each weight widened to float as
 * it is read, and the scale applied to the sums before the bias. */
static inline __attribute__((always_inline)) void group(int G, int P, const float *x, const void *w, const float *b,
                                                        const float *s, float *y, int K, int N, int n0, int apart,
                                                        int half, int resident) {
    vec acc[8][PANELS > 4 ? PANELS : 4][VECS]; /* G <= 8 (GROUP, or AVX2's group of 7); P <= PANELS, STREAMS or 4 */
    size_t width = s ? 1 : half ? 2 : sizeof(float), panel = (size_t)K * PANEL * width * apart; /* bytes of a weight,
                                                                                                * from a panel to
                                                                                                * the next taken */
    for (int m = 0; m < G; m++)
        for (int p = 0; p < P; p++)
            for (int i = 0; i < VECS; i++) acc[m][p][i] = s ? vsplat(0) : ((const vec *)(b + PANEL * apart * p))[i];
    for (int k = 0; k < K; k++) {
        if (resident || (G > 1 && (P == 1 || G >= FEW(half)))) /* read (0), into L2 (2), each panel taken: a pass
            * of FEW or more rows gains by it, one of 2 or 3 rows over STREAMS panels loses; one row over resident
            * weights gains, its multiply-adds too few to hide the L3's latency (from DRAM it loses) */
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
    case 1: group(1, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                        \
    case 2: group(2, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                        \
    case 3: group(3, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                        \
    case 4: group(4, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                        \
    case 5: group(5, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                        \
    case 6: group(6, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                        \
    case 7: group(7, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                        \
    default: group(8, P, xm, w, bj, q, ym, K, N, j * PANEL, apart, h, 0); break;                                       \
    }

/* G <= FEW rows' pass over panel j and the P - 1 panels `apart` after it. */
static inline __attribute__((always_inline)) void few_rows(int G, int P, int apart, const float *x, const char *p,
                                                           const float *b, const float *s, float *y, int K, int N,
                                                           int j, size_t panel, int half, int resident) {
    if (s) /* apart, as GROUPS: each kind of weight a pass inlined with its s and half constants */
        group(G, P, x, p + j * panel, b + j * PANEL, s + j * PANEL, y, K, N, j * PANEL, apart, 0, resident);
    else if (half)
        group(G, P, x, p + j * panel, b + j * PANEL, NULL, y, K, N, j * PANEL, apart, 1, resident);
    else
        group(G, P, x, p + j * panel, b + j * PANEL, NULL, y, K, N, j * PANEL, apart, 0, resident);
}

/* One row's pass over panel j and the P - 1 panels `apart` after it, asking for them ahead where they are resident. */
static inline __attribute__((always_inline)) void one_row(int P, int apart, const float *x, const char *p,
                                                          const float *b, const float *s, float *y, int K, int N,
                                                          int j, size_t panel, int half, int resident) {
    if (resident) /* a constant, as few_rows makes s and half */
        few_rows(1, P, apart, x, p, b, s, y, K, N, j, panel, half, 1);
    else
        few_rows(1, P, apart, x, p, b, s, y, K, N, j, panel, half, 0);
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
 * reads the panels again from cache; AVX-512, whose 32 registers hold the sums), four from its four quarters for up
 * to QUADS rows of fp16 weights, else one (fp32 weights streamed by one group, and int8 weights, lose by two:
 * measured, docs/measurements.md). */
static void rows(int M, const float *x, const void *p, const float *b, const float *s, float *y, int K, int N,
                 int lo, int hi, int half, int resident) {
    size_t panel = (size_t)K * PANEL * (s ? 1 : half ? 2 : sizeof(float));
    int cached = panel * (hi - lo) <= CACHED, streams = M == 1 ? ROW_STREAMS(s, half) : STREAMS(half);
    int taken = !cached ? streams : M == 1 ? PANELS : PANELS / 2;
    int passes = M <= (cached ? 3 : FEW(half)) ? (hi - lo) / taken : 0;
    for (int q = 0; q < passes; q++)
        if (cached)
            switch (M) {
            case 1: one_row(PANELS, 1, x, p, b, s, y, K, N, lo + q * PANELS, panel, half, resident); break;
            case 2: few_rows(2, PANELS / 2, 1, x, p, b, s, y, K, N, lo + q * (PANELS / 2), panel, half, 0); break;
            default: few_rows(3, PANELS / 2, 1, x, p, b, s, y, K, N, lo + q * (PANELS / 2), panel, half, 0); break;
            }
        else
            switch (M) { /* up to FEW: a constant row count, each inlined as its own loop */
            case 1:
                if (s) one_row(ROW_STREAMS(1, 0), passes, x, p, b, s, y, K, N, lo + q, panel, half, resident);
                else if (half) one_row(ROW_STREAMS(0, 1), passes, x, p, b, s, y, K, N, lo + q, panel, half, resident);
                else one_row(ROW_STREAMS(0, 0), passes, x, p, b, s, y, K, N, lo + q, panel, half, resident);
                break;
            case 2:
                if (half) few_rows(2, STREAMS(1), passes, x, p, b, s, y, K, N, lo + q, panel, half, 0);
                else few_rows(2, STREAMS(0), passes, x, p, b, s, y, K, N, lo + q, panel, half, 0);
                break;
            case 3:
                if (half) few_rows(3, STREAMS(1), passes, x, p, b, s, y, K, N, lo + q, panel, half, 0);
                else few_rows(3, STREAMS(0), passes, x, p, b, s, y, K, N, lo + q, panel, half, 0);
                break;
            default: few_rows(4, STREAMS(0), passes, x, p, b, s, y, K, N, lo + q, panel, half, 0); break;
            }
    int j = lo + taken * passes, paired = VECS == 1 && M > FEW(half) && !s && (half || M > GROUP);
    int quads = paired && M <= QUADS ? (hi - j) / 4 : 0, fourth = cached ? 1 : quads; /* a panel to the next's */
    for (int q = 0; q < quads; q++, j += q % fourth ? 1 : 3 * fourth + 1)
        groups(4, fourth, M, x, p, b, s, y, K, N, j, panel, cached, half);
    int pairs = paired ? (hi - j) / 2 : 0, apart = cached ? 1 : pairs; /* apart: the second panel's distance */
    for (int q = 0; q < pairs; q++, j += q % apart ? 1 : apart + 1)
        groups(2, apart, M, x, p, b, s, y, K, N, j, panel, cached, half);
    for (; j < hi; j++) groups(1, 1, M, x, p, b, s, y, K, N, j, panel, cached, half);
}

int max_rows(void) { return MAX_ROWS; }

/* x (M, K) and y (M, N) contiguous; p the packed weights, fp32, fp16 (half) or (with s, their scales) int8; b the
 * bias padded like them (zeros when there is none); the panels split between `threads` OpenMP threads (the torch
 * process's own pool). `resident`: the weights stay in the last-level cache from one call to the next but not in
 * L2 (a model that fits there, as a draft does), so that one row's passes ask for them ahead. */
void linear(const float *x, const void *p, const float *b, const float *s, float *y, int M, int K, int N,
            int threads, int half, int resident) {
    int panels = (N + PANEL - 1) / PANEL;
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            rows(M, x, p, b, s, y, K, N, panels * t / n, panels * (t + 1) / n, half, resident);
        }
        return;
    }
#else
    (void)threads; /* one thread without OpenMP */
#endif
    rows(M, x, p, b, s, y, K, N, 0, panels, half, resident);
}
