/* The CPU fast path's kernels (built and loaded by suts/native.py, called by suts/fastpath.py).
 *
 * `linear`: linear layers of a few rows (a decode step, a verify pass, a small batch) at the speed of their weights.
 * y[m, n] = b[n] + sum_k x[m, k] w[n, k], for rows m < M <= MAX_ROWS. The weights are packed once as panels of 16
 * outputs, p[n / 16][k][16] (N padded with zeros to a multiple of 16), so that they stream from memory in one
 * sequential pass whatever M is, and each row's 16 sums stay in registers. Every output is summed over k in the
 * same order with the same operations for every M: a row's result does not depend on how many rows came with it.
 *
 * `step`: a whole GPT forward of a short chunk per row against the KV cache (mlperf/model.py's, same math), in one
 * call: no Python, dispatch or small tensors between its ops. Every query's attention and every row's norms are
 * computed on their own, so a row's results depend neither on its batch nor on its chunk's length.
 */
#include <math.h>
#include <stddef.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_ROWS 12
#define PANEL 16

typedef float v8 __attribute__((vector_size(32), aligned(4)));

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline v8 fma8(v8 a, v8 b, v8 c) { return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
static inline v8 fma8(v8 a, v8 b, v8 c) { return a * b + c; } /* built with -ffp-contract=off: never fused */
#endif

/* Panels lo..hi-1 for M rows, H (1 or 2) of a panel's two 8-output halves at a time: two halves for up to 6 rows
 * (12 sums in registers), one at a time beyond (up to 12 sums). Inlined with M and H constant. */
static inline __attribute__((always_inline)) void block(int M, int H, const float *x, const float *p, const float *b,
                                                        float *y, int K, int N, int lo, int hi) {
    for (int j = lo; j < hi; j++) {
        const v8 *w = (const v8 *)(p + (size_t)j * K * PANEL);
        for (int h = 0; h < 2; h += H) {
            v8 acc[MAX_ROWS][2];
            for (int m = 0; m < M; m++)
                for (int i = 0; i < H; i++) acc[m][i] = *(const v8 *)(b + j * PANEL + 8 * (h + i));
            for (int k = 0; k < K; k++) {
                v8 w0 = w[2 * k + h], w1 = w[2 * k + 1];
                for (int m = 0; m < M; m++) {
                    float s = x[(size_t)m * K + k];
                    v8 sv = {s, s, s, s, s, s, s, s};
                    acc[m][0] = fma8(sv, w0, acc[m][0]);
                    if (H == 2) acc[m][1] = fma8(sv, w1, acc[m][1]);
                }
            }
            for (int m = 0; m < M; m++)
                for (int i = 0; i < H; i++)
                    for (int e = 0; e < 8; e++) {
                        int n = j * PANEL + 8 * (h + i) + e;
                        if (n < N) y[(size_t)m * N + n] = acc[m][i][e];
                    }
        }
    }
}

static void rows(int M, const float *x, const float *p, const float *b, float *y, int K, int N, int lo, int hi) {
    switch (M) {
    case 1: block(1, 2, x, p, b, y, K, N, lo, hi); break;
    case 2: block(2, 2, x, p, b, y, K, N, lo, hi); break;
    case 3: block(3, 2, x, p, b, y, K, N, lo, hi); break;
    case 4: block(4, 2, x, p, b, y, K, N, lo, hi); break;
    case 5: block(5, 2, x, p, b, y, K, N, lo, hi); break;
    case 6: block(6, 2, x, p, b, y, K, N, lo, hi); break;
    case 7: block(7, 1, x, p, b, y, K, N, lo, hi); break;
    case 8: block(8, 1, x, p, b, y, K, N, lo, hi); break;
    case 9: block(9, 1, x, p, b, y, K, N, lo, hi); break;
    case 10: block(10, 1, x, p, b, y, K, N, lo, hi); break;
    case 11: block(11, 1, x, p, b, y, K, N, lo, hi); break;
    case 12: block(12, 1, x, p, b, y, K, N, lo, hi); break;
    }
}

int max_rows(void) { return MAX_ROWS; }

/* x (M, K) and y (M, N) contiguous; p the packed weights, b the bias padded like them (zeros when there is none);
 * the panels split between `threads` OpenMP threads (the torch process's own pool). Returns 0, or -1 for a bad M. */
int linear(const float *x, const float *p, const float *b, float *y, int M, int K, int N, int threads) {
    int panels = (N + PANEL - 1) / PANEL;
    if (M < 1 || M > MAX_ROWS) return -1;
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            rows(M, x, p, b, y, K, N, panels * t / n, panels * (t + 1) / n);
        }
        return 0;
    }
#endif
    rows(M, x, p, b, y, K, N, 0, panels);
    return 0;
}

/* Any number of rows, MAX_ROWS at a time. */
static void matmul(const float *x, const float *p, const float *b, float *y, int M, int K, int N, int threads) {
    for (int m = 0; m < M; m += MAX_ROWS)
        linear(x + (size_t)m * K, p, b, y + (size_t)m * N, M - m < MAX_ROWS ? M - m : MAX_ROWS, K, N, threads);
}

static void layernorm(const float *x, const float *w, const float *b, float *y, int M, int C) {
    for (int m = 0; m < M; m++) {
        const float *xm = x + (size_t)m * C;
        float *ym = y + (size_t)m * C, mean = 0, var = 0;
        for (int i = 0; i < C; i++) mean += xm[i];
        mean /= C;
        for (int i = 0; i < C; i++) var += (xm[i] - mean) * (xm[i] - mean);
        float inv = 1.0f / sqrtf(var / C + 1e-5f);
        for (int i = 0; i < C; i++) ym[i] = (xm[i] - mean) * inv * w[i] + b[i];
    }
}

