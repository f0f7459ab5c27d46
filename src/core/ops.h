// The ops table: every numerical operation the model needs, as function pointers a backend fills in.
//
// src/model/ is written once against this table (docs/architecture.md). A backend pairs the table with an
// opaque context. The CPU backend (fp32, OpenMP) is the reference; the CUDA backend (bf16 mixed precision) is
// the product. Fused GPU kernels are ops too: the CPU backend implements them in their plain form.
//
// Conventions
// - Pointers are backend memory (host memory on the CPU, device memory on CUDA).
// - "act" tensors (activations, compute weights, activation gradients) have the backend's act_dtype
//   (CPU: f32, CUDA: bf16). "grad" tensors (parameter gradients) have grad_dtype. Tensors documented as
//   float are always f32 (master weights, optimizer state, LayerNorm statistics, log-sum-exp, losses).
// - Token ids and targets are int32.
// - Shapes use B (batch), T (time), C (channels), NH (query heads), NKV (key/value heads), HS (head size),
//   V (real vocab), Vp (vocab padded to a multiple of 128), N (rows = B*T, or any row count).
// - Parameter-gradient outputs always ACCUMULATE (+=): gradients are zeroed once per optimizer step, which
//   makes gradient accumulation free. Activation-gradient outputs overwrite unless a flag says otherwise.
// - Ops do not fail. Backend faults (a CUDA error) are internal errors and abort with file:line. Only alloc
//   can fail, by returning NULL, so that the caller can report the memory plan.
#ifndef KILN_CORE_OPS_H
#define KILN_CORE_OPS_H

#include <stddef.h>
#include <stdint.h>

// U8 (raw bytes) and F64 travel through communication only (control values, hashes): no op takes them
enum kiln_dtype { KILN_F32 = 0, KILN_BF16 = 1, KILN_I32 = 2, KILN_U8 = 3, KILN_F64 = 4 };
size_t kiln_dtype_bytes(enum kiln_dtype dt);
const char *kiln_dtype_name(enum kiln_dtype dt);

enum kiln_act { KILN_ACT_NONE = 0, KILN_ACT_GELU = 1 }; // GELU is the tanh approximation, as GPT-2
enum kiln_pos { KILN_POS_LEARNED = 0, KILN_POS_ROPE = 1, KILN_POS_ALIBI = 2, KILN_POS_NONE = 3 };

// ---- argument structs (more than ~6 arguments -> a struct) ---------------------------------------

struct kiln_embed_args {
    void *out;          // act (B*T, C)
    const int32_t *tokens;       // (B*T) backend memory
    const int32_t *tokens_host;  // (B*T) the same ids in host memory (lets a backend bucket them), may be NULL
    const void *wte;    // act (Vp, C)
    const void *wpe;    // act (maxT, C), NULL when positions are not learned
    int B, T, C;
    // Sequence parallelism: a rank's tokens may be two runs of positions. Column t < pos_split reads row t of
    // wpe, column t >= pos_split row t - pos_split of wpe_hi (0 or T: one run, wpe_hi unused). The caller
    // points wpe and wpe_hi at the first row of each run.
    const void *wpe_hi;
    int pos_split;
    // A vocabulary-parallel embedding (tensor parallelism): wte holds rows [vocab_lo, vocab_lo + vocab_n) of
    // the padded vocabulary, and a token outside them contributes zeros (vocab_n 0: wte holds every row)
    int vocab_lo, vocab_n;
};

struct kiln_embed_back_args {
    void *dwte;         // grad (Vp, C), +=
    void *dwpe;         // grad (maxT, C), +=, NULL when positions are not learned
    const void *dout;   // act (B*T, C)
    const int32_t *tokens;
    const int32_t *tokens_host;
    int B, T, C;
    void *dwpe_hi;      // as the forward's wpe_hi and pos_split (the two runs' rows never overlap)
    int pos_split;
    int vocab_lo, vocab_n; // as the forward's: tokens outside the rows dwte holds add nothing
};

// Optionally fused residual add: when res_in is set, x = inp + res_in is written to res_out (act (N, C))
// and normalized; otherwise x = inp. rms != 0 selects RMSNorm (no mean, no bias).
struct kiln_norm_args {
    void *out;          // act (N, C)
    float *mean;        // (N) saved for backward; NULL for RMSNorm
    float *rstd;        // (N) saved for backward
    void *res_out;      // act (N, C) or NULL
    const void *inp;    // act (N, C)
    const void *res_in; // act (N, C) or NULL
    const void *weight; // act (C)
    const void *bias;   // act (C) or NULL
    int N, C;
    int rms;
    float eps;
    int stride; // elements between consecutive rows of inp, out, res_in, res_out (0 = C): QK-norm
                // normalizes the q and k slices of qkv rows in place of a copy
};

