// The GPT's insides, shared by the files of model/gpt/: layout.c (memory plan and activation layout),
// state.c (creation, buffers, windows), block.c (one block's forward and backward), model.c (the whole
// forward and backward), recompute.c (recompute and activation offload), decode.c (KV-cache decoding).
// Not an interface: model/model.h is.
#ifndef KILN_MODEL_GPT_INTERNAL_H
#define KILN_MODEL_GPT_INTERNAL_H

#include "model/model.h"
#include "util/error.h"

// ----------------------------------------------------------------------------
// activation buffers: one slot per layer, or one (or two) shared slots when recomputed

struct buf {
    void *p;
    size_t elems; // per slot
    int slots;
    size_t elem_bytes;
    int in_arena; // scratch: p points `offset` bytes into the arena instead of to an allocation of its own
    size_t offset;
};

static inline void *buf_at(const struct buf *b, int l) {
    return (char *)b->p + (size_t)(l % b->slots) * b->elems * b->elem_bytes;
}

static inline size_t buf_bytes(const struct buf *b) {
    return b->elems * (size_t)b->slots * b->elem_bytes;
}

struct acts {
    struct buf x;       // act (L+1) x (N, C): residual stream entering each layer; x[L] enters the final norm
    struct buf ln1;     // act (L+1) x (N, C): norm1 outputs; ln1[L] is the final norm's output
    struct buf mean1;   // f32 (L+1) x (N)
    struct buf rstd1;   // f32 (L+1) x (N)
    struct buf pre;     // act L x (N, QKV + FCO): a parallel block's fused projection [qkv | fc_pre], which
                        // then takes the place of qkv and fc_pre (both empty)
    struct buf qkv;     // act L x (N, QKV): the attention's input (q and k normalized with QK-norm)
    struct buf qkv_raw; // act L x (N, QKV): the projection before QK-norm (QK-norm only)
    struct buf meanq, rstdq, meank, rstdk; // f32 L x (N): QK-norm statistics
    struct buf atty;                       // act L x (N, NH*HS)
    struct buf lse;                        // f32 L x (B, NH, T)
    struct buf mid;                        // act L x (N, C): h = x + attn(...) (sequential blocks)
    struct buf ln2;                        // act L x (N, C)
    struct buf mean2;                      // f32 L x (N)
    struct buf rstd2;                      // f32 L x (N)
    struct buf fc_pre;                     // act L x (N, FCO): pre-GELU, or the [gate | up] input of SwiGLU
    struct buf fc_act;                     // act L x (N, H): the MLP's hidden activation
    // scratch, one slot each, in one arena where buffers never live at the same time share memory
    // (scratch_layout says which)
    struct buf ao;   // act (N, C): attention branch output (parallel: both branches)
    struct buf mo;   // act (N, C): MLP branch output
    struct buf dres; // act (N, C): gradient of the residual stream (training only)
    struct buf dln;  // act (N, C): gradient of a norm output (also dlnf from the classifier; training only)
    struct buf dpre; // act (N, QKV + FCO): [dqkv | dfc] of a fused parallel block (then dqkv, dfc empty)
    struct buf dqkv; // act (N, QKV)
    struct buf dqkv_raw; // act (N, QKV): gradient before QK-norm (QK-norm only)
    struct buf datty;    // act (N, NH*HS)
    struct buf dfc;      // act (N, FCO)
    struct buf dhid;     // act (N, H): SwiGLU only, gradient of the hidden activation
    struct buf logits;   // act (rows, Vp): one chunk of the classifier
    // allocations of their own
    struct buf losses;  // f32 (N)
    struct buf tokens;  // i32 (N)
    struct buf targets; // i32 (N)
};
#define N_ACT_BUFS (sizeof(struct acts) / sizeof(struct buf))

struct decode {
    int B, maxT;
    struct buf k, v;                                                       // act L x (B, maxT, NKV*HS)
    struct buf x, ln, pre, qkv, qkv_raw, atty, ao, fc_pre, fc_act, logits; // act, B rows
    struct buf mean, rstd, tokens;
    float *logits_host; // (B, Vp)
};

