// CPU backend: causal multi-head attention with grouped K/V heads, RoPE and ALiBi.
//
// The reference implementation: one score row (length t + 1) at a time per (b, h, t), never a (T, T) matrix.
// Forward saves lse = logsumexp of the scaled (and ALiBi-biased) scores; backward recomputes the
// probabilities from it, FlashAttention-style:
//   pass 1, one (b, h, t) per task:  dq_t = scale * sum_s p_ts (dout_t . v_s - D_t) k_s,  D_t = dout_t .
//   out_t pass 2, one (b, kvh, s) per task: dk_s, dv_s summed over the query heads of the group and t >= s in
//   order,
// so every gradient element has exactly one owner and a fixed summation order (no atomics).
// RoPE is applied to a copy of q and k; gradients are computed in the rotated frame and rotated back.
// qkv and dqkv rows may be slices of wider rows (strides in elements): every index below goes through them.
#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- positions ----------------------------------------------------------------------------------------

// ALiBi slopes. For a power of two NH: 2^(-8 (h + 1) / NH). Otherwise (the ALiBi paper's reference code): the
// slopes of the closest power of two n < NH, then every other slope of the 2n construction for the rest.
float kiln_cpu_alibi_slope(int h, int NH) {
    int n = 1;
    while (n * 2 <= NH)
        n *= 2;
    if (h < n)
        return (float)exp2(-8.0 * (h + 1) / n);
    int j = 2 * (h - n); // index into the 2n construction, even entries only
    return (float)exp2(-8.0 * (j + 1) / (2 * n));
}

// cos/sin of the RoPE angles at position t: angle_i = t * theta^(-2i / HS), i < HS/2. Computed in double and
// in one place, so forward and decode rotate bitwise alike.
void kiln_cpu_rope_angles(int t, int HS, float theta, float *cos_out, float *sin_out) {
    for (int i = 0; i < HS / 2; i++) {
        double angle = t * pow((double)theta, -2.0 * i / HS);
        cos_out[i] = (float)cos(angle);
        sin_out[i] = (float)sin(angle);
    }
}

// Rotates the pairs (x[i], x[i + HS/2]) by the angles (inverse: by minus the angles, the transpose, which
// maps a gradient in the rotated frame back to the input frame).
void kiln_cpu_rope_apply(float *x, int HS, const float *c, const float *s, int inverse) {
    int half = HS / 2;
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        float sn = inverse ? -s[i] : s[i];
        x[i] = x1 * c[i] - x2 * sn;
        x[i + half] = x2 * c[i] + x1 * sn;
    }
}

// (T, HS/2) tables of cos and sin.
static float *rope_table(int T, int HS, float theta, float **sin_out) {
    float *c = malloc((size_t)T * (HS / 2) * sizeof(float) + 1);
    float *s = malloc((size_t)T * (HS / 2) * sizeof(float) + 1);
    KILN_ASSERT(c && s);
    for (int t = 0; t < T; t++)
        kiln_cpu_rope_angles(t, HS, theta, c + (size_t)t * (HS / 2), s + (size_t)t * (HS / 2));
    *sin_out = s;
    return c;
}

// A dense copy of qkv (B, T, (NH + 2 NKV) HS, rows *rs apart) with q and k rotated (*rs becomes the dense
// width), or the input itself when there is no RoPE.
static const float *rotated_qkv(void *ctx, const float *qkv, int *rs, int B, int T, int NH, int NKV, int HS,
                                enum kiln_pos pos, float theta, float **owned) {
    *owned = NULL;
    if (pos != KILN_POS_ROPE)
        return qkv;
    KILN_ASSERT(HS % 2 == 0);
    int W = (NH + 2 * NKV) * HS;
    float *r = malloc((size_t)B * T * W * sizeof(float));
    KILN_ASSERT(r);
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
        memcpy(r + bt * W, qkv + bt * *rs, (size_t)W * sizeof(float));
    *rs = W;
    float *sn;
    float *cs = rope_table(T, HS, theta, &sn);
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx))                                                  \
    schedule(static) if (KILN_CPU_PAR((double)B * T * W))
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        for (int h = 0; h < NH + NKV; h++)
            kiln_cpu_rope_apply(r + (size_t)bt * W + h * HS, HS, cs + (size_t)t * (HS / 2),
                                sn + (size_t)t * (HS / 2), 0);
    }
    free(cs);
    free(sn);
    *owned = r;
    return r;
}

