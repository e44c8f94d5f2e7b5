/* The CPU fast path's kernels (built and loaded by suts/fast/native.py, called by suts/fast/fused.py): what they share.
 *
 * linear.c: linear layers of up to MAX_ROWS rows at the speed of their weights.
 * attention.c: one row's queries of one head against its slots in the KV cache (and a token tree's nodes).
 * forward.c: a whole GPT forward of a short chunk per row (`forward`), and greedy steps fed their own argmaxes
 * (`chain`): one call each, no Python, dispatch or small tensors between their ops.
 *
 * The names exported are none that libc exports: a call between them binds to a same-named symbol loaded first
 * (glibc's legacy `step`, for one).
 */
#ifndef KERNELS_H
#define KERNELS_H
#include "simd.h"


/* The tunables in one block: choices of speed, each measured on the machines docs/measurements.md names (PANEL is
 * also the packed layout suts/fast/packed.py writes, and MAX_ROWS what max_rows() tells suts/fast/fused.py). */
#define MAX_ROWS 64 /* the most rows the fast path sends here; beyond, oneDNN's blocked kernels take over */
#define PANEL 16
#define GROUP (LANES == 16 ? 8 : 6) /* rows per pass over a panel: 16 sums per row, one AVX-512 register (32 of
                                     * them) or two of AVX2 (16: six rows' sums leave a register for the panel's
                                     * and one for the input) */
#define PANELS 4 /* panels one row takes a pass where its weights come from cache (a draft's): four chains of
                  * multiply-adds, not one waiting on its last (weights streamed from memory lose by it: hence
                  * CACHED); 2 or 3 rows take half as many */
#define STREAMS(half) ((half) && LANES == 16 ? 4 : 2) /* panels a pass of 2 to FEW rows takes where its weights
                   * stream from memory (the target's): two chains on two streams half the range apart keep twice the
                   * loads in flight (four adjacent panels lose); fp16 panels on AVX-512 (widened as read, the
                   * multiply-adds set the pace) four, 4 x 3 sums in its 32 registers; one row takes ROW_STREAMS */
#define ROW_STREAMS(s, half) ((s) ? 4 : (half) ? 3 : 2) /* panels one row takes a pass where its weights stream:
                   * fp32 weights come from memory no faster with more streams, but narrow ones (in cache, widened
                   * as read) leave the multiply-adds to set the pace, and these take as many chains to hide their
                   * latency */
#define CACHED (512 * 1024) /* bytes of weights a pass reads that count as cached */
#define CHAIN_FETCH (8L << 20) /* bytes of weights a greedy chain asks L2 for before its first step */
#define FEW(half) ((half) && LANES == 16 ? 3 : 4) /* rows that take their passes over streamed weights several
               * panels at a time (STREAMS; one row ROW_STREAMS) rather than in groups */
#define QUADS 6 /* rows up to which fp16 panels on AVX-512 past FEW go as one group over four panels a pass, not two:
                 * 4 x 6 sums fill its 32 registers, and the multiply-adds of four chains a row hide their latency */
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
    int resident; /* its weights outgrow L2 but stay in the last-level cache between calls (`linear`) */
};

/* One call's arguments, for `forward` and `chain` alike. suts/fast/native.py declares this struct (and `model` and
 * `layer` above) to ctypes by reading these definitions, so a field is added here and nowhere else. */
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

/* linear.c */
int max_rows(void);
void linear(const float *x, const void *p, const float *b, const float *s, float *y, int M, int K, int N,
            int threads, int half, int resident);

/* attention.c */
void attend(int Q, const float *q, size_t qs, const float *k, const float *v, const long *ctx, long tree,
            const unsigned char *vis, int nodes, int D, float *s, size_t ss, float *out, size_t os, struct ahead nk,
            struct ahead nv);

/* forward.c */
int forward(const struct call *c);
int chain(const struct call *c);
#endif
