/* `forward`: a whole GPT forward of a short chunk per row against the KV cache (mlperf/model.py's, same math), in
 * one call: no Python, dispatch or small tensors between its ops. Every query's attention and every row's norms are
 * computed on their own, so a row's results depend neither on its batch nor on its chunk's length.
 * `chain`: a forward, then greedy steps fed their own argmaxes: a draft model's proposals in one call. */
#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static void layernorm(const float *x, const float *w, const float *b, float *y, int M, int C) {
    for (int m = 0; m < M; m++) {
        const float *xm = x + (size_t)m * C;
        float *ym = y + (size_t)m * C, mean = row_sum(xm, C, 0, 0) / C;
        float inv = 1.0f / sqrtf(row_sum(xm, C, mean, 1) / C + 1e-5f);
        for (int i = 0; i < C; i++) ym[i] = (xm[i] - mean) * inv * w[i] + b[i];
    }
}

/* Where each of a call's M tokens goes (row, cache slot, position, the slots it attends to, its tree's root), the
 * first token of each block of QUERIES of a row, and each row's last token: arrays of the caller's. */
struct places {
    int M, blocks;
    int *row, *last, *first;
    long *pos, *slot, *ctx, *root;
};

/* A call's places, from its rows' starts and lens (and a tree's depths). */
static void place(const struct call *c, struct places *p) {
    p->blocks = 0;
    for (int b = 0, r = 0; b < c->B; b++)
        for (int t = 0; t < c->lens[b]; t++, r++) {
            int node = c->nodes - c->lens[b] + t;
            p->row[r] = b, p->slot[r] = c->starts[b] + t, p->last[b] = r;
            if (t % QUERIES == 0) p->first[p->blocks++] = r;
            p->root[r] = c->starts[b] - (c->visible ? c->nodes - c->lens[b] : 0);
            p->pos[r] = c->visible ? p->root[r] + c->depths[node] : p->slot[r];
            p->ctx[r] = c->visible ? p->root[r] : p->slot[r] + 1;
        }
}

/* x (M, C): each token's embedding plus its position's; an EAGLE head's (no wpe) beside its features in f
 * (M, 2C), then its input layer into x. */
static void embed(const struct call *c, const struct places *p, float *x, float *f) {
    const struct model *m = c->m;
    int C = m->n_embd;
    for (int r = 0; r < p->M; r++) {
        const float *e = m->wte + (size_t)c->tokens[r] * C;
        float *xr = m->in_p ? f + (size_t)r * 2 * C : x + (size_t)r * C;
        for (int i = 0; i < C; i++) xr[i] = m->wpe ? e[i] + m->wpe[(size_t)p->pos[r] * C + i] : e[i];
        for (int i = 0; m->in_p && i < C; i++) xr[C + i] = c->feats[(size_t)r * C + i];
    }
    if (m->in_p) linear(f, m->in_p, m->in_b, NULL, x, p->M, 2 * C, C, c->threads, m->half, m->resident);
}

/* Layer l's keys and values from qkv (M, 3C) into the cache at each token's slot: (rows, heads, max_len, D). */
static void store(const struct call *c, const struct places *p, int l, const float *qkv) {
    int C = c->m->n_embd, H = c->m->n_head, D = C / H;
    float *kl = c->k + l * c->layer_stride, *vl = c->v + l * c->layer_stride;
    for (int r = 0; r < p->M; r++)
        for (int hd = 0; hd < H; hd++) {
            size_t at = p->row[r] * c->row_stride + ((size_t)hd * c->max_len + p->slot[r]) * D;
            for (int i = 0; i < D; i++) {
                kl[at + i] = qkv[(size_t)r * 3 * C + C + hd * D + i];
                vl[at + i] = qkv[(size_t)r * 3 * C + 2 * C + hd * D + i];
            }
        }
}

/* y (M, C): layer l's attention for every block of a row's queries and every head, head by head (a row's keys stay
 * in cache for its next block), each pass asking L2 for the next one's keys and values. */