void kiln_cpu_exp_shifted(float *x, int n, float shift) {
    for (int i = 0; i < n; i++)
        x[i] = kiln_cpu_exp_neg(x[i] - shift);
}

// ---- one query row ------------------------------------------------------------------------------------

// Scores of query q (at position t) against keys 0..t: scores[s] = scale * q.k_s + slope * (s - t).
static void score_row(const float *q, const float *k, size_t kstride, int t, int HS, float scale, float slope,
                      float *scores) {
    for (int s = 0; s <= t; s++)
        scores[s] = scale * kiln_cpu_dot(q, k + (size_t)s * kstride, HS) + slope * (float)(s - t);
}

// scores[0..n) = e^(scores - their max); returns the sum of those, and the max in *maxv
static double exp_row(float *scores, int n, float *maxv) {
    float m = -INFINITY;
    for (int s = 0; s < n; s++)
        m = scores[s] > m ? scores[s] : m;
    kiln_cpu_exp_shifted(scores, n, m);
    double sum = 0;
    for (int s = 0; s < n; s++)
        sum += scores[s];
    *maxv = m;
    return sum;
}

// out = softmax(scores) @ v over keys 0..t; returns the log-sum-exp of the scores.
static float attend_row(const float *q, const float *k, const float *v, size_t kvstride, int t, int HS,
                        float scale, float slope, float *scores, float *out) {
    score_row(q, k, kvstride, t, HS, scale, slope, scores);
    float maxv;
    double sum = exp_row(scores, t + 1, &maxv);
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < HS; i++)
        out[i] = 0.0f;
    for (int s = 0; s <= t; s++) {
        float p = scores[s] * inv;
        const float *vs = v + (size_t)s * kvstride;
        for (int i = 0; i < HS; i++)
            out[i] += p * vs[i];
    }
    return maxv + (float)log(sum);
}

// ---- tiles of queries: the products as GEMMs ------------------------------------------------------------
// A tile of QT query rows [t0, t0 + m) of one head against keys [0, t0 + m): the scores, their softmax and
// the products with v (and in the backward with dout, k and q) are small GEMMs (kiln_cpu_gemm_serial) on the
// calling thread, each with its packing buffers; the keys past a row's position (inside the diagonal tile)
// are computed and then masked. Each element's arithmetic depends on the shapes alone, never on the thread
// that computes it or how many there are.
#define QT 64

struct tile_ws {
    float *apack, *bpack; // kiln_cpu_gemm_serial's
    float *S, *dS;        // (QT, T): scores, then probabilities; dL/dP, then dL/dS
};

static struct tile_ws tile_ws_new(int T) {
    struct tile_ws w;
    w.apack = aligned_alloc(64, (size_t)KILN_CPU_MB * KILN_CPU_KC * sizeof(float));
    w.bpack = aligned_alloc(64, (size_t)KILN_CPU_KC * KILN_CPU_NC * sizeof(float));
    w.S = malloc((size_t)QT * T * sizeof(float));
    w.dS = malloc((size_t)QT * T * sizeof(float));
    KILN_ASSERT(w.apack && w.bpack && w.S && w.dS);
    return w;
}

static void tile_ws_free(struct tile_ws *w) {
    free(w->apack), free(w->bpack), free(w->S), free(w->dS);
}

// C (M, N) = or += A (M, K) @ B (K, N), A transposed where ta, B where tb (struct kiln_cpu_gemm)
static void tile_mm(struct tile_ws *w, int M, int N, int K, const float *A, int lda, int ta, const float *B,
                    int ldb, int tb, float *C, int ldc, int accumulate) {
    struct kiln_cpu_gemm g = {.M = M,
                              .N = N,
                              .K = K,
                              .A = A,
                              .lda = lda,
                              .ta = ta,
                              .B = B,
                              .ldb = ldb,
                              .tb = tb,
                              .C = C,
                              .ldc = ldc,
                              .accumulate = accumulate};
    kiln_cpu_gemm_serial(&g, w->apack, w->bpack);
}

