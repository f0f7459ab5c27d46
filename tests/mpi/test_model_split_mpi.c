// The model's seams for tensor parallelism, proved on the CPU under mpirun (ctest: 2, 3 and 4 ranks; label
// mpi): a model split over the ranks (model/config.h's struct kiln_model_split: each rank holds its share of
// the heads, of the MLP's width and, in one case, of the vocabulary), with the linear-layer and vocabulary
// hooks of model/model.h filled in by this file, gives the single-process model's loss and gradients. Nothing
// in src/model/ knows of ranks: this test is the strategy. It is Megatron's tensor parallelism in its plain
// form (no sequence parallelism, no overlap), written against the hooks:
//   column-parallel (qkv, mlp_in, a parallel block's fused input): the input is whole on every rank, each
//     rank computes its output columns; the backward all-reduces the input's gradient;
//   row-parallel (attn_out, mlp_out): each rank multiplies its input columns, the bias on rank 0 only, and
//     the output is all-reduced;
//   vocabulary-parallel (embedding and LM head): each rank holds rows [v0, v0 + Vp/n) of the padded
//   vocabulary;
//     the embedding looks up the tokens it holds and the rows are all-reduced; the loss takes the softmax's
//     max and sum over the ranks, so the whole (rows, Vp) logits never exist on one rank.
// Every rank also builds the whole model with the same seed, and compares: the loss, and each of its
// gradient tensors against the matching rows or columns of the whole model's.
// Prints "N passed, N failed" on rank 0; the exit status is the failures'.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"

static int passed, failed, rank;

static void check(int ok, const char *what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "[rank %d] FAIL: %s\n", rank, what);
    }
}

// ---- the strategy: hooks over the world communicator (the CPU backend's memory is host memory) ------------

struct tp {
    struct kiln_comm *c;
    struct kiln_backend *be;
    struct kiln_model_linear next; // what was installed before (the backend's op here)
    int v0, Vp_local;            // the vocabulary rows this rank holds
    int calls[KILN_LINEARS][2];  // forward and backward calls per kind, to see every layer went through here
};

static int column_parallel(enum kiln_linear k) {
    return k == KILN_LINEAR_QKV || k == KILN_LINEAR_MLP_IN || k == KILN_LINEAR_FUSED_IN;
}

static void all_reduce(struct tp *t, float *x, size_t n) {
    kiln_comm_all_reduce_host(t->c, x, n, KILN_F32, KILN_RED_SUM);
}

static void tp_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    struct tp *t = user;
    t->calls[k][0]++;
    if (column_parallel(k) || k == KILN_LINEAR_HEAD) { // the head: the vocab hook's own local GEMM
        kiln_model_linear_forward_with(&t->next, t->be, l, k, a);
        return;
    }
    // row-parallel: partial sums over this rank's input columns, the bias once, then summed over the ranks
    struct kiln_matmul_args p = *a;
    size_t n = (size_t)a->N * a->OC;
    float *part = calloc(n, sizeof(float));
    p.out = part;
    p.accumulate = 0;
    if (t->c->rank != 0)
        p.bias = NULL;
    kiln_model_linear_forward_with(&t->next, t->be, l, k, &p);
    all_reduce(t, part, n);
    float *out = a->out;
    for (size_t i = 0; i < n; i++)
        out[i] = a->accumulate ? out[i] + part[i] : part[i];
    free(part);
}

static void tp_backward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_back_args *a) {
    struct tp *t = user;
    t->calls[k][1]++;
    if (!column_parallel(k) || !a->dinp) { // row-parallel: the input's gradient is this rank's columns
        kiln_model_linear_backward_with(&t->next, t->be, l, k, a);
        return;
    }
    // column-parallel: this rank's output columns give a partial dL/dinput, summed over the ranks
    KILN_ASSERT(!a->dinp_gelu_pre && !a->dinp_stride);
    struct kiln_matmul_back_args p = *a;
    size_t n = (size_t)a->N * a->IC;
    float *part = calloc(n, sizeof(float));
    p.dinp = part;
    p.dinp_accumulate = 0;
    kiln_model_linear_backward_with(&t->next, t->be, l, k, &p);
    all_reduce(t, part, n);
    float *dinp = a->dinp;
    for (size_t i = 0; i < n; i++)
        dinp[i] = a->dinp_accumulate ? dinp[i] + part[i] : part[i];
    free(part);
}