struct kiln_norm_back_args {
    void *dinp;         // act (N, C), += (it is the residual stream's gradient)
    void *dweight;      // grad (C), += (= with grad_assign)
    void *dbias;        // grad (C), += (= with grad_assign), or NULL
    const void *dout;   // act (N, C)
    const void *inp;    // act (N, C): the normalized input x (res_out of the forward when fused)
    const void *weight; // act (C)
    const float *mean;  // (N), NULL for RMSNorm
    const float *rstd;  // (N)
    int N, C;
    int rms;
    int stride;         // elements between consecutive rows of dinp, dout and inp (0 = C)
    int dinp_assign;    // dinp = instead of dinp +=
    int grad_assign;    // dweight, dbias, dres_bias = instead of += (the first write of a step: no zeroing pass)
    void *dres_bias[2]; // grad (C) or NULL each: += the column sums of dinp as this op leaves it. dinp is the
                        // residual stream's gradient, so these are the gradients of the biases of the
                        // projections that add into the stream there (a parallel block has two)
};

// out = act(inp @ weight^T + bias). With act == GELU, pre receives inp @ weight^T + bias.
struct kiln_matmul_args {
    void *out;          // act (N, OC)
    void *pre;          // act (N, OC) pre-activation, required when act != NONE, else NULL
    const void *inp;    // act (N, IC)
    const void *weight; // act (OC, IC), row-major, as PyTorch's nn.Linear
    const void *bias;   // act (OC) or NULL
    int N, IC, OC;
    enum kiln_act act;
    int accumulate;     // out += instead of out = (only with act == NONE)
    int rows_part;      // a part of the layer's rows (tensor parallelism's ring), not its whole input
};

// Given dout = dL/d(out) of a matmul with act == NONE:
//   dinp (=, or += when dinp_accumulate) dout @ weight, times gelu'(dinp_gelu_pre) elementwise when set
//   (this is the backward of the GELU of the *previous* matmul, fused here as cuBLASLt's DGELU epilogue);
//   dweight += dout^T @ inp;  dbias += sum over rows of dout  (= for both with grad_assign).
struct kiln_matmul_back_args {
    void *dinp;               // act (N, IC), or NULL to skip
    void *dweight;            // grad (OC, IC), +=, or NULL to skip (dbias NULL too): dinp alone
    void *dbias;              // grad (OC), +=, or NULL
    const void *dout;         // act (N, OC)
    const void *inp;          // act (N, IC)
    const void *weight;       // act (OC, IC)
    const void *dinp_gelu_pre;// act (N, IC) or NULL
    int N, IC, OC;
    int dinp_accumulate;
    int grad_assign;          // dweight, dbias = instead of += (the first write of a step: no zeroing pass)
    int dinp_stride;          // elements between rows of dinp (0 = IC): a column slice of a wider buffer
    int gelu_pre_stride;      // elements between rows of dinp_gelu_pre (0 = IC)
    int rows_part;            // a part of the layer's rows (as kiln_matmul_args's): inp is not the forward's
};

// Causal multi-head attention with grouped K/V heads, FlashAttention-style: no (T, T) matrix is kept;
// the per-row log-sum-exp of the scaled scores is saved for the backward pass.
// qkv rows hold [q (NH*HS) | k (NKV*HS) | v (NKV*HS)]; query head h reads kv head h / (NH/NKV).
// RoPE (rotating pairs (i, i + HS/2) of q and k, as GPT-NeoX/Llama) and ALiBi (slopes 2^(-8(h+1)/NH) for a
// power-of-two NH, with the standard interpolation otherwise) are applied inside the op.
// The qkv rows (and dqkv's) may be the first (NH + 2*NKV)*HS columns of wider rows, `stride` elements apart
// (0 = dense): the parallel block's fused projection writes [qkv | fc_pre] rows, attention reads its slice.
struct kiln_attn_args {
    void *out;          // act (B, T, NH*HS)
    float *lse;         // (B, NH, T)
    const void *qkv;    // act (B, T, (NH + 2*NKV)*HS), rows qkv_stride apart
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;  // ROPE and ALIBI act here; LEARNED and NONE do nothing
    float rope_theta;
    int qkv_stride;     // 0 = (NH + 2*NKV)*HS
};