// S (m, n) = the scores of query rows t0.. (q, rows W apart) against keys 0..n-1 (k), scaled and with
// ALiBi's bias, for the keys each row sees (s <= t); the others are left as the GEMM wrote them.
static void tile_scores(struct tile_ws *w, const float *q, const float *k, int W, int t0, int m, int n,
                        int HS, float scale, float slope) {
    tile_mm(w, m, n, HS, q, W, 0, k, W, 1, w->S, n, 0);
    for (int i = 0; i < m; i++) {
        float *row = w->S + (size_t)i * n;
        int t = t0 + i;
        for (int s = 0; s <= t; s++)
            row[s] = scale * row[s] + slope * (float)(s - t);
    }
}

// One forward tile: out rows (rows C apart) and lse (one a row) of query rows t0..t0+m-1
static void tile_forward(struct tile_ws *w, const float *q, const float *k, const float *v, int W, int t0,
                         int m, int HS, float scale, float slope, float *out, int C, float *lse) {
    int n = t0 + m;
    tile_scores(w, q, k, W, t0, m, n, HS, scale, slope);
    for (int i = 0; i < m; i++) {
        float *row = w->S + (size_t)i * n;
        int t = t0 + i;
        float maxv;
        double sum = exp_row(row, t + 1, &maxv);
        float inv = (float)(1.0 / sum);
        for (int s = 0; s <= t; s++)
            row[s] *= inv;
        for (int s = t + 1; s < n; s++)
            row[s] = 0.0f;
        lse[i] = maxv + (float)log(sum);
    }
    tile_mm(w, m, HS, n, w->S, n, 0, v, W, 0, out, C, 0);
}

// ---- ops -------------------------------------------------------------------------------------------

void kiln_cpu_attention_forward(void *ctx, const struct kiln_attn_args *a) {
    int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, HS = a->HS;
    KILN_ASSERT(NKV > 0 && NH % NKV == 0);
    int group = NH / NKV, W = a->qkv_stride ? a->qkv_stride : (NH + 2 * NKV) * HS, C = NH * HS;
    int tiles = (T + QT - 1) / QT;
    float scale = 1.0f / sqrtf((float)HS);
    float *owned;
    const float *qkv = rotated_qkv(ctx, a->qkv, &W, B, T, NH, NKV, HS, a->pos, a->rope_theta, &owned);
    float *out = a->out;
#pragma omp parallel num_threads(kiln_cpu_threads(ctx)) if (KILN_CPU_PAR((double)B * NH * T * T * HS))
    {
        struct tile_ws w = tile_ws_new(T);
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < B * NH * tiles; task++) {
            int tile = tiles - 1 - task % tiles, h = (task / tiles) % NH,
                b = task / (tiles * NH); // long first
            int t0 = tile * QT, m = T - t0 < QT ? T - t0 : QT, kvh = h / group;
            const float *base = qkv + (size_t)b * T * W;
            float slope = a->pos == KILN_POS_ALIBI ? kiln_cpu_alibi_slope(h, NH) : 0.0f;
            tile_forward(&w, base + (size_t)t0 * W + h * HS, base + (NH + kvh) * HS,
                         base + (NH + NKV + kvh) * HS, W, t0, m, HS, scale, slope,
                         out + ((size_t)b * T + t0) * C + h * HS, C, a->lse + ((size_t)b * NH + h) * T + t0);
        }
        tile_ws_free(&w);
    }
    free(owned);
}

// The backward in one pass, a task a (batch, key/value head): for each of the group's heads and each tile of
// queries, P from the scores and lse, dL/dP = dout v^T, dL/dS = P (dL/dP - D) scale, then dq = dL/dS k for
// the tile's rows, and dk += dL/dS^T q, dv += P^T dout for the keys it sees: 5 products of the head size a
// (query, key) pair. The tasks own their dk and dv rows, so nothing is shared; with fewer tasks than
// ONE_PASS_TASKS (a small batch of few key/value heads), the two-pass row backward below runs instead, which
// parallelizes over rows (7 products a pair).
#define ONE_PASS_TASKS 8

