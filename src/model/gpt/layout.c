// The GPT's memory: which activations a step keeps (one slot per layer, or shared slots under
// recompute), the scratch arena where one-slot buffers share memory by lifetime, the row chunks of the LM
// head and of a recomputed MLP, and the memory plan that kiln info and the out-of-memory error quote.
#include "model/gpt/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// ----------------------------------------------------------------------------
// activation buffers: one slot per layer, or one (or two) shared slots when recomputed

// Rows per classifier chunk, given the bytes of scratch that the logits chunk overlaps for free. The full
// (N, Vp) logits are the largest activation of a small model (PyTorch keeps them whole, in f32: 6.6 GB for
// GPT-2 124M at B=32, T=1024), so the head runs in row chunks: as large as that free region, but at least
// 768 MiB (each chunk re-reads and re-writes the head's gradient: on the H100 7 chunks of 235 MiB cost GPT-2
// 350M 0.84 ms per step more than 2 of 1 GiB), at most 1 GiB, and never under 64 rows. Then the rows are
// spread evenly over the chunks that takes, so the last chunk is no sliver and the buffer no larger than it
// needs. opts.classifier_rows sets the rows outright (tests: several chunks at tiny shapes; benchmarks:
// what a chunk costs).
static int classifier_rows_for(const struct dims *d, size_t act_bytes, size_t free_bytes, int set) {
    if (set > 0)
        return set < d->Nr ? set : d->Nr;
    // a sequence split's chunk is of this part's rows, and its logits of every part's (seq x rows)
    size_t row_bytes = (size_t)d->Vp * act_bytes * (size_t)(d->N / d->Nr), N = (size_t)d->Nr,
           rows = free_bytes / row_bytes;
    size_t lo = ((size_t)768 << 20) / row_bytes, hi = ((size_t)1 << 30) / row_bytes;
    rows = rows < lo ? lo : rows > hi ? hi : rows;
    rows = rows < 64 ? 64 : rows;
    size_t chunks = (N + rows - 1) / rows;
    return (int)((N + chunks - 1) / chunks);
}

// Rows per MLP chunk. Where the backward recomputes the MLP anyway (--recompute=block or mlp, training), the
// MLP runs over the tokens in chunks, forward and backward, so that its hidden activations (N x 4C, the
// largest per-layer buffers at long T: 8 GiB at the 1.3B shape and 512k tokens) and their gradients exist
// for one chunk at a time: chunks of at most 1 GiB of hidden activations, spread evenly. Every token's
// result is the same; the weight gradients are summed chunk by chunk. N (one chunk) otherwise.
int gpt_mlp_rows_for(const struct dims *d, const struct kiln_model_opts *o, size_t act_bytes) {
    int recomputed =
        o->training && (o->recompute == KILN_RECOMPUTE_BLOCK || o->recompute == KILN_RECOMPUTE_MLP ||
                        o->recompute == KILN_RECOMPUTE_SELECTIVE);
    if (!recomputed || o->mlp_rows < 0 || d->Nr < d->N) // (a sequence split's MLP input is gathered whole)
        return d->N;
    if (o->mlp_rows > 0)
        return o->mlp_rows < d->N ? o->mlp_rows : d->N;
    size_t bytes = (size_t)d->N * d->FCO * act_bytes, chunks = (bytes + ((size_t)1 << 30) - 1) >> 30;
    chunks = chunks ? chunks : 1;
    return (int)(((size_t)d->N + chunks - 1) / chunks);
}

static int adjacent(const struct kiln_param_table *pt, int first, int second) {
    return first < 0 || (second >= 0 && pt->p[first].offset + pt->p[first].count == pt->p[second].offset);
}

