/* `attend`: the attention of a row's queries of one head over its cache slots, each key and value read once for
 * all the queries, every query's result what it would be alone. */
#include "kernels.h"

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
        d[e] = ((acc[e][0] + acc[e][1]) + (acc[e][2] + acc[e][3])) +
               ((acc[e][4] + acc[e][5]) + (acc[e][6] + acc[e][7]));
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
void attend(int Q, const float *q, size_t qs, const float *k, const float *v, const long *ctx, long tree,
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
        for (; i + 8 <= n; i += 8) {
            v8 x = *(const v8 *)(sr + i);
            v8i above = x > tops;
            tops = (v8)(((v8i)x & above) | ((v8i)tops & ~above));
        }
        float top = -INFINITY;
        for (int e = 0; e < 8; e++) top = tops[e] > top ? tops[e] : top;
        for (; i < n; i++) top = sr[i] > top ? sr[i] : top;
        EACH(sr, (size_t)n, vexp(lane - top))
        float inv = 1 / row_sum(sr, (int)n, 0, 0);
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