static void backward_one_pass(void *ctx, const struct kiln_attn_back_args *a, const float *qkv, int W,
                              int DW) {
    int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, HS = a->HS, C = NH * HS, group = NH / NKV;
    int tiles = (T + QT - 1) / QT;
    float scale = 1.0f / sqrtf((float)HS);
    const float *dout = a->dout, *out = a->out;
    float *dqkv = a->dqkv;
#pragma omp parallel num_threads(kiln_cpu_threads(ctx)) if (KILN_CPU_PAR((double)B * NH * T * T * HS))
    {
        struct tile_ws w = tile_ws_new(T);
        float Dt[QT]; // dout . out of the tile's rows
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < B * NKV; task++) {
            int kvh = task % NKV, b = task / NKV;
            const float *base = qkv + (size_t)b * T * W;
            const float *k = base + (NH + kvh) * HS, *v = base + (NH + NKV + kvh) * HS;
            float *dq0 = dqkv + (size_t)b * T * DW;
            float *dk = dq0 + (NH + kvh) * HS, *dv = dq0 + (NH + NKV + kvh) * HS;
            for (int s = 0; s < T; s++) {
                memset(dk + (size_t)s * DW, 0, (size_t)HS * sizeof(float));
                memset(dv + (size_t)s * DW, 0, (size_t)HS * sizeof(float));
            }
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                float slope = a->pos == KILN_POS_ALIBI ? kiln_cpu_alibi_slope(h, NH) : 0.0f;
                for (int tile = 0; tile < tiles; tile++) {
                    int t0 = tile * QT, m = T - t0 < QT ? T - t0 : QT, n = t0 + m;
                    const float *q = base + (size_t)t0 * W + h * HS;
                    const float *dy = dout + ((size_t)b * T + t0) * C + h * HS;
                    const float *o = out + ((size_t)b * T + t0) * C + h * HS;
                    const float *lse = a->lse + ((size_t)b * NH + h) * T + t0;
                    tile_scores(&w, q, k, W, t0, m, n, HS, scale, slope);
                    tile_mm(&w, m, n, HS, dy, C, 0, v, W, 1, w.dS, n, 0); // dL/dP
                    for (int i = 0; i < m; i++) {
                        int t = t0 + i;
                        float *p = w.S + (size_t)i * n, *ds = w.dS + (size_t)i * n;
                        Dt[i] = kiln_cpu_dot(dy + (size_t)i * C, o + (size_t)i * C, HS);
                        kiln_cpu_exp_shifted(p, t + 1, lse[i]);
                        for (int s = 0; s <= t; s++)
                            ds[s] = p[s] * (ds[s] - Dt[i]) * scale;
                        for (int s = t + 1; s < n; s++)
                            p[s] = ds[s] = 0.0f;
                    }
                    tile_mm(&w, m, HS, n, w.dS, n, 0, k, W, 0, dq0 + (size_t)t0 * DW + h * HS, DW, 0);
                    tile_mm(&w, n, HS, m, w.dS, n, 1, q, W, 0, dk, DW, 1);
                    tile_mm(&w, n, HS, m, w.S, n, 1, dy, C, 0, dv, DW, 1);
                }
            }
        }
        tile_ws_free(&w);
    }
}