// When a parallel block's input projections run as one GEMM. Not with --qk-norm (q and k pass through their
// norms into a separate qkv buffer before attention), and not where the 64-element alignment of the parameter
// table put padding between W_qkv and W_fc (or their biases): QKV * C or QKV not a multiple of 64, no real
// shape. With --recompute=mlp the forward keeps the two GEMMs (a fused forward would keep every layer's
// fc_pre, which that mode exists to drop) and only the backward fuses; on CUDA that mode's numbers then
// differ from --recompute=none's by bf16 rounding (on the CPU they do not). opts.no_parallel_fusion turns
// fusion off, so that tests and benchmarks can compare both on one build.
struct fusion {
    int on;  // backward and decoding fuse
    int fwd; // the training and evaluation forward fuses too
};

struct kiln_model {
    struct kiln_model_config cfg;
    struct kiln_model_opts opts;
    struct kiln_backend *be;
    const struct kiln_ops *ops;
    void *ctx;
    struct kiln_param_table pt;
    struct kiln_mem_plan plan;

    void *weights; // act (P) compute weights (NULL with external_weights); the optimizer's master on the CPU
    void *grads;   // grad (P)

    struct fusion fuse;
    struct acts a;
    void *arena;         // the scratch buffers of a point into it
    int classifier_rows; // rows per classifier chunk
    int mlp_rows;        // rows per MLP chunk (mlp_rows_for; N: one chunk)
    // activation offload: the layer inputs x[0 .. L] and, under selective recompute, the attention outputs
    // atty[0 .. L - 1] (recompute.c's struct offl)
    struct offl {
        struct buf *b;    // the device buffer (in a), whose last b->slots entries never leave it
        int n;            // entries
        void *host;       // entries 0 .. n - 1 - b->slots (host_alloc'd with the other), or NULL: none
        void **out, **in; // n events: entry l's copy to the host ended, and back (NULL on the CPU)
    } off_x, off_atty;
    void *host_acts;      // the host memory of both
    int32_t *tokens_host; // (N) last inputs, for the embedding backward
    float *losses_host;
    int has_grad_forward; // the last forward ran the classifier backward
    int grads_fresh;      // set by kiln_model_zero_grad: the next gradient writes assign instead of adding
    int recomputing;      // inside the backward's recompute of a layer (selective skips the attention there)

    struct kiln_model_hooks hooks;         // all NULL with one process
    struct kiln_model_attention attn_impl; // sequence parallelism's attention (NULL functions: the op's)
    struct kiln_model_linear linear;       // the linear layers' hook (NULL functions: the op's)
    struct kiln_model_vocab vocab; // the embedding's and the LM head's (NULL functions: the model's own)
    int pos0, pos_split, pos1;     // kiln_model_set_positions
    const void **wwin;             // (L + 2) where each segment's weights are read: its range of the compute
                                   // copy, or a stand-in that a hook put there (kiln_model_set_weight_window)
    void **gwin;       // (L + 2) where each segment's gradients are written (kiln_model_grad_segments)
    size_t *seg_begin; // (L + 3) each segment's first element, then the table's total

    struct decode dec;
};

// the hooks, when set
#define HOOK(g, name, ...)                                                                                   \
    do {                                                                                                     \
        if ((g)->hooks.name)                                                                                 \
            (g)->hooks.name((g)->hooks.user, __VA_ARGS__);                                                   \
    } while (0)

// derived sizes
// N: the token rows of a step (B x T), which the linear layers, attention and the LM head see; Nr: those of
// them this rank's residual stream holds (N / split.seq: the embedding's output, the norms, the residual adds
// and their gradients), N without a sequence split
struct dims {
    int B, T, N, Nr, C, L, NH, NKV, HS, QKV, AO, H, FCO, Vp, V;
    int qk_norm;
};