struct kiln_attn_back_args {
    void *dqkv;         // act (B, T, (NH + 2*NKV)*HS), rows dqkv_stride apart; those columns overwritten
    const void *dout;   // act (B, T, NH*HS)
    const void *qkv;    // act, as forward
    const void *out;    // act, the forward output
    const float *lse;   // (B, NH, T)
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;
    float rope_theta;
    int qkv_stride;     // 0 = (NH + 2*NKV)*HS
    int dqkv_stride;    // 0 = (NH + 2*NKV)*HS
};

// One decoding step with a KV cache: the new token of each sequence sits at position pos. Its k and v
// (after RoPE) are written into the caches at pos, then q attends to positions 0..pos.
struct kiln_attn_decode_args {
    void *out;          // act (B, NH*HS)
    void *kcache;       // act (B, maxT, NKV*HS)
    void *vcache;       // act (B, maxT, NKV*HS)
    const void *qkv;    // act (B, (NH + 2*NKV)*HS), rows qkv_stride apart
    int B, maxT, pos, NH, NKV, HS;
    enum kiln_pos pos_kind;
    float rope_theta;
    int qkv_stride;     // 0 = (NH + 2*NKV)*HS
};

// Attention of a block of queries against a block of keys at global positions: what sequence parallelism
// builds attention from (ring attention passes key/value blocks around the ranks and merges the results;
// Ulysses runs it over every position for a rank's share of the heads). Query i of the block sits at
// position q0 + i, key j at k0 + j, and key j is visible to query i when k0 + j <= q0 + i (causal, on the
// global positions). RoPE rotates q and k by their global positions inside the op; ALiBi biases by the
// global distance with the slopes of heads head0 .. head0 + NH - 1 of NH_total. Query head h reads kv head
// h / (NH / NKV). A query that sees no key of the block gets lse = -inf and out = 0.
// With accumulate, the block is merged with what out and lse already hold for those queries, through the
// log-sum-exp: lse' = log(e^lse + e^lse_blk), out' = e^(lse - lse') out + e^(lse_blk - lse') out_blk, so blocks
// may arrive in any order.
// Element (b, i) of an operand X is the row at X + b * X_bstride + i * X_stride (elements of act dtype); q and
// dq share q's strides, k, v, dk and dv kv's, out and dout out's.
struct kiln_attn_block_args {
    void *out;              // act: NH*HS per query row, head h at column h*HS
    float *lse;             // f32: query i of head h in batch b at lse[(b*NH + h) * lse_stride + i]
    const void *q;          // act: NH*HS per row
    const void *k, *v;      // act: NKV*HS per row each
    int B, Tq, Tk, NH, NKV, HS;
    int q0, k0;             // global positions of query 0 and key 0
    size_t q_bstride, kv_bstride, out_bstride, lse_stride;
    int q_stride, kv_stride, out_stride;
    enum kiln_pos pos;      // ROPE and ALIBI act here; LEARNED and NONE do nothing
    float rope_theta;
    int head0, NH_total;    // ALiBi: these are global heads head0.. of NH_total (0, 0: head0 = 0, NH)
    int accumulate;         // 0: out, lse = this block's; 1: merged into what they hold
};

// The backward of one block, given the final out and lse (after every block was merged): dq, dk and dv
// (in the input frame, before RoPE) are accumulated (+=), so that a rank sums its blocks' contributions.
struct kiln_attn_block_back_args {
    struct kiln_attn_block_args blk; // the block as the forward saw it, with out and lse the final ones
                                     // (read only; accumulate unused)
    void *dq;               // act, like q, +=
    void *dk, *dv;          // act, like k and v, +=
    const void *dout;       // act, like out
};

// out = silu(gate) * up, where inp rows are [gate (H) | up (H)]. inp and dinp may be column slices of wider
// rows (strides in elements, 0 = 2H): the MLP's part of the parallel block's fused projection.
struct kiln_swiglu_args {
    void *out;          // act (N, H)
    const void *inp;    // act (N, 2H), rows inp_stride apart
    int N, H;
    int inp_stride;
};
struct kiln_swiglu_back_args {
    void *dinp;         // act (N, 2H), rows dinp_stride apart, overwritten (only those columns)
    const void *dout;   // act (N, H)
    const void *inp;    // act (N, 2H), rows inp_stride apart
    int N, H;
    int inp_stride, dinp_stride;
};