// The backward row by row, in two passes over every (query, key) pair: dq a task a query row, then dk and dv
// a task a (batch, key/value head, key)
static void backward_two_pass(void *ctx, const struct kiln_attn_back_args *a, const float *qkv, int W,
                              int DW) {
    int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, HS = a->HS, nt = kiln_cpu_threads(ctx);
    int group = NH / NKV, C = NH * HS;
    float scale = 1.0f / sqrtf((float)HS);
    const float *dout = a->dout, *out = a->out, *lse = a->lse;
    float *dqkv = a->dqkv;
    float *D = malloc((size_t)B * NH * T * sizeof(float) + 1); // (B, NH, T) dout . out
    KILN_ASSERT(D);
#pragma omp parallel num_threads(nt) if (KILN_CPU_PAR((double)B * NH * T * T * HS))
    {
        float *scores = malloc((size_t)T * sizeof(float));
        KILN_ASSERT(scores);
        // pass 1: D and dq
#pragma omp for schedule(dynamic, 4)
        for (int task = 0; task < B * NH * T; task++) {
            int t = T - 1 - task % T, h = (task / T) % NH, b = task / (T * NH);
            int kvh = h / group;
            const float *base = qkv + (size_t)b * T * W;
            const float *k = base + (NH + kvh) * HS, *v = base + (NH + NKV + kvh) * HS;
            const float *dy = dout + ((size_t)b * T + t) * C + h * HS;
            float Dt = kiln_cpu_dot(dy, out + ((size_t)b * T + t) * C + h * HS, HS);
            float row_lse = lse[((size_t)b * NH + h) * T + t];
            D[((size_t)b * NH + h) * T + t] = Dt;
            float slope = a->pos == KILN_POS_ALIBI ? kiln_cpu_alibi_slope(h, NH) : 0.0f;
            score_row(base + (size_t)t * W + h * HS, k, W, t, HS, scale, slope, scores);
            float *dq = dqkv + ((size_t)b * T + t) * DW + h * HS;
            for (int i = 0; i < HS; i++)
                dq[i] = 0.0f;
            kiln_cpu_exp_shifted(scores, t + 1, row_lse);
            for (int s = 0; s <= t; s++) {
                float p = scores[s];
                float ds = p * (kiln_cpu_dot(dy, v + (size_t)s * W, HS) - Dt) * scale;
                const float *ks = k + (size_t)s * W;
                for (int i = 0; i < HS; i++)
                    dq[i] += ds * ks[i];
            }
        }
        // pass 2: dk, dv, one (b, kvh, s) per task, summing over the group's heads and t >= s in order
#pragma omp for schedule(dynamic, 4)
        for (int task = 0; task < B * NKV * T; task++) {
            int s = task % T, kvh = (task / T) % NKV, b = task / (T * NKV);
            const float *base = qkv + (size_t)b * T * W;
            const float *ks = base + (size_t)s * W + (NH + kvh) * HS;
            const float *vs = base + (size_t)s * W + (NH + NKV + kvh) * HS;
            float *dk = dqkv + ((size_t)b * T + s) * DW + (NH + kvh) * HS;
            float *dv = dqkv + ((size_t)b * T + s) * DW + (NH + NKV + kvh) * HS;
            for (int i = 0; i < HS; i++)
                dk[i] = dv[i] = 0.0f;
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                float slope = a->pos == KILN_POS_ALIBI ? kiln_cpu_alibi_slope(h, NH) : 0.0f;
                const float *row_lse = lse + ((size_t)b * NH + h) * T;
                for (int t = s; t < T; t++) // P[t][s] for every query t >= s, exponentiated together
                    scores[t] = scale * kiln_cpu_dot(base + (size_t)t * W + h * HS, ks, HS) +
                                slope * (float)(s - t) - row_lse[t];
                kiln_cpu_exp_shifted(scores + s, T - s, 0.0f);
                for (int t = s; t < T; t++) {
                    const float *q = base + (size_t)t * W + h * HS;
                    const float *dy = dout + ((size_t)b * T + t) * C + h * HS;
                    float p = scores[t];
                    float ds = p * (kiln_cpu_dot(dy, vs, HS) - D[((size_t)b * NH + h) * T + t]) * scale;
                    for (int i = 0; i < HS; i++) {
                        dk[i] += ds * q[i];
                        dv[i] += p * dy[i];
                    }
                }
            }
        }
        free(scores);
    }
    free(D);
}