// The sizes of a step of B x T tokens, at what this rank holds of a split model (split NULL: whole)
static inline struct dims dims_of(const struct kiln_model_config *m, const struct kiln_model_split *split,
                                  int B, int T) {
    struct kiln_model_local loc;
    kiln_model_local_of(m, split, &loc);
    struct dims d;
    d.B = B;
    d.T = T;
    d.N = B * T;
    d.Nr = d.N / kiln_split_parts(split ? split->seq : 1);
    d.C = m->n_embd;
    d.L = m->n_layer;
    d.NH = loc.NH;
    d.NKV = loc.NKV;
    d.HS = kiln_model_head_size(m);
    d.QKV = (d.NH + 2 * d.NKV) * d.HS;
    d.AO = d.NH * d.HS;
    d.H = loc.H;
    d.FCO = m->mlp_swiglu ? 2 * d.H : d.H;
    d.Vp = loc.Vp;
    d.V = m->vocab_size;
    d.qk_norm = m->qk_norm;
    return d;
}

static inline void *act_at(const struct kiln_model *g, const void *base, size_t elems) {
    return (char *)base + elems * kiln_dtype_bytes(g->be->act_dtype);
}

// the segment of parameter i (kiln_model_grad_segments): 0 before layer 0, 1 + l for layer l, L + 1 after
static inline int segment_of(const struct kiln_model *g, int i) {
    const struct kiln_param *p = &g->pt.p[i];
    return p->layer >= 0 ? 1 + p->layer : p->offset < g->seg_begin[1] ? 0 : g->cfg.n_layer + 1;
}

// the compute copy of parameter i (act dtype), or NULL for an absent tensor (index -1), read through its
// segment's window
static inline const void *W(const struct kiln_model *g, int i) {
    if (i < 0)
        return NULL;
    int s = segment_of(g, i);
    KILN_ASSERT(g->wwin[s]); // external weights: the window must have been set
    return act_at(g, g->wwin[s], g->pt.p[i].offset - g->seg_begin[s]);
}

// the gradient of parameter i (grad dtype), or NULL, through its segment's window
static inline void *G(const struct kiln_model *g, int i) {
    if (i < 0)
        return NULL;
    int s = segment_of(g, i);
    KILN_ASSERT(g->gwin[s]); // external gradients: the window must have been set
    return (char *)g->gwin[s] + (g->pt.p[i].offset - g->seg_begin[s]) * kiln_dtype_bytes(g->be->grad_dtype);
}

// Which linear layer weight i is (model/model.h's enum kiln_linear) and of which layer: the LM head for a
// tensor outside the layers, a parallel block's fused [qkv | fc] where the GEMM is wider than W_qkv.
static inline enum kiln_linear linear_of(const struct kiln_model *g, int wi, int OC, int *l) {
    const struct kiln_param *p = &g->pt.p[wi];
    *l = p->layer;
    if (p->layer < 0)
        return KILN_LINEAR_HEAD;
    const int *ix = g->pt.layer[p->layer];
    if (wi == ix[KILN_QKV_W])
        return OC > p->shape[0] ? KILN_LINEAR_FUSED_IN : KILN_LINEAR_QKV;
    if (wi == ix[KILN_ATTNO_W])
        return KILN_LINEAR_ATTN_OUT;
    if (wi == ix[KILN_FC_W])
        return KILN_LINEAR_MLP_IN;
    KILN_ASSERT(wi == ix[KILN_MLPO_W]);
    return KILN_LINEAR_MLP_OUT;
}

// ---- the family's entry points (family.c's row)
void gpt_params_build(struct kiln_param_table *t, const struct kiln_model_config *m,
                      const struct kiln_model_split *split);
void gpt_params_init_tensor(const struct kiln_param_table *t, const struct kiln_model_config *m, int i, float *x,
                            uint64_t seed);
void gpt_linear_groups(const struct kiln_model_config *m, const struct kiln_param_table *t, int *group);
void gpt_split_runs(const struct kiln_model_config *m, const struct kiln_model_split *s, int r,
                    const struct kiln_param_table *local, int i,
                    void (*f)(void *user, size_t local_at, size_t whole_at, size_t n), void *user);
void gpt_params_init(const struct kiln_param_table *t, const struct kiln_model_config *m, float *params,
                     uint64_t seed);
void gpt_plan(const struct kiln_model_config *m, const struct kiln_model_opts *o, enum kiln_dtype act,
              enum kiln_dtype grad, int weights_alias_master, struct kiln_mem_plan *plan);