static void attention(const struct call *c, const struct places *p, int l, const float *qkv, float *y) {
    int C = c->m->n_embd, H = c->m->n_head, D = C / H, blocks = p->blocks, nodes = c->nodes, max_len = c->max_len;
    float *kl = c->k + l * c->layer_stride, *vl = c->v + l * c->layer_stride;
    long row_stride = c->row_stride;
#ifdef _OPENMP
#pragma omp parallel for num_threads(c->threads) schedule(static) if (c->threads > 1)
#endif
    for (int job = 0; job < blocks * H; job++) {
        int hd = job / blocks, r = p->first[job % blocks], b = p->row[r];
        int Q = p->last[b] - r < QUERIES ? p->last[b] - r + 1 : QUERIES;
        float s[(size_t)QUERIES * max_len];
        size_t head = b * row_stride + (size_t)hd * max_len * D;
        const unsigned char *vis = c->visible ? c->visible + (size_t)(r % c->lens[b]) * nodes : NULL;
        int after = job + 1 < blocks * H ? job + 1 : job, ra = p->first[after % blocks]; /* the next pass's */
        size_t next = p->row[ra] * row_stride + (size_t)(after / blocks) * max_len * D;
        long n = after == job ? 0 : p->ctx[ra] * D;
        attend(Q, qkv + (size_t)r * 3 * C + hd * D, 3 * C, kl + head, vl + head, p->ctx + r, p->root[r], vis, nodes,
               D, s, max_len, y + (size_t)r * C + hd * D, C, span(kl + next, n), span(vl + next, n));
    }
}

/* Block l on x (M, C) in place, GPT-2's: x += attn(ln1(x)), x += mlp(ln2(x)); work holds h, qkv, y and f. */
static void block(const struct call *c, const struct places *p, int l, float *x, float *work) {
    const struct model *m = c->m;
    const struct layer *L = &m->layers[l];
    int M = p->M, C = m->n_embd, D = C / m->n_head, threads = c->threads;
    float *h = work, *qkv = h + (size_t)M * C, *y = qkv + (size_t)M * 3 * C, *f = y + (size_t)M * C;
    float *kl = c->k + l * c->layer_stride, *vl = c->v + l * c->layer_stride;
    struct ahead k0 = span(kl, p->ctx[0] * D), v0 = span(vl, p->ctx[0] * D); /* the first pass's, while QKV runs */
    fetch(&k0, p->ctx[0] * D * sizeof(float));
    fetch(&v0, p->ctx[0] * D * sizeof(float));
    layernorm(x, L->ln1_w, L->ln1_b, h, M, C);
    linear(h, L->attn_p, L->attn_b, L->attn_s, qkv, M, C, 3 * C, threads, m->half, m->resident);
    store(c, p, l, qkv);
    attention(c, p, l, qkv, y);
    linear(y, L->proj_p, L->proj_b, L->proj_s, h, M, C, C, threads, m->half, m->resident);
    for (size_t i = 0; i < (size_t)M * C; i++) x[i] += h[i];
    layernorm(x, L->ln2_w, L->ln2_b, h, M, C);
    linear(h, L->fc_p, L->fc_b, L->fc_s, f, M, C, 4 * C, threads, m->half, m->resident);
    EACH(f, (size_t)M * 4 * C, vgelu(lane))
    linear(f, L->out_p, L->out_b, L->out_s, h, M, 4 * C, C, threads, m->half, m->resident);
    for (size_t i = 0; i < (size_t)M * C; i++) x[i] += h[i];
}

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
    int B = c->B, C = m->n_embd, M = 0;
    long longest = 0, latest = 0;
    for (int b = 0; b < B; b++) {
        M += c->lens[b];
        longest = c->lens[b] > longest ? c->lens[b] : longest;
        latest = c->starts[b] > latest ? c->starts[b] : latest;
    }
    for (int r = 0; r < M; r++)
        if (c->tokens[r] < 0 || c->tokens[r] >= m->vocab) return 1;
    if (latest + longest > c->limit) return 2;
    int row[M], last[B], first[M];
    long pos[M], slot[M], ctx[M], root[M];
    struct places p = {M, 0, row, last, first, pos, slot, ctx, root};
    place(c, &p);
    float *x = c->work, *work = x + (size_t)M * C; /* x (M, C), then the blocks' h, qkv, y and f (M, 4C) */
    embed(c, &p, x, work + (size_t)M * 5 * C);
    for (int l = 0; l < m->n_layer; l++) block(c, &p, l, x, work);
    int rows = c->last_only ? B : M;
    for (int r = 0; r < rows; r++)
        layernorm(x + (size_t)(c->last_only ? last[r] : r) * C, m->lnf_w, m->lnf_b, c->hidden + (size_t)r * C, 1, C);
    if (m->head_p)
        linear(c->hidden, m->head_p, m->head_b, m->head_s, c->logits, rows, C, m->vocab, c->threads, m->half,
               m->resident);
    for (int b = 0; b < B; b++) c->starts[b] += c->lens[b];
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