struct fusion gpt_fusion_of(const struct kiln_model_config *m, const struct kiln_param_table *pt,
                            const struct kiln_model_opts *o, size_t act_bytes) {
    struct fusion f = {0, 0};
    // a chunked MLP runs its own input projection chunk by chunk, apart from attention's
    struct dims d = dims_of(m, &o->split, o->B, o->T);
    if (!m->parallel_block || m->qk_norm || o->no_parallel_fusion || gpt_mlp_rows_for(&d, o, act_bytes) < d.N)
        return f;
    for (int l = 0; l < m->n_layer; l++) {
        const int *ix = pt->layer[l];
        if (!adjacent(pt, ix[KILN_QKV_W], ix[KILN_FC_W]) || !adjacent(pt, ix[KILN_QKV_B], ix[KILN_FC_B]))
            return f;
    }
    f.on = 1;
    f.fwd = !(o->training && o->recompute == KILN_RECOMPUTE_MLP);
    return f;
}

// ----------------------------------------------------------------------------
// the scratch arena
//
// The one-slot scratch buffers share one allocation. Which of them are live at once (one stream: the order
// of the code is the order on the device):
//   forward, each layer    ao, then mo: a sequential block's ln2 consumes ao before its MLP writes mo, and a
//                          parallel block accumulates both branches in ao. So ao and mo share.
//   classifier             the logits chunk, and dln = dL/dlnf, filled chunk by chunk and read by backward's
//                          first op.
//   backward               dres, from the final norm's backward to the embedding's. Per layer, with dres:
//     recompute            ao, mo (block, mlp): nothing else of the scratch is live yet.
//     MLP                  dhid -> dfc -> dln, each read to write the next (dhid with dfc, dfc with dln).
//     attention            datty -> dqkv -> dqkv_raw -> dln likewise; in a parallel block dln is live
//                          throughout, as attention's input gradient adds to the MLP's.
//     fused parallel       dhid -> dpre's MLP slice, datty -> dpre's attention slice, dpre -> dln.
//     norms                dln -> dres.
// Hence the layout: [dln | dres | one layer: ao and mo, or its backward scratch], with the logits chunk over
// dres and the layer region (dead during the classifier: the layers are done and backward has not begun).
// Without training there is no backward: [ao and mo], with the logits chunk over them.
// opts.scratch_apart gives every buffer a range of its own (tests compare both; the chunk rows stay).

#define ARENA_ALIGN 256 // bytes: every buffer in the arena starts aligned for vector loads and cuBLASLt