// x[n] = wte[token n] (on the rank that holds the token's row) + wpe[position] (rank 0), summed over ranks
static void tp_embed_forward(void *user, const struct kiln_embed_args *a) {
    struct tp *t = user;
    KILN_ASSERT(a->pos_split == a->T || a->pos_split == 0); // one run of positions (no sequence parallelism)
    size_t N = (size_t)a->B * a->T;
    float *out = a->out;
    const float *wte = a->wte, *wpe = a->wpe;
    for (size_t n = 0; n < N; n++) {
        int tok = a->tokens_host[n] - t->v0;
        for (int c = 0; c < a->C; c++) {
            float e = tok >= 0 && tok < t->Vp_local ? wte[(size_t)tok * a->C + c] : 0.0f;
            float p = wpe && t->c->rank == 0 ? wpe[(size_t)(n % a->T) * a->C + c] : 0.0f;
            out[n * a->C + c] = e + p;
        }
    }
    all_reduce(t, out, N * a->C);
}

// dwte's rows this rank holds, and dwpe (the same on every rank: dout is whole everywhere)
static void tp_embed_backward(void *user, const struct kiln_embed_back_args *a) {
    struct tp *t = user;
    size_t N = (size_t)a->B * a->T;
    float *dwte = a->dwte, *dwpe = a->dwpe;
    const float *dout = a->dout;
    for (size_t n = 0; n < N; n++) {
        int tok = a->tokens_host[n] - t->v0;
        for (int c = 0; c < a->C; c++) {
            float g = dout[n * a->C + c];
            if (tok >= 0 && tok < t->Vp_local)
                dwte[(size_t)tok * a->C + c] += g;
            if (dwpe)
                dwpe[(size_t)(n % a->T) * a->C + c] += g;
        }
    }
}

// The vocabulary-parallel cross-entropy: each rank's logits are its columns; the max, the sum of
// exponentials and the target's logit are reduced over the ranks per row.
static void tp_head(void *user, const struct kiln_model_head_args *h) {
    struct tp *t = user;
    KILN_ASSERT(h->z_loss == 0.0f);
    struct kiln_matmul_args mf = {
        .out = h->logits, .inp = h->x, .weight = h->weight, .N = h->rows, .IC = h->C, .OC = h->Vp};
    tp_forward(user, -1, KILN_LINEAR_HEAD, &mf);
    float *lg = h->logits;
    int R = h->rows, Vl = h->Vp;
    float *mx = malloc(sizeof(float) * R), *sum = malloc(sizeof(float) * R), *tl = malloc(sizeof(float) * R);
    for (int r = 0; r < R; r++) {
        mx[r] = -INFINITY;
        for (int j = 0; j < Vl; j++)
            if (t->v0 + j < h->V && lg[(size_t)r * Vl + j] > mx[r])
                mx[r] = lg[(size_t)r * Vl + j];
    }
    kiln_comm_all_reduce_host(t->c, mx, (size_t)R, KILN_F32, KILN_RED_MAX);
    for (int r = 0; r < R; r++) {
        sum[r] = 0.0f;
        tl[r] = 0.0f;
        for (int j = 0; j < Vl; j++)
            if (t->v0 + j < h->V)
                sum[r] += expf(lg[(size_t)r * Vl + j] - mx[r]);
        int tg = h->targets[r] - t->v0;
        if (h->targets[r] >= 0 && tg >= 0 && tg < Vl)
            tl[r] = lg[(size_t)r * Vl + tg];
    }
    all_reduce(t, sum, (size_t)R);
    all_reduce(t, tl, (size_t)R);
    for (int r = 0; r < R; r++) {
        h->losses[r] = h->targets[r] >= 0 ? logf(sum[r]) + mx[r] - tl[r] : 0.0f;
        if (h->dloss == 0.0f)
            continue;
        for (int j = 0; j < Vl; j++) { // dlogits = (softmax - onehot) * dloss; padding and ignored rows 0
            float *x = &lg[(size_t)r * Vl + j];
            float p = t->v0 + j < h->V ? expf(*x - mx[r]) / sum[r] : 0.0f;
            *x = h->targets[r] < 0 ? 0.0f : (p - (h->targets[r] == t->v0 + j ? 1.0f : 0.0f)) * h->dloss;
        }
    }
    free(mx);
    free(sum);
    free(tl);
    if (h->dloss == 0.0f)
        return;
    // dx = dlogits @ W over this rank's columns, summed over the ranks; dW: this rank's rows
    struct kiln_matmul_back_args mb = {.dinp = h->dx,
                                       .dweight = h->dweight,
                                       .dout = h->logits,
                                       .inp = h->x,
                                       .weight = h->weight,
                                       .N = R,
                                       .IC = h->C,
                                       .OC = Vl,
                                       .grad_assign = h->grad_assign};
    kiln_model_linear_backward_with(&t->next, t->be, -1, KILN_LINEAR_HEAD, &mb);
    all_reduce(t, h->dx, (size_t)R * h->C);
}