// out = gelu(inp), the GELU of matmul_forward's epilogue on its own: for a pre-activation that a wider GEMM
// wrote (the parallel block's fused projection), whose rows are inp_stride elements apart (0 = H).
struct kiln_gelu_args {
    void *out;          // act (N, H)
    const void *inp;    // act (N, H), rows inp_stride apart
    int N, H;
    int inp_stride;
};

// Cross-entropy over the real vocab V of padded logits (N, Vp): padded columns never receive probability.
// losses[i] = logsumexp(logits[i, :V]) - logits[i, target[i]] (+ z_loss * logsumexp^2).
// A target < 0 is ignored: its loss and its dlogits row are 0.
// With dloss != 0 the logits are overwritten in place by dL/dlogits, where L = dloss * sum_i losses[i];
// the padded columns get 0.
struct kiln_xent_args {
    void *logits;           // act (N, Vp): in: logits; out: dlogits when dloss != 0
    float *losses;          // (N) out
    const int32_t *targets; // (N)
    int N, V, Vp;
    float dloss;
    float z_loss;
};

// The cross-entropy over a vocabulary split across ranks (Megatron's vocabulary-parallel loss): each rank
// holds columns [v0, v0 + Vl) of the logits, and three phases, with a reduction over the ranks between each,
// give cross_entropy's losses and dlogits without any rank holding a whole row. stats is (3, N) f32 in
// backend memory: max, sum of exponentials, target logit.
//   phase 0: stats.max[i] = max of row i's real columns (j < V), stats.tgt[i] = its target's logit where
//            this rank holds it, else 0;  then reduce max (MAX) and tgt (SUM) over the ranks;
//   phase 1: stats.sum[i] = sum over real columns of exp(logit - max);  then reduce sum (SUM);
//   phase 2: losses and, with dloss != 0, this rank's dlogits in place, as cross_entropy's (padding and
//            ignored rows 0).
struct kiln_xent_par_args {
    void *logits;           // act (N, Vl)
    float *losses;          // (N) out (phase 2)
    const int32_t *targets; // (N) global ids, -1 = ignored
    float *stats;           // (3, N)
    int N, Vl, v0, V;
    int phase;
    float dloss, z_loss;
};

// One contiguous run of parameters with one weight-decay setting (2-D weights decay; biases, norms don't).
struct kiln_param_span {
    size_t offset, count;
    int decay;
    size_t state_offset; // where the span's AdamW moments start in m and v: offset when the state covers
                         // every parameter, a shard-local offset when a rank keeps only its shard (ZeRO)
};

// AdamW over spans of one flat parameter buffer (a multi-tensor update: one call for all tensors).
// g = grads * grad_scale (grad_scale folds in clipping and 1/accumulation); the bias-corrected update
// with decoupled weight decay is PyTorch's AdamW. When weights is not NULL (mixed precision), the updated
// master weights are also written there in act dtype, rounded stochastically when stochastic_rounding is set
// (the seed makes that deterministic).
struct kiln_adamw_args {
    float *params;          // (P) master weights
    void *weights;          // act (P) compute copy, or NULL when it aliases params
    const void *grads;      // grad (P), or compact like m and v when grads_compact
    float *m, *v;           // AdamW moments, indexed by each span's state_offset
    const struct kiln_param_span *spans; // host memory
    int n_spans;
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;
    int step;               // 1-based, for bias correction
    int stochastic_rounding;
    uint64_t seed;
    int grads_compact;      // grads indexed by each span's state_offset (a ZeRO-2 rank's reduced shard)
    int params_compact;     // params and weights indexed by each span's state_offset too (a ZeRO-3 shard);
                            // stochastic rounding still seeds by the flat index, so shards round as one model
};

// AdamW on host memory (the CPU backend's op, and the offloaded optimizer of every backend: core/adamw_host.c),
// with OpenMP over `threads` (0: OpenMP's default). grads are in grads_dtype (F32 or BF16); weights, when not
// NULL, receives the updated weights in weights_dtype (F32, or BF16 rounded to nearest even). With compact
// grads (and params), grads and weights are staging buffers that begin at state offset stage_offset (a chunk
// of a shard); 0 otherwise. Stochastic rounding is not done here.
void kiln_adamw_host(const struct kiln_adamw_args *a, enum kiln_dtype grads_dtype, enum kiln_dtype weights_dtype,
                     size_t stage_offset, int threads);