void kiln_cpu_attention_backward(void *ctx, const struct kiln_attn_back_args *a) {
    int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, HS = a->HS, nt = kiln_cpu_threads(ctx);
    KILN_ASSERT(NKV > 0 && NH % NKV == 0);
    int W = a->qkv_stride ? a->qkv_stride : (NH + 2 * NKV) * HS;    // qkv rows (after rotated_qkv)
    int DW = a->dqkv_stride ? a->dqkv_stride : (NH + 2 * NKV) * HS; // dqkv rows
    float *owned;
    const float *qkv = rotated_qkv(ctx, a->qkv, &W, B, T, NH, NKV, HS, a->pos, a->rope_theta, &owned);
    if (B * NKV >= ONE_PASS_TASKS)
        backward_one_pass(ctx, a, qkv, W, DW);
    else
        backward_two_pass(ctx, a, qkv, W, DW);
    free(owned);
    float *dqkv = a->dqkv;
    if (a->pos == KILN_POS_ROPE) { // back from the rotated frame
        float *sn;
        float *cs = rope_table(T, HS, a->rope_theta, &sn);
#pragma omp parallel for num_threads(nt) schedule(static) if (KILN_CPU_PAR((double)B * T * DW))
        for (int bt = 0; bt < B * T; bt++) {
            int t = bt % T;
            for (int h = 0; h < NH + NKV; h++)
                kiln_cpu_rope_apply(dqkv + (size_t)bt * DW + h * HS, HS, cs + (size_t)t * (HS / 2),
                                    sn + (size_t)t * (HS / 2), 1);
        }
        free(cs);
        free(sn);
    }
}

void kiln_cpu_attention_decode(void *ctx, const struct kiln_attn_decode_args *a) {
    int B = a->B, NH = a->NH, NKV = a->NKV, HS = a->HS, pos = a->pos, maxT = a->maxT;
    KILN_ASSERT(NKV > 0 && NH % NKV == 0 && pos >= 0 && pos < maxT);
    int W = a->qkv_stride ? a->qkv_stride : (NH + 2 * NKV) * HS, KW = NKV * HS, group = NH / NKV;
    int rope = a->pos_kind == KILN_POS_ROPE;
    float scale = 1.0f / sqrtf((float)HS);
    float *cs = malloc((size_t)(HS / 2 + 1) * sizeof(float)),
          *sn = malloc((size_t)(HS / 2 + 1) * sizeof(float));
    KILN_ASSERT(cs && sn);
    if (rope) {
        KILN_ASSERT(HS % 2 == 0);
        kiln_cpu_rope_angles(pos, HS, a->rope_theta, cs, sn);
    }
    const float *qkv = a->qkv;
    float *kcache = a->kcache, *vcache = a->vcache, *out = a->out;
    for (int b = 0; b < B; b++) { // k, v of the new token into the caches
        float *kc = kcache + ((size_t)b * maxT + pos) * KW, *vc = vcache + ((size_t)b * maxT + pos) * KW;
        memcpy(kc, qkv + (size_t)b * W + NH * HS, KW * sizeof(float));
        memcpy(vc, qkv + (size_t)b * W + (NH + NKV) * HS, KW * sizeof(float));
        if (rope)
            for (int h = 0; h < NKV; h++)
                kiln_cpu_rope_apply(kc + h * HS, HS, cs, sn, 0);
    }
#pragma omp parallel num_threads(kiln_cpu_threads(ctx)) if (KILN_CPU_PAR((double)B * NH * (pos + 1) * HS))
    {
        float *scores = malloc((size_t)(pos + 1) * sizeof(float));
        float *q = malloc((size_t)HS * sizeof(float));
        KILN_ASSERT(scores && q);
#pragma omp for schedule(static)
        for (int task = 0; task < B * NH; task++) {
            int h = task % NH, b = task / NH, kvh = h / group;
            memcpy(q, qkv + (size_t)b * W + h * HS, HS * sizeof(float));
            if (rope)
                kiln_cpu_rope_apply(q, HS, cs, sn, 0);
            float slope = a->pos_kind == KILN_POS_ALIBI ? kiln_cpu_alibi_slope(h, NH) : 0.0f;
            attend_row(q, kcache + (size_t)b * maxT * KW + kvh * HS,
                       vcache + (size_t)b * maxT * KW + kvh * HS, KW, pos, HS, scale, slope, scores,
                       out + (size_t)b * NH * HS + h * HS);
        }
        free(scores);
        free(q);
    }
    free(cs);
    free(sn);
}