static float gelu(float x) { /* GPT-2's tanh approximation */
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static inline float dot(const float *a, const float *b, int D) {
    v8 acc = {0};
    int i = 0;
    for (; i + 8 <= D; i += 8) acc = fma8(*(const v8 *)(a + i), *(const v8 *)(b + i), acc);
    float d = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < D; i++) d += a[i] * b[i];
    return d;
}

/* A query's attention for one head over its row's keys 0..n-1 (those before it and its own): softmax(q k / sqrt(D)) v. */
static void attend(const float *q, const float *k, const float *v, long n, int D, float *s, float *out) {
    float top = -INFINITY, sum = 0, scale = 1.0f / sqrtf((float)D);
    for (long j = 0; j < n; j++) {
        s[j] = dot(q, k + j * D, D) * scale;
        top = s[j] > top ? s[j] : top;
    }
    for (long j = 0; j < n; j++) sum += (s[j] = expf(s[j] - top));
    for (int i = 0; i < D; i++) out[i] = 0;
    for (long j = 0; j < n; j++) {
        float w = s[j] / sum;
        for (int i = 0; i < D; i++) out[i] += w * v[j * D + i];
    }
}

struct layer { const float *ln1_w, *ln1_b, *attn_p, *attn_b, *proj_p, *proj_b, *ln2_w, *ln2_b, *fc_p, *fc_b, *out_p, *out_b; };
struct model {
    int n_layer, n_head, n_embd, vocab;
    const float *wte, *wpe, *lnf_w, *lnf_b, *head_p, *head_b; /* linear weights packed as `linear` reads them */
    const struct layer *layers;
};

/* B rows with lens[b] new tokens each, packed one row after another in tokens (M = sum of lens): row b's go to
 * cache slots starts[b].. and attend to every slot before theirs. k, v: the cache, (layers, rows, heads, max_len,
 * head dim) with the given layer and row strides. work: 10 M n_embd + threads max_len floats. Writes the final
 * hidden states (M, n_embd; only each row's last token's, B of them, when last_only) into hidden, and their
 * logits into logits. */
void step(const struct model *m, const long *tokens, const long *starts, int B, const int *lens, float *k, float *v,
          long layer_stride, long row_stride, int max_len, float *work, float *hidden, float *logits,
          int last_only, int threads) {
    int C = m->n_embd, H = m->n_head, D = C / H, M = 0;
    for (int b = 0; b < B; b++) M += lens[b];
    int row[M], last[B];
    long pos[M];
    for (int b = 0, r = 0; b < B; b++)
        for (int t = 0; t < lens[b]; t++, r++) row[r] = b, pos[r] = starts[b] + t, last[b] = r;
    float *x = work, *h = x + (size_t)M * C, *qkv = h + (size_t)M * C, *y = qkv + (size_t)M * 3 * C;
    float *f = y + (size_t)M * C, *scores = f + (size_t)M * 4 * C;
    for (int r = 0; r < M; r++) {
        const float *e = m->wte + (size_t)tokens[r] * C, *p = m->wpe + (size_t)pos[r] * C;
        for (int i = 0; i < C; i++) x[(size_t)r * C + i] = e[i] + p[i];
    }
    for (int l = 0; l < m->n_layer; l++) {
        const struct layer *L = &m->layers[l];
        float *kl = k + l * layer_stride, *vl = v + l * layer_stride;
        layernorm(x, L->ln1_w, L->ln1_b, h, M, C);
        matmul(h, L->attn_p, L->attn_b, qkv, M, C, 3 * C, threads);
        for (int r = 0; r < M; r++)
            for (int hd = 0; hd < H; hd++) {
                size_t slot = row[r] * row_stride + ((size_t)hd * max_len + pos[r]) * D;
                for (int i = 0; i < D; i++) {
                    kl[slot + i] = qkv[(size_t)r * 3 * C + C + hd * D + i];
                    vl[slot + i] = qkv[(size_t)r * 3 * C + 2 * C + hd * D + i];
                }
            }
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
        for (int job = 0; job < M * H; job++) { /* head by head: a row's keys stay in cache for its next query */
            int hd = job / M, r = job % M;
#ifdef _OPENMP
            float *s = scores + (size_t)omp_get_thread_num() * max_len;
#else
            float *s = scores;
#endif
            size_t head = row[r] * row_stride + (size_t)hd * max_len * D;
            attend(qkv + (size_t)r * 3 * C + hd * D, kl + head, vl + head, pos[r] + 1, D, s, y + (size_t)r * C + hd * D);
        }
        matmul(y, L->proj_p, L->proj_b, h, M, C, C, threads);
        for (size_t i = 0; i < (size_t)M * C; i++) x[i] += h[i];
        layernorm(x, L->ln2_w, L->ln2_b, h, M, C);
        matmul(h, L->fc_p, L->fc_b, f, M, C, 4 * C, threads);
        for (size_t i = 0; i < (size_t)M * 4 * C; i++) f[i] = gelu(f[i]);
        matmul(f, L->out_p, L->out_b, h, M, 4 * C, C, threads);
        for (size_t i = 0; i < (size_t)M * C; i++) x[i] += h[i];
    }
    int rows = last_only ? B : M;
    for (int r = 0; r < rows; r++)
        layernorm(x + (size_t)(last_only ? last[r] : r) * C, m->lnf_w, m->lnf_b, hidden + (size_t)r * C, 1, C);
    matmul(hidden, m->head_p, m->head_b, logits, rows, C, m->vocab, threads);
}