// ---- FP8 (the precision strategy's ops: src/precision/fp8.c) --------------------------------------------
// An FP8 tensor is one byte per element, in one of the two OCP formats: e4m3 (bias 7, 3 mantissa bits,
// max 448, no infinities, S.1111.111 is NaN) and e5m2 (bias 15, 2 mantissa bits, max 57344, IEEE-like
// infinities and NaNs). A tensor x is cast with a scale s = fmax / amax (kiln_fp8_scale): q = fp8(x * s),
// rounded to nearest even, subnormals included, saturating to +-fmax (infinities too), NaN kept NaN; it
// stands for q / s. Scales travel as the amax they come from into the cast, and as the inverse scale the cast
// writes into the GEMM (backend memory, f32), so that no value crosses to the host between the amax, the cast
// and the GEMM. Every backend must round exactly so (CUDA's cvt.satfinite does).
enum kiln_fp8_fmt { KILN_FP8_E4M3 = 0, KILN_FP8_E5M2 = 1 };

static inline float kiln_fp8_max(enum kiln_fp8_fmt f) {
    return f == KILN_FP8_E5M2 ? 57344.0f : 448.0f;
}
// s = fmax / amax in f32 (amax clamped below at 1e-12, so an all-zero tensor gets a large finite scale); a
// non-finite amax (a NaN or an infinity in the tensor) gives s = 1, so that the NaN reaches the loss
static inline float kiln_fp8_scale(float amax, enum kiln_fp8_fmt f) {
    if (!(amax - amax == 0.0f))
        return 1.0f;
    return kiln_fp8_max(f) / (amax > 1e-12f ? amax : 1e-12f);
}

// What an amax or a scale covers: the whole tensor, each row, or each column of a (rows, cols) tensor
enum kiln_fp8_per { KILN_FP8_TENSOR = 0, KILN_FP8_ROWS = 1, KILN_FP8_COLS = 2 };

// amax = max |x| over the tensor (1 value), each row (rows values) or each column (cols values); NaN if any
// element of the group is NaN
struct kiln_amax_args {
    float *amax;        // (1), (rows) or (cols), f32
    const void *x;      // act (rows, cols), rows stride apart; f32 with x_f32
    int rows, cols, stride; // stride 0 = cols
    enum kiln_fp8_per per;
    int x_f32; // x is f32 whatever the act dtype (delayed scaling's amax histories): per ROWS only
};

// out = fp8(x * s) with s = kiln_fp8_scale(amax[...]) of the element's group, and/or out_t = the same codes
// of x^T: (cols, rows), dense (what the "TN" layout of FP8 GEMMs needs for the backward's operands). Both in
// one pass over x where both are asked for. Beside the codes, a cast may write:
//   scale_inv  1/s of each group ((1), (rows) or (cols) as per; 1.0f / kiln_fp8_scale in f32): what
//              kiln_fp8_matmul dequantizes by, so that no scale is computed between the cast and the GEMM;
//   amax_seen  (1) per TENSOR only: max(amax_seen, max |x|), a NaN sticking (delayed scaling records the
//              tensor's amax in the pass that casts it by an older one).
struct kiln_fp8_cast_args {
    uint8_t *out;       // (rows, cols), dense, or NULL
    uint8_t *out_t;     // (cols, rows), dense, or NULL (one of the two at least)
    const void *x;      // act (rows, cols), rows stride apart (0 = cols)
    const float *amax;  // (1), (rows) or (cols) as per
    float *scale_inv;   // as amax, or NULL
    float *amax_seen;   // (1), or NULL
    int rows, cols, stride;
    enum kiln_fp8_fmt fmt;
    enum kiln_fp8_per per;
};