double gpt_forward(struct kiln_model *g, const int32_t *inputs, const int32_t *targets, float dloss,
                   float z_loss);
void gpt_backward(struct kiln_model *g);
int gpt_decode_begin(struct kiln_model *g, int B, int maxT, struct kiln_error *err);
void gpt_decode_step(struct kiln_model *g, const int32_t *tokens, int pos, float *logits);

// ---- shared between the files of model/gpt/
// a linear layer's forward and backward, through the linear hook when one is set
void gpt_linear_fwd(struct kiln_model *g, int wi, const struct kiln_matmul_args *a);
void gpt_linear_bwd(struct kiln_model *g, int wi, const struct kiln_matmul_back_args *a);
void gpt_offl_init(struct kiln_model *g, struct offl *o, struct buf *b, int n, char **host);
void gpt_offl_free(struct kiln_model *g, struct offl *o);
int gpt_offl_has(const struct offl *o, int l);
void gpt_offl_copy(struct kiln_model *g, const struct offl *o, int l, int to_host);
void gpt_offl_wait(struct kiln_model *g, const struct offl *o, int l, int to_host);
void gpt_offl_claim(struct kiln_model *g, const struct offl *o, int e);
void gpt_recompute_layer(struct kiln_model *g, const struct dims *d, int l);
int gpt_mlp_rows_for(const struct dims *d, const struct kiln_model_opts *o, size_t act_bytes);
struct fusion gpt_fusion_of(const struct kiln_model_config *m, const struct kiln_param_table *pt,
                            const struct kiln_model_opts *o, size_t act_bytes);
int gpt_recomputes_blocks(enum kiln_recompute r);
size_t gpt_acts_layout(struct acts *a, int *rows, const struct dims *d, const struct kiln_model_opts *o,
                       const struct fusion *fu, size_t ab);
void gpt_mlp_activation(struct kiln_model *g, const struct dims *d, const void *fc_pre, int stride,
                        void *fc_act, int N);
void gpt_layer_forward(struct kiln_model *g, const struct dims *d, int l, int tail);
void gpt_norm_bwd(struct kiln_model *g, void *dres, const void *dout, const void *inp, const float *mean,
                  const float *rstd, int wi, int bi, int N, int dinp_assign, int rb0, int rb1);
void gpt_proj_biases(const struct kiln_model *g, int l, int *rb0, int *rb1);
void gpt_mlp_bwd(struct kiln_model *g, const struct dims *d, int l, const void *inp, const void *dout,
                 void *dinp, int dinp_accumulate);
void gpt_attn_bwd(struct kiln_model *g, const struct dims *d, int l, const void *dout, void *dinp,
                  int dinp_accumulate);
void gpt_parallel_fused_bwd(struct kiln_model *g, const struct dims *d, int l, const void *dout, void *dinp);

int gpt_alloc(struct kiln_model *g, void **p, size_t bytes, struct kiln_error *err);
void gpt_free_buf(struct kiln_model *g, struct buf *b);
void gpt_norm_fwd(struct kiln_model *g, void *out, float *mean, float *rstd, void *res_out, const void *inp,
                  const void *res_in, int wi, int bi, int N);
void gpt_matmul_fwd(struct kiln_model *g, void *out, void *pre, const void *inp, int wi, int bi, int N,
                    int IC, int OC, enum kiln_act act, int accumulate);
void gpt_qk_norm_forward(struct kiln_model *g, const struct dims *d, int l, void *qkv, const void *raw, int N,
                         float *meanq, float *rstdq, float *meank, float *rstdk);
// out NULL (both): the MLP's hidden activations without its output projection, for the backward's recompute
void gpt_mlp_act_fwd(struct kiln_model *g, const struct dims *d, int l, const void *fc_pre, int stride,
                     void *fc_act, void *out, int accumulate, int N);
void gpt_mlp_fwd(struct kiln_model *g, const struct dims *d, int l, const void *inp, void *fc_pre,
                 void *fc_act, void *out, int accumulate, int N);
int gpt_head_index(const struct kiln_model *g);

#endif