static size_t align_up(size_t n) {
    return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

// puts b at offset; returns the offset after it
static size_t place(struct buf *b, size_t offset) {
    b->in_arena = 1;
    b->offset = offset;
    return offset + align_up(buf_bytes(b));
}

static size_t max_size(size_t a, size_t b) {
    return a > b ? a : b;
}

// Places the scratch buffers but the logits chunk (all sized); returns the arena's end so far and, in
// *logits_at, where the logits chunk goes: it may take the rest for free.
static size_t scratch_layout(struct acts *a, int training, int fused, size_t *logits_at) {
    size_t after_dln = training ? place(&a->dln, 0) : 0;
    size_t layer = training ? place(&a->dres, after_dln) : 0;
    size_t end = max_size(place(&a->ao, layer), place(&a->mo, layer));
    if (training && fused) {
        size_t after = place(&a->dpre, layer);        // [dqkv | dfc]
        end = max_size(end, place(&a->dhid, after));  // read to write dpre's MLP slice
        end = max_size(end, place(&a->datty, after)); // then read to write its attention slice
    } else if (training) {
        end = max_size(end, place(&a->dhid, place(&a->dfc, layer))); // the MLP
        size_t after = place(&a->dqkv, layer);                       // then the attention
        end = max_size(end, place(&a->datty, after));
        end = max_size(end, place(&a->dqkv_raw, after)); // written once datty is read
    }
    *logits_at = after_dln;
    return end;
}

// every scratch buffer in a range of its own (opts.scratch_apart); returns the arena's bytes
static size_t scratch_apart(struct acts *a) {
    struct buf *bufs = (struct buf *)a;
    size_t end = 0;
    for (size_t i = 0; i < N_ACT_BUFS; i++)
        if (bufs[i].in_arena)
            end = place(&bufs[i], end);
    return end;
}

// Activation offload (training with --recompute=block, which keeps only each layer's input x[l] and its
// norm's statistics): x[l] goes to pinned host memory once layer l's forward has read it, and comes back
// during the backward of layer l + 1, on the backend's copy stream beside the compute. The device keeps a
// ring of X_RING inputs: in the forward, layer l writes x[l + 1] over x[l + 1 - X_RING], whose copy out has
// had a layer's compute to finish; the last X_RING inputs stay for the backward, which brings each earlier
// one back a layer ahead of its use. --recompute=selective also keeps each layer's attention output atty[l];
// with offload it takes the same road, in a ring of X_RING of its own (its lse, N x heads f32, stays).
#define X_RING 3

// --recompute=block and selective keep only each layer's input (and, selective, its attention's output)
int gpt_recomputes_blocks(enum kiln_recompute r) {
    return r == KILN_RECOMPUTE_BLOCK || r == KILN_RECOMPUTE_SELECTIVE;
}

static int offloads_acts(const struct kiln_model_opts *o) {
    return o->training && o->offload_activations && gpt_recomputes_blocks(o->recompute);
}

// the device's slots for the residual stream's layer inputs x[0..L] in training
static int x_slots(const struct dims *d, const struct kiln_model_opts *o) {
    return offloads_acts(o) && d->L + 1 > X_RING ? X_RING : d->L + 1;
}

// An offloaded buffer of n entries (struct offl): its host part from *host on, and its events.
size_t gpt_acts_layout(struct acts *a, int *rows, const struct dims *d, const struct kiln_model_opts *o,
                       const struct fusion *fu, size_t ab) {
    memset(a, 0, sizeof(*a));
    int L = d->L, training = o->training;
    enum kiln_recompute rc = o->recompute;
    int per_layer = gpt_recomputes_blocks(rc) ? 1 : L;
    int mlp_slots = rc == KILN_RECOMPUTE_NONE ? L : 1;                             // fc_act
    int pre_slots = rc == KILN_RECOMPUTE_NONE || rc == KILN_RECOMPUTE_ACT ? L : 1; // fc_pre
    if (!training)
        per_layer = mlp_slots = pre_slots = 1;
    // selective keeps atty and lse a layer; with offload, atty's older layers wait on the host
    int lse_slots = training && rc == KILN_RECOMPUTE_SELECTIVE ? L : per_layer;
    int attn_slots = lse_slots == L && training && offloads_acts(o) && L > X_RING ? X_RING : lse_slots;
    size_t N = (size_t)d->N, Nr = (size_t)d->Nr, f = sizeof(float), i = sizeof(int32_t);
    size_t mrows = (size_t)gpt_mlp_rows_for(d, o, ab); // the MLP's buffers hold one chunk
    // a fused forward keeps [qkv | fc_pre] in pre (pre_slots == per_layer then); a fused backward has dpre
    size_t qkv = N * d->QKV, fc = mrows * d->FCO, pre = fu->fwd ? qkv + N * d->FCO : 0,
           dpre = fu->on ? qkv + N * d->FCO : 0;
#define SET(b, n, s, eb) (a->b = (struct buf){.elems = (n), .slots = (s), .elem_bytes = (eb)})
    SET(x, Nr * d->C, training ? x_slots(d, o) : 2, ab);
    SET(ln1, Nr * d->C, (gpt_recomputes_blocks(rc) || !training) ? 2 : L + 1, ab);
    SET(mean1, Nr, L + 1, f);
    SET(rstd1, Nr, L + 1, f);
    SET(pre, pre, per_layer, ab);
    SET(qkv, pre ? 0 : qkv, per_layer, ab);
    size_t qk = d->qk_norm ? 1 : 0; // QK-norm's buffers are empty without it
    SET(qkv_raw, qk * N * d->QKV, per_layer, ab);
    SET(meanq, qk * N, per_layer, f);
    SET(rstdq, qk * N, per_layer, f);
    SET(meank, qk * N, per_layer, f);
    SET(rstdk, qk * N, per_layer, f);
    SET(atty, N * d->AO, attn_slots, ab);
    SET(lse, N * d->NH, lse_slots, f);
    SET(mid, Nr * d->C, per_layer, ab);
    SET(ln2, Nr * d->C, per_layer, ab);
    SET(mean2, Nr, per_layer, f);
    SET(rstd2, Nr, per_layer, f);
    SET(fc_pre, pre ? 0 : fc, pre_slots, ab);
    SET(fc_act, mrows * d->H, mlp_slots, ab);
    SET(ao, Nr * d->C, 1, ab);
    SET(mo, Nr * d->C, 1, ab);
    SET(losses, N, 1, f);
    SET(tokens, N, 1, i);
    SET(targets, N, 1, i);
    if (training) {
        SET(dln, Nr * d->C, 1, ab);
        SET(dres, Nr * d->C, 1, ab);
        SET(dpre, dpre, 1, ab);
        SET(dqkv, dpre ? 0 : qkv, 1, ab);
        SET(dqkv_raw, qk * N * d->QKV, 1, ab);
        SET(datty, N * d->AO, 1, ab);
        SET(dfc, dpre ? 0 : fc, 1, ab);
        if (d->FCO != d->H)
            SET(dhid, mrows * d->H, 1, ab);
    }
    size_t logits_at, end = scratch_layout(a, training, fu->on, &logits_at);
    *rows = classifier_rows_for(d, ab, end - logits_at, o->classifier_rows);
    SET(logits, (size_t)*rows * (N / Nr) * d->Vp, 1, ab);
#undef SET
    end = max_size(end, place(&a->logits, logits_at));
    return o->scratch_apart ? scratch_apart(a) : end;
}

void gpt_plan(const struct kiln_model_config *m, const struct kiln_model_opts *o, enum kiln_dtype act,
              enum kiln_dtype grad, int weights_alias_master, struct kiln_mem_plan *plan) {
    struct kiln_param_table pt;
    gpt_params_build(&pt, m, &o->split);
    struct dims d = dims_of(m, &o->split, o->B, o->T);
    size_t ab = kiln_dtype_bytes(act);
    struct fusion fu = gpt_fusion_of(m, &pt, o, kiln_dtype_bytes(act));
    struct acts a;
    memset(plan, 0, sizeof(*plan));
    plan->scratch_bytes = gpt_acts_layout(&a, &plan->classifier_rows, &d, o, &fu, ab);
    // the compute weights (none where a strategy holds them); on backends where they are the f32 master
    // weights (the CPU) they count as those, as the optimizer uses them so (optim/state.h)
    size_t held = o->external_weights ? 0 : pt.total;
    plan->params_bytes = weights_alias_master ? held * sizeof(float) : 0;
    plan->weights_bytes = weights_alias_master ? 0 : held * ab;
    if (o->training)
        plan->grads_bytes = o->external_grads ? 0 : pt.total * kiln_dtype_bytes(grad);
    plan->acts_bytes = plan->scratch_bytes;
    if (o->training && a.x.slots < d.L + 1) // x[0 .. L - slots] live on the host
        plan->host_bytes = (size_t)(d.L + 1 - a.x.slots) * a.x.elems * ab;
    // and, selective, atty[0 .. L - 1 - slots]
    if (o->training && o->recompute == KILN_RECOMPUTE_SELECTIVE && a.atty.slots < d.L)
        plan->host_bytes += (size_t)(d.L - a.atty.slots) * a.atty.elems * ab;
    struct buf *bufs = (struct buf *)&a;
    for (size_t i = 0; i < N_ACT_BUFS; i++)
        if (!bufs[i].in_arena)
            plan->acts_bytes += buf_bytes(&bufs[i]);
    plan->total_bytes =
        plan->params_bytes + plan->weights_bytes + plan->grads_bytes + plan->optim_bytes + plan->acts_bytes;
    kiln_params_free(&pt);
}