// out (M, N) [+]= (a / sa) @ (b / sb)^T [+ bias], times gelu'(gelu_pre) elementwise when set; a (M, K) and
// b (N, K) are FP8 with K contiguous ("TN"), 1/sa and 1/sb their inverse scales as the casts wrote them
// (kiln_fp8_cast_args.scale_inv: one, or one per row of a (M) and of b (N) with rowwise). The product
// accumulates in f32; the dequantization multiplies the sum by 1/sa and 1/sb (f32) after it. out has the
// backend's act dtype, or its grad dtype with out_grad (a weight gradient). With accumulate the result is
// added into out, after the DGELU factor. With pre (the forward's GELU, as matmul_forward's act), pre gets
// the result (bias included) and out its GELU (gelu_forward's): neither accumulate nor gelu_pre then.
struct kiln_fp8_matmul_args {
    void *out;              // act or grad (M, N), rows ldc apart (0 = N)
    void *pre;              // act (M, N) dense, or NULL
    const uint8_t *a, *b;   // (M, K), (N, K)
    enum kiln_fp8_fmt a_fmt, b_fmt;
    const float *a_scale_inv, *b_scale_inv; // (1), or (M) and (N) with a_rowwise, b_rowwise
    int a_rowwise, b_rowwise;
    const void *bias;       // act (N) or NULL
    const void *gelu_pre;   // act (M, N), rows gelu_pre_stride apart (0 = N), or NULL
    int M, N, K;
    int ldc, gelu_pre_stride;
    int out_grad;
    int accumulate;
};

// dbias (N) [+]= the column sums of x (M, N): a linear layer's bias gradient where its GEMM does not give it
struct kiln_bias_back_args {
    void *dbias;        // grad (N): += (= with assign)
    const void *x;      // act (M, N), dense
    int M, N;
    int assign;
};