// ---- which element of the whole model a split tensor's element is -------------------------------------

struct shape {
    int n, r; // parts, this rank's
    int NH, NKV, HS, H, Vp, swiglu;
};

// The whole tensor's row for row lr of a split tensor whose rows are cut (c_attn's [q | k | v], c_fc's
// [gate | up] or c_fc, the vocabulary's)
static int64_t whole_row(const struct shape *s, const char *name, int64_t lr) {
    if (strstr(name, "c_attn.")) {
        int nh = s->NH / s->n, nkv = s->NKV >= s->n ? s->NKV / s->n : 1;
        int kv0 = s->NKV >= s->n ? s->r * nkv : s->r * s->NKV / s->n; // the rank's first kv head
        int64_t q = (int64_t)nh * s->HS, k = (int64_t)nkv * s->HS;
        if (lr < q)
            return (int64_t)s->r * q + lr;
        if (lr < q + k)
            return (int64_t)s->NH * s->HS + (int64_t)kv0 * s->HS + (lr - q);
        return (int64_t)(s->NH + s->NKV) * s->HS + (int64_t)kv0 * s->HS + (lr - q - k);
    }
    if (strstr(name, "mlp.c_fc.")) {
        int64_t h = s->H / s->n;
        if (lr < h)
            return (int64_t)s->r * h + lr;
        return s->H + (int64_t)s->r * h + (lr - h); // SwiGLU's up half
    }
    return (int64_t)s->r * (s->Vp / s->n) + lr; // wte, lm_head
}

// Element (lr, lc) of split tensor p, in the whole table (flat index), or -1 where p is not split
static size_t whole_index(const struct shape *s, const struct kiln_param_table *whole,
                          const struct kiln_param *p, int64_t lr, int64_t lc) {
    const struct kiln_param *w = &whole->p[kiln_params_find(whole, p->name)];
    int64_t wr = lr, wc = lc;
    if (p->shape[0] != w->shape[0])
        wr = whole_row(s, p->name, lr);
    if (p->ndim == 2 && p->shape[1] != w->shape[1])
        wc = (int64_t)s->r * p->shape[1] + lc; // c_proj's input columns
    return w->offset + (size_t)(wr * (w->ndim == 2 ? w->shape[1] : 1) + wc);
}

// ---- one case ------------------------------------------------------------------------------------------