struct kiln_ops {
    // ---- memory ----
    void *(*alloc)(void *ctx, size_t bytes);    // zero-filled; NULL when out of memory
    void (*free)(void *ctx, void *p);
    void (*zero)(void *ctx, void *p, size_t bytes);
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);      // backend -> backend
    void (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*download)(void *ctx, void *host_dst, const void *src, size_t bytes);
    // host f32 <-> backend tensor of dtype dt (converting), n elements
    void (*upload_f32)(void *ctx, void *dst, enum kiln_dtype dt, const float *host_src, size_t n);
    void (*download_f32)(void *ctx, float *host_dst, const void *src, enum kiln_dtype dt, size_t n);
    void (*synchronize)(void *ctx);

    // ---- model ----
    void (*embed_forward)(void *ctx, const struct kiln_embed_args *a);
    void (*embed_backward)(void *ctx, const struct kiln_embed_back_args *a);
    void (*norm_forward)(void *ctx, const struct kiln_norm_args *a);
    void (*norm_backward)(void *ctx, const struct kiln_norm_back_args *a);
    void (*matmul_forward)(void *ctx, const struct kiln_matmul_args *a);
    void (*matmul_backward)(void *ctx, const struct kiln_matmul_back_args *a);
    void (*attention_forward)(void *ctx, const struct kiln_attn_args *a);
    void (*attention_backward)(void *ctx, const struct kiln_attn_back_args *a);
    void (*attention_decode)(void *ctx, const struct kiln_attn_decode_args *a);
    void (*attention_block_forward)(void *ctx, const struct kiln_attn_block_args *a);
    void (*attention_block_backward)(void *ctx, const struct kiln_attn_block_back_args *a);
    void (*swiglu_forward)(void *ctx, const struct kiln_swiglu_args *a);
    void (*swiglu_backward)(void *ctx, const struct kiln_swiglu_back_args *a);
    void (*gelu_forward)(void *ctx, const struct kiln_gelu_args *a);
    // out[i] = a[i] + b[i] (act, n elements); out may alias a or b
    void (*add)(void *ctx, void *out, const void *a, const void *b, size_t n);
    void (*cross_entropy)(void *ctx, const struct kiln_xent_args *a);
    void (*cross_entropy_parallel)(void *ctx, const struct kiln_xent_par_args *a);

    // ---- optimizer ----
    // Sum of squares of grads (n elements of grad dtype), in fp32/fp64 accumulation; synchronizes.
    // Returns NaN or Inf if any element is non-finite.
    double (*sum_squares)(void *ctx, const void *grads, size_t n);
    // out[i] += x[i] over n f32 elements (ZeRO-2 adds each micro-step's reduced gradients into its shard)
    void (*accumulate_f32)(void *ctx, float *out, const float *x, size_t n);
    void (*adamw)(void *ctx, const struct kiln_adamw_args *a);

    // ---- host memory ----
    // Host memory the backend downloads into fastest (page-locked on CUDA), for checkpoint snapshots that
    // must not hold up training. NULL on failure; the caller may fall back to malloc.
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);

    // The most backend memory held at once so far, in bytes: every allocation, the backend's own scratch and
    // library workspaces included (what a step really needs beyond the model's plan). NULL: not tracked.
    size_t (*mem_peak)(void *ctx);
    // The device memory free now, in bytes (after what libraries such as NCCL took since the backend opened:
    // kiln_backend's mem_free_bytes is the figure at opening). 0: not planned against (the CPU).
    size_t (*mem_free)(void *ctx);

    // ---- events, so that communication can overlap compute ----
    // An event marks a point on the backend's compute stream. NULL on backends whose ops complete before they
    // return (the CPU): there the host order is the order, and nothing needs to be recorded or awaited.
    void *(*event_create)(void *ctx);
    void (*event_destroy)(void *ctx, void *ev);
    void (*event_record)(void *ctx, void *ev);      // marks the compute stream's current end
    void (*event_synchronize)(void *ctx, void *ev); // the host waits until the stream passed ev
    // The compute stream itself (a cudaStream_t on CUDA), for a transport that orders its own stream against it
    // (NCCL); NULL on the CPU.
    void *(*native_stream)(void *ctx);

    // ---- strided copies (sequence parallelism's packing for the all-to-all and the ring) ----
    // rows of width bytes from src (a row every src_pitch bytes) to dst (every dst_pitch bytes), on the compute
    // stream; backend memory on both sides
    void (*copy_2d)(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                    size_t rows);

    // ---- copies beside the compute (activation offload) ----
    // bytes from src to dst (backend or host_alloc memory, either way) on a copy stream of the backend's own,
    // after everything the compute stream was given so far; `done` (an event_create event) is recorded when
    // the copy ends. The CPU copies at once (done NULL).
    void (*copy_async)(void *ctx, void *dst, const void *src, size_t bytes, void *done);
    // the compute stream waits for ev (a copy_async's done) before what it is given next; NULL on the CPU
    void (*stream_wait)(void *ctx, void *ev);

    // ---- copies from a thread beside the compute (the offloaded optimizer's pipeline) ----
    // bytes between host memory and backend memory, either way, on a stream of their own, not ordered after
    // the compute stream's work; returns when the copy is done, with the seconds the copy itself took (on a
    // GPU by events around it on its stream, as bench/cuda/link_bench times the link; on the CPU the host's
    // clock). The caller orders it against the compute.
    double (*copy_side)(void *ctx, void *dst, const void *src, size_t bytes);

    // ---- FP8 (src/precision/fp8.c applies them to the linear layers; the structs above) ----
    void (*amax)(void *ctx, const struct kiln_amax_args *a);
    void (*fp8_cast)(void *ctx, const struct kiln_fp8_cast_args *a);
    void (*fp8_matmul)(void *ctx, const struct kiln_fp8_matmul_args *a);
    void (*bias_backward)(void *ctx, const struct kiln_bias_back_args *a);
    // out (cols, rows) = in (rows, cols)^T, both dense FP8 codes (bytes): the transposed layout of weights
    // gathered as codes (ZeRO-3's FP8 all-gather), which the backward's dinp GEMM reads
    void (*fp8_transpose)(void *ctx, uint8_t *out, const uint8_t *in, int rows, int cols);
};

// ---- a backend: the ops table, its context, and what the model and trainer need to know about it ----
struct kiln_backend {
    const char *name;               // "cpu", "cuda"
    const struct kiln_ops *ops;
    void *ctx;
    enum kiln_dtype act_dtype;      // activations and compute weights
    enum kiln_dtype grad_dtype;     // parameter gradients
    int weights_alias_master;       // 1: compute weights ARE the f32 master params (CPU)
    int device_memory;              // 1: tensors live in device memory (the host cannot read them directly)
    char device_name[128];          // "CPU (2 threads)", "NVIDIA H100 80GB HBM3"
    double peak_flops;              // dense peak for MFU, 0 when unknown
    size_t mem_total_bytes;         // device memory (0 on the CPU: not planned against)
    size_t mem_free_bytes;
    // 1 where the backend's tiled attention kernels take this head size; 0 where it falls back to slower
    // ones (the run still works). NULL: one path for every head size (the CPU).
    int (*attention_fast)(int head_size);
    int fp8_tensor_cores;           // 1: the GPU multiplies FP8 natively (sm_89+); 0: the FP8 ops emulate (the
                                    // CPU) or are absent (NULL)
    void (*close)(struct kiln_backend *b);
};

#endif