static void run_case(struct kiln_comm *c, struct kiln_backend *be, const struct kiln_model_config *m,
                     int split_vocab, const char *what) {
    int n = c->size;
    struct kiln_model_split split = {.heads = n, .kv_heads = n, .hidden = n, .vocab = split_vocab ? n : 1};
    struct kiln_error err = {0};
    if (kiln_model_split_check(m, &split, &err)) {
        fprintf(stderr, "[rank %d] %s: %s\n", rank, what, err.msg);
        check(0, "the case's split is valid");
        return;
    }
    int B = 2, T = 8, N = B * T, L = m->n_layer;
    struct kiln_model_opts ow = {.B = B, .T = T, .recompute = KILN_RECOMPUTE_NONE, .training = 1};
    struct kiln_model_opts os = ow;
    os.split = split;
    struct kiln_model *gw, *gs;
    if (kiln_model_create(&gw, m, be, &ow, &err) || kiln_model_create(&gs, m, be, &os, &err)) {
        fprintf(stderr, "[rank %d] create: %s\n", rank, err.msg);
        check(0, "create");
        return;
    }
    const struct kiln_param_table *pw = kiln_model_params(gw), *ps = kiln_model_params(gs);
    kiln_model_init_params(gw, 1234);
    float *whole = malloc(pw->total * sizeof(float)), *local = calloc(ps->total, sizeof(float));
    kiln_model_get_params(gw, whole);
    // every tensor away from its init (biases start at zero, norms at one), so that each one carries signal
    uint64_t z = 0x2545F4914F6CDD1DULL;
    for (int i = 0; i < pw->n; i++)
        for (size_t j = 0; j < pw->p[i].count; j++) {
            z ^= z >> 12, z ^= z << 25, z ^= z >> 27;
            whole[pw->p[i].offset + j] +=
                0.1f * ((float)((z * 0x2545F4914F6CDD1DULL) >> 40) / 16777216.0f - 0.5f);
        }
    kiln_model_set_params(gw, whole);
    struct shape sh = {.n = n,
                       .r = c->rank,
                       .NH = m->n_head,
                       .NKV = kiln_model_kv_heads(m),
                       .HS = kiln_model_head_size(m),
                       .H = kiln_model_mlp_hidden(m),
                       .Vp = kiln_model_padded_vocab(m),
                       .swiglu = m->mlp_swiglu};
    // this rank's slice of every tensor (the split tables hold the same names at the rank's sizes)
    check(ps->n == pw->n, "the split table has the whole table's tensors");
    for (int i = 0; i < ps->n; i++) {
        const struct kiln_param *p = &ps->p[i];
        int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
        for (int64_t r = 0; r < p->shape[0]; r++)
            for (int64_t k = 0; k < cols; k++)
                local[p->offset + (size_t)(r * cols + k)] = whole[whole_index(&sh, pw, p, r, k)];
    }
    kiln_model_set_params(gs, local);

    struct tp t = {.c = c, .be = be};
    size_t vlo, vhi;
    kiln_comm_slice((size_t)sh.Vp, split_vocab ? n : 1, split_vocab ? c->rank : 0, &vlo, &vhi);
    t.v0 = (int)vlo;
    t.Vp_local = (int)(vhi - vlo);
    struct kiln_model_linear lin = {.user = &t, .forward = tp_forward, .backward = tp_backward};
    kiln_model_set_linear(gs, &lin, &t.next);
    if (split_vocab) {
        struct kiln_model_vocab voc = {.user = &t,
                                     .embed_forward = tp_embed_forward,
                                     .embed_backward = tp_embed_backward,
                                     .head = tp_head};
        kiln_model_set_vocab(gs, &voc, NULL);
    }

    // the same batch on every rank
    int32_t *in = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    uint64_t s = 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        in[i] = (int32_t)((s >> 33) % (uint64_t)m->vocab_size);
        tgt[i] = (int32_t)((s >> 45) % (uint64_t)m->vocab_size);
    }
    tgt[5] = -1;
    float dloss = 1.0f / (float)(N - 1);
    double lw = 0, ls = 0;
    for (int step = 0; step < 2; step++) { // the second micro-step accumulates onto the first's gradients
        if (step == 0) {
            kiln_model_zero_grad(gw);
            kiln_model_zero_grad(gs);
        }
        lw = kiln_model_forward(gw, in, tgt, dloss, 0.0f);
        kiln_model_backward(gw);
        ls = kiln_model_forward(gs, in, tgt, dloss, 0.0f);
        kiln_model_backward(gs);
        char msg[160];
        snprintf(msg, sizeof(msg), "%s: micro-step %d's loss %.7f equals the whole model's %.7f", what, step,
                 ls, lw);
        check(fabs(ls - lw) <= 2e-6 * fabs(lw), msg);
    }
    // Where there are fewer key/value heads than ranks, each rank holds a copy of the one its query heads
    // read, and its gradient has only those query heads' share: the ranks that hold one head sum their
    // copies' gradients (once a step, like data parallelism's reduction), Megatron's rule for replicated
    // tensors.
    if (sh.NKV < n) {
        int kv0 = c->rank * sh.NKV / n;
        struct kiln_comm *group;
        if (kiln_comm_split(c, kv0, c->rank, &group, &err)) {
            fprintf(stderr, "[rank %d] split: %s\n", rank, err.msg);
            check(0, "the key/value head's group");
        } else {
            struct kiln_model_buffers bu; // the CPU's gradients are host memory
            kiln_model_buffers(gs, &bu);
            for (int l = 0; l < L; l++)
                for (int w = KILN_QKV_W; w <= KILN_QKV_B; w++) {
                    int i = ps->layer[l][w];
                    if (i < 0)
                        continue;
                    const struct kiln_param *p = &ps->p[i];
                    int64_t cols = p->ndim == 2 ? p->shape[1] : 1, q = (int64_t)(sh.NH / n) * sh.HS;
                    size_t at = p->offset + (size_t)(q * cols), cnt = (size_t)((p->shape[0] - q) * cols);
                    kiln_comm_all_reduce_host(group, (float *)bu.grads + at, cnt, KILN_F32, KILN_RED_SUM);
                }
            kiln_comm_close(group);
        }
    }
    // every linear layer went through the hooks, forward and backward
    int fused_fwd, fused_bwd;
    kiln_model_fused_projection(gs, &fused_fwd, &fused_bwd);
    check(t.calls[KILN_LINEAR_ATTN_OUT][0] == 2 * L && t.calls[KILN_LINEAR_ATTN_OUT][1] == 2 * L,
          "every attention output projection went through the linear hook");
    check(t.calls[KILN_LINEAR_MLP_OUT][0] == 2 * L && t.calls[KILN_LINEAR_MLP_OUT][1] == 2 * L,
          "every MLP output projection went through the linear hook");
    enum kiln_linear in_fwd = fused_fwd ? KILN_LINEAR_FUSED_IN : KILN_LINEAR_QKV;
    enum kiln_linear in_bwd = fused_bwd ? KILN_LINEAR_FUSED_IN : KILN_LINEAR_QKV;
    check(t.calls[in_fwd][0] == 2 * L && t.calls[in_bwd][1] == 2 * L,
          "every input projection went through the linear hook");
    check(m->parallel_block && fused_bwd ? 1 : t.calls[KILN_LINEAR_MLP_IN][0] == 2 * L,
          "every MLP input projection went through the linear hook");
    check(t.calls[KILN_LINEAR_HEAD][0] >= 2, "the LM head went through the linear hook");

    // gradients: each split tensor's against the whole model's matching rows or columns
    float *gwh = malloc(pw->total * sizeof(float)), *gsp = malloc(ps->total * sizeof(float));
    kiln_model_get_grads(gw, gwh);
    kiln_model_get_grads(gs, gsp);
    for (int i = 0; i < ps->n; i++) {
        const struct kiln_param *p = &ps->p[i];
        int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
        double num = 0, den = 0;
        for (int64_t r = 0; r < p->shape[0]; r++)
            for (int64_t k = 0; k < cols; k++) {
                double a = gsp[p->offset + (size_t)(r * cols + k)], b = gwh[whole_index(&sh, pw, p, r, k)];
                num += (a - b) * (a - b);
                den += b * b;
            }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        char msg[200];
        snprintf(msg, sizeof(msg), "%s: gradient of %s (rel err %.2e) equals the whole model's", what,
                 p->name, rel);
        check(rel <= 1e-5, msg);
    }
    free(gwh);
    free(gsp);
    free(in);
    free(tgt);
    free(whole);
    free(local);
    kiln_model_free(gs);
    kiln_model_free(gw);
}

static void base_config(struct kiln_model_config *m) {
    memset(m, 0, sizeof(*m));
    m->n_layer = 2;
    m->n_head = 12;
    m->n_embd = 48;
    m->block_size = 16;
    m->vocab_size = 11;
    m->vocab_multiple = 12; // Vp 12: 2, 3 and 4 ranks each hold whole rows, one or more past the real vocab
    m->pos = KILN_POS_LEARNED;
    m->rope_theta = 10000.0f;
    m->norm_eps = 1e-5f;
    m->norm_bias = 1;
    m->bias = 1;
}

int main(void) {
    struct kiln_dist_env env;
    struct kiln_error err = {0};
    if (kiln_dist_env_read(&env, NULL, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    rank = env.rank;
    struct kiln_comm *c;
    struct kiln_comm_open_opts o = {.kind = KILN_COMM_MPI, .timeout_s = 30};
    struct kiln_backend be;
    struct kiln_backend_opts bo = {.threads = 1};
    if (kiln_comm_open_world(&env, &o, &c, &err) || kiln_backend_open("cpu", &bo, &be, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    struct kiln_model_config m;
    // GPT-2's block: LayerNorm, GELU, biases, learned positions, tied embeddings; vocabulary split too
    base_config(&m);
    m.tie_embeddings = 1;
    run_case(c, &be, &m, 1, "gpt2 block, split vocabulary");
    run_case(c, &be, &m, 0, "gpt2 block, whole vocabulary");
    // Llama's block: RMSNorm, SwiGLU, RoPE, no biases, untied, grouped key/value heads (2: split at 2 ranks,
    // one per rank copied at 4) or one (MQA: copied on every rank)
    base_config(&m);
    m.norm_rms = 1;
    m.bias = 0;
    m.mlp_swiglu = 1;
    m.mlp_hidden = 96;
    m.pos = KILN_POS_ROPE;
    m.n_kv_head = c->size % 2 == 0 ? 2 : 1;
    run_case(c, &be, &m, 1, "llama block, split vocabulary");
    // PaLM's parallel block (one fused input GEMM) with GELU and biases
    base_config(&m);
    m.parallel_block = 1;
    run_case(c, &be, &m, 0, "parallel block");
    // what cannot be split says so
    base_config(&m);
    m.pos = KILN_POS_ALIBI;
    struct kiln_model_split sp = {.heads = 2, .kv_heads = 2, .hidden = 2};
    check(kiln_model_split_check(&m, &sp, &err) == KILN_ERR_USAGE && strstr(err.msg, "--pos"),
          "ALiBi with split heads is refused naming --pos");
    base_config(&m);
    sp.heads = 5;
    sp.kv_heads = 5;
    check(kiln_model_split_check(&m, &sp, &err) == KILN_ERR_USAGE && strstr(err.msg, "--heads"),
          "heads that the parts do not divide are refused naming --heads");

    double fails = failed;
    kiln_comm_all_reduce_host(c, &fails, 1, KILN_F64, KILN_RED_SUM);
    if (rank == 0)
        printf("%d passed, %.0f failed (over %d ranks)\n", passed, fails, c->size);
    kiln_backend_close(&be);
    kiln_comm_close(c);
    return fails ? 1 : 0;
}
