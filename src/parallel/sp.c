// Sequence parallelism: Ulysses, ring attention and both (sp.h says how the tokens are laid out).
#include "parallel/sp.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/comm/comm.h"
#include "model/model.h"
#include "core/ops.h"

// ---- the layout ------------------------------------------------------------------------------------

int kiln_sp_plan(struct kiln_sp_opts o, int world, int rank, int local_world, struct kiln_sp_layout *out,
                 struct kiln_error *err) {
    const struct kiln_model_config *m = o.model;
    struct kiln_sp_layout lo = {.sp = o.sp > 0 ? o.sp : 1};
    int T = o.T;
    static const char *const modes[] = {"ulysses", "ring", "hybrid", "auto"};
    const char *mode = modes[o.mode];
    enum kiln_sp_mode sm = o.mode;
    int group = o.ulysses ? o.ulysses : local_world; // hybrid's Ulysses ranks
    if (sm == KILN_SP_AUTO && lo.sp > 1 && !o.ulysses) {
        // the largest Ulysses group that divides sp and the heads (and KV heads) and fits a node's ranks
        // (its all-to-alls stay on the node's links); a ring across the groups, or none when one group is sp
        group = 1;
        for (int d = 2; d <= lo.sp && d <= local_world; d++)
            if (lo.sp % d == 0 && m->n_head % d == 0 && kiln_model_kv_heads(m) % d == 0)
                group = d;
        sm = group == lo.sp ? KILN_SP_ULYSSES : group == 1 ? KILN_SP_RING : KILN_SP_HYBRID;
    }
    if (sm == KILN_SP_HYBRID && lo.sp > 1 && !o.ulysses && (group >= lo.sp || lo.sp % group)) {
        // hybrid without --sp-ulysses, where the ranks per node are no group of it (one node holds the whole
        // SP group): the largest Ulysses group below sp that divides it and the heads, a ring across them
        group = 1;
        for (int d = 2; d < lo.sp && d <= local_world; d++)
            if (lo.sp % d == 0 && m->n_head % d == 0 && kiln_model_kv_heads(m) % d == 0)
                group = d;
    }
    if (world % lo.sp)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "sp %d with %d rank%s (--sp): the world must be sp x data-parallel ranks; use an --sp "
            "that divides %d",
            lo.sp, world, world == 1 ? "" : "s", world);
    if (o.ulysses && sm != KILN_SP_HYBRID)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "sp-ulysses %d with sp-mode %s (--sp-ulysses): the Ulysses group size is for "
                           "--sp-mode=hybrid; leave it out",
                           o.ulysses, mode);
    if (lo.sp == 1) { // no sequence parallelism, whatever the mode
        lo.ulysses = 1;
    } else if (sm == KILN_SP_ULYSSES) {
        lo.ulysses = lo.sp;
    } else if (sm == KILN_SP_RING) {
        lo.ulysses = 1;
    } else {
        lo.ulysses = group;
        if (lo.ulysses < 1 || lo.sp % lo.ulysses || lo.ulysses == lo.sp)
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "sp-mode hybrid with sp %d and %d Ulysses ranks (--sp-ulysses%s): hybrid needs "
                "Ulysses groups that divide sp into a ring of 2 or more; pass --sp-ulysses=U "
                "with U dividing %d and below it",
                lo.sp, lo.ulysses, o.ulysses ? "" : ", default the ranks per node", lo.sp);
    }
    lo.ring = lo.sp / lo.ulysses;
    if (m->n_head % lo.ulysses || kiln_model_kv_heads(m) % lo.ulysses)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%d heads and %d KV heads over %d Ulysses ranks (--sp=%d, --sp-mode=%s): each rank "
            "takes whole heads, so both must divide by %d; use --sp-mode=ring, or another --sp",
            m->n_head, kiln_model_kv_heads(m), lo.ulysses, lo.sp, mode, lo.ulysses);
    int parts = lo.ring > 1 ? 2 * lo.ring : 1; // zigzag: 2 chunks per ring slot
    if (T % parts || (T / parts * (parts > 1 ? 2 : 1)) % lo.ulysses)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "seq %d over sp %d (--seq, --sp-mode=%s): %s; use a --seq that divides by %d", T,
                           lo.sp, mode,
                           lo.ring > 1 ? "the ring's zigzag cuts the sequence into 2 x ring chunks, each "
                                         "slot's two chunks split among its Ulysses ranks"
                                       : "every rank takes T / sp tokens",
                           lo.ring > 1 ? 2 * lo.sp : lo.sp);
    lo.T = T;
    lo.T_local = T / lo.sp;
    lo.sp_rank = rank % lo.sp;
    lo.uly_rank = lo.sp_rank % lo.ulysses;
    lo.ring_rank = lo.sp_rank / lo.ulysses;
    lo.dp = world / lo.sp;
    lo.dp_rank = rank / lo.sp;
    lo.chunk = lo.ring > 1 ? T / (2 * lo.ring) : T;
    // this rank's run of the slot's concatenated chunks, and where it lies in the sequence
    int at = lo.uly_rank * lo.T_local, C = lo.chunk;
    int lo_pos = lo.ring_rank * C, hi_pos = (2 * lo.ring - 1 - lo.ring_rank) * C;
    if (lo.ring == 1 || at + lo.T_local <= C) {
        lo.pos0 = (lo.ring == 1 ? 0 : lo_pos) + at, lo.split = lo.T_local, lo.pos1 = 0;
    } else if (at >= C) {
        lo.pos0 = hi_pos + at - C, lo.split = lo.T_local, lo.pos1 = 0;
    } else {
        lo.pos0 = lo_pos + at, lo.split = C - at, lo.pos1 = hi_pos;
    }
    *out = lo;
    return 0;
}

void kiln_sp_slice(const struct kiln_sp_layout *lo, const int32_t *full, int B, int32_t *local) {
    for (int b = 0; b < B; b++) {
        const int32_t *row = full + (size_t)b * lo->T;
        int32_t *dst = local + (size_t)b * lo->T_local;
        memcpy(dst, row + lo->pos0, (size_t)lo->split * sizeof(int32_t));
        memcpy(dst + lo->split, row + lo->pos1, (size_t)(lo->T_local - lo->split) * sizeof(int32_t));
    }
}

// ---- the attention -----------------------------------------------------------------------------------

enum sp_qkv { SP_QKV_OWN, SP_QKV_MODEL, SP_QKV_STAGING };

struct kiln_sp {
    struct kiln_sp_layout lo;
    struct kiln_comm *uly, *ring; // NULL where that dimension is 1
    struct kiln_backend *be;
    const struct kiln_ops *ops;
    void *ctx;
    size_t es; // bytes per act element
    enum kiln_dtype act;
    int B, NH, NKV, HS, nh, nkv; // nh, nkv: the heads of one Ulysses rank
    enum kiln_pos pos;
    float theta;
    int S;                                 // the slot's tokens: T_local x ulysses
    int wl, oh, kvw;                       // row widths: head-sharded qkv, head-sharded out, a k|v block
    void *qkv_h, *out_h, *dout_h, *dqkv_h; // the slot, head-sharded, (B, S, width)
    enum sp_qkv qkv_mode;                  // where qkv_h and dqkv_h live (sp_qkv_mode)
    void *send, *recv;                     // all-to-all staging
    void *kv[2], *dkv[2];                  // ring: k|v blocks in hand and in flight, and their gradients
    void *ev;                              // a compute-stream event (NULL on the CPU)
};

static char *at(const struct kiln_sp *s, const void *base, size_t elems) {
    return (char *)base + elems * s->es;
}

static void copy_rows(struct kiln_sp *s, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                      size_t width, size_t rows) {
    s->ops->copy_2d(s->ctx, dst, dst_pitch * s->es, src, src_pitch * s->es, width * s->es, rows);
}

static void *after_compute(struct kiln_sp *s) {
    if (s->ev)
        s->ops->event_record(s->ctx, s->ev);
    return s->ev;
}

static void all_to_all(struct kiln_sp *s, size_t count) {
    struct kiln_coll k = {.op = KILN_COLL_ALL_TO_ALL,
                          .send = s->send,
                          .recv = s->recv,
                          .count = count,
                          .dtype = s->act,
                          .device = s->be->device_memory};
    kiln_comm_wait_stream(s->uly, kiln_comm_submit(s->uly, &k, after_compute(s)));
}

// one step around the ring: send goes to the next slot, recv comes from the previous one
static struct kiln_comm_work *ring_pass(struct kiln_sp *s, const void *send, void *recv) {
    int r = s->lo.ring, me = s->lo.ring_rank;
    struct kiln_coll k = {.op = KILN_COLL_SEND_RECV,
                          .send = send,
                          .recv = recv,
                          .count = (size_t)s->B * s->S * s->kvw,
                          .dtype = s->act,
                          .peer = (me + 1) % r,
                          .src = (me + r - 1) % r,
                          .device = s->be->device_memory};
    return kiln_comm_submit(s->ring, &k, after_compute(s));
}

// Between the all-to-all's u blocks (B, T_local rows of w each) and the slot's rows (B, S, w): block j is
// the slot's run j, peer j's tokens.
static void blocks_slot(struct kiln_sp *s, void *blocks, void *slot, size_t w, int to_slot) {
    size_t Tl = (size_t)s->lo.T_local, blk = (size_t)s->B * Tl * w;
    for (int j = 0; j < s->lo.ulysses; j++) {
        char *b = at(s, blocks, j * blk), *r = at(s, slot, j * Tl * w);
        if (to_slot)
            copy_rows(s, r, s->S * w, b, Tl * w, Tl * w, s->B);
        else
            copy_rows(s, b, Tl * w, r, s->S * w, Tl * w, s->B);
    }
}

// Peer j's heads of q, k and v, between the model's rows (stride rs) and rows of a packed block (wl wide).
static void peer_heads(struct kiln_sp *s, int j, void *rows, int rs, void *packed, int to_packed) {
    size_t HS = s->HS, n = (size_t)s->B * s->lo.T_local;
    size_t row_at[3] = {j * s->nh * HS, (s->NH + j * s->nkv) * HS, (s->NH + s->NKV + j * s->nkv) * HS};
    size_t pk_at[3] = {0, s->nh * HS, (s->nh + s->nkv) * HS}, w[3] = {s->nh * HS, s->nkv * HS, s->nkv * HS};
    for (int g = 0; g < 3; g++) {
        char *r = at(s, rows, row_at[g]), *p = at(s, packed, pk_at[g]);
        if (to_packed)
            copy_rows(s, p, s->wl, r, rs, w[g], n);
        else
            copy_rows(s, r, rs, p, s->wl, w[g], n);
    }
}

// Peer j's heads of an attention output, between the model's (B, T_local, NH*HS) and a packed block (oh
// wide).
static void peer_out(struct kiln_sp *s, int j, void *rows, void *packed, int to_packed) {
    size_t n = (size_t)s->B * s->lo.T_local, NHHS = (size_t)s->NH * s->HS;
    char *r = at(s, rows, (size_t)j * s->oh);
    if (to_packed)
        copy_rows(s, packed, s->oh, r, NHHS, s->oh, n);
    else
        copy_rows(s, r, NHHS, packed, s->oh, s->oh, n);
}

// The model's (B, T_local) qkv rows (stride qs) to qkv_h: the slot's tokens for this rank's heads. Where
// sp_qkv_mode allows, without a copy: the model's rows are the slot (SP_QKV_MODEL), or the all-to-all's
// receive buffer is (SP_QKV_STAGING; the two copies took 12 GiB a GPU at 2M tokens on 4 GPUs).
static void qkv_to_heads(struct kiln_sp *s, const void *qkv, int qs) {
    size_t n = (size_t)s->B * s->lo.T_local, blk = n * s->wl;
    if (s->qkv_mode == SP_QKV_MODEL) {
        KILN_ASSERT(qs == s->wl); // (sp_qkv_mode gives copies to the one block kind whose rows are wider)
        s->qkv_h = (void *)qkv;
        return;
    }
    if (s->lo.ulysses == 1) {
        copy_rows(s, s->qkv_h, s->wl, qkv, qs, s->wl, n);
        return;
    }
    for (int j = 0; j < s->lo.ulysses; j++)
        peer_heads(s, j, (void *)qkv, qs, at(s, s->send, j * blk), 1);
    all_to_all(s, blk);
    if (s->qkv_mode == SP_QKV_OWN)
        blocks_slot(s, s->recv, s->qkv_h, s->wl, 1);
}

// The inverse for gradients: dqkv_h back to the model's rows (stride ds), overwriting their qkv columns.
static void dqkv_from_heads(struct kiln_sp *s, void *dqkv, int ds) {
    size_t n = (size_t)s->B * s->lo.T_local, blk = n * s->wl;
    if (s->qkv_mode == SP_QKV_MODEL)
        return; // dqkv_h was the model's dqkv
    if (s->lo.ulysses == 1) {
        copy_rows(s, dqkv, ds, s->dqkv_h, s->wl, s->wl, n);
        return;
    }
    if (s->qkv_mode == SP_QKV_OWN) // (SP_QKV_STAGING: dqkv_h is the send buffer)
        blocks_slot(s, s->send, s->dqkv_h, s->wl, 0);
    all_to_all(s, blk);
    for (int j = 0; j < s->lo.ulysses; j++)
        peer_heads(s, j, dqkv, ds, at(s, s->recv, j * blk), 0);
}

// An attention output (B, T_local, NH*HS) to the slot's rows for this rank's heads (B, S, oh) in dst.
static void out_to_heads(struct kiln_sp *s, const void *out, void *dst) {
    size_t blk = (size_t)s->B * s->lo.T_local * s->oh;
    for (int j = 0; j < s->lo.ulysses; j++)
        peer_out(s, j, (void *)out, at(s, s->send, j * blk), 1);
    all_to_all(s, blk);
    blocks_slot(s, s->recv, dst, s->oh, 1);
}

// The inverse: out_h back to the model's (B, T_local, NH*HS).
static void out_from_heads(struct kiln_sp *s, void *out) {
    size_t blk = (size_t)s->B * s->lo.T_local * s->oh;
    blocks_slot(s, s->send, s->out_h, s->oh, 0);
    all_to_all(s, blk);
    for (int j = 0; j < s->lo.ulysses; j++)
        peer_out(s, j, out, at(s, s->recv, j * blk), 0);
}

// The runs of ring slot `slot` within its S tokens: (first token, first position, length); returns how many.
static int slot_runs(const struct kiln_sp *s, int slot, int first[2], int pos[2], int len[2]) {
    if (s->lo.ring == 1) {
        first[0] = 0, pos[0] = 0, len[0] = s->S;
        return 1;
    }
    int C = s->lo.chunk;
    first[0] = 0, pos[0] = slot * C, len[0] = C;
    first[1] = C, pos[1] = (2 * s->lo.ring - 1 - slot) * C, len[1] = C;
    return 2;
}

// A k|v block in hand: rows `stride` apart, v at column v_at; and where its gradients go.
struct kv_block {
    const void *k, *v;
    void *dk, *dv;
    int stride;
    int slot;
};

// The blocks of this slot's queries against kv (every pair not wholly in the future). Forward: merged into
// out_h and lse (started[i]: run i has a block already). Backward (dout_h set): into dqkv_h's q columns and
// kv's gradients.
static void attend(struct kiln_sp *s, const struct kv_block *kv, float *lse, int started[2], int backward) {
    int qf[2], qp[2], ql[2], kf[2], kp[2], kl[2];
    int nq = slot_runs(s, s->lo.ring_rank, qf, qp, ql), nk = slot_runs(s, kv->slot, kf, kp, kl);
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++) {
            if (kp[j] > qp[i] + ql[i] - 1)
                continue; // every key after every query
            size_t q_el = (size_t)qf[i] * s->wl, k_el = (size_t)kf[j] * kv->stride,
                   o_el = (size_t)qf[i] * s->oh;
            struct kiln_attn_block_args a = {.out = at(s, s->out_h, o_el),
                                             .lse = lse + qf[i],
                                             .q = at(s, s->qkv_h, q_el),
                                             .k = at(s, kv->k, k_el),
                                             .v = at(s, kv->v, k_el),
                                             .B = s->B,
                                             .Tq = ql[i],
                                             .Tk = kl[j],
                                             .NH = s->nh,
                                             .NKV = s->nkv,
                                             .HS = s->HS,
                                             .q0 = qp[i],
                                             .k0 = kp[j],
                                             .q_bstride = (size_t)s->S * s->wl,
                                             .kv_bstride = (size_t)s->S * kv->stride,
                                             .out_bstride = (size_t)s->S * s->oh,
                                             .lse_stride = (size_t)s->S,
                                             .q_stride = s->wl,
                                             .kv_stride = kv->stride,
                                             .out_stride = s->oh,
                                             .pos = s->pos,
                                             .rope_theta = s->theta,
                                             .head0 = s->lo.uly_rank * s->nh,
                                             .NH_total = s->NH};
            if (!backward) {
                a.accumulate = started[i];
                s->ops->attention_block_forward(s->ctx, &a);
                started[i] = 1;
            } else {
                struct kiln_attn_block_back_args b = {.blk = a,
                                                      .dq = at(s, s->dqkv_h, q_el),
                                                      .dk = at(s, kv->dk, k_el),
                                                      .dv = at(s, kv->dv, k_el),
                                                      .dout = at(s, s->dout_h, o_el)};
                s->ops->attention_block_backward(s->ctx, &b);
            }
        }
}

// The k|v block of ring buffer i, which came from slot `slot`
static struct kv_block ring_block(struct kiln_sp *s, int i, int slot) {
    size_t v_at = (size_t)s->nkv * s->HS;
    return (struct kv_block){.k = s->kv[i],
                             .v = at(s, s->kv[i], v_at),
                             .dk = s->dkv[i],
                             .dv = at(s, s->dkv[i], v_at),
                             .stride = s->kvw,
                             .slot = slot};
}

// Ulysses alone (no ring): each rank attends over the whole sequence, in order, for its heads, which is the
// backend's own attention op (FlashAttention-class on GPUs) with this rank's heads and strides. ALiBi's
// slopes depend on the global head, which that op does not take: it goes through the block op instead.
static int whole_sequence(const struct kiln_sp *s) {
    return s->lo.ring == 1 && s->pos != KILN_POS_ALIBI;
}

static void sp_forward(void *user, int l, const struct kiln_attn_args *a) {
    (void)l;
    struct kiln_sp *s = user;
    int r = s->lo.ring, me = s->lo.ring_rank, u = s->lo.ulysses;
    int qs = a->qkv_stride ? a->qkv_stride : (s->NH + 2 * s->NKV) * s->HS;
    qkv_to_heads(s, a->qkv, qs);
    if (u == 1)
        s->out_h = a->out; // the model's output is the slot's
    int started[2] = {0, 0};
    if (whole_sequence(s)) {
        struct kiln_attn_args at = {.out = s->out_h,
                                    .lse = a->lse,
                                    .qkv = s->qkv_h,
                                    .B = s->B,
                                    .T = s->S,
                                    .NH = s->nh,
                                    .NKV = s->nkv,
                                    .HS = s->HS,
                                    .pos = s->pos,
                                    .rope_theta = s->theta,
                                    .qkv_stride = s->wl};
        s->ops->attention_forward(s->ctx, &at);
    } else if (r == 1) {
        size_t kv_at = (size_t)s->nh * s->HS;
        struct kv_block own = {.k = at(s, s->qkv_h, kv_at),
                               .v = at(s, s->qkv_h, kv_at + (size_t)s->nkv * s->HS),
                               .stride = s->wl,
                               .slot = 0};
        attend(s, &own, a->lse, started, 0);
    } else {
        copy_rows(s, s->kv[0], s->kvw, at(s, s->qkv_h, (size_t)s->nh * s->HS), s->wl, s->kvw,
                  (size_t)s->B * s->S);
        for (int step = 0, cur = 0; step < r; step++, cur ^= 1) {
            struct kiln_comm_work *w = step + 1 < r ? ring_pass(s, s->kv[cur], s->kv[cur ^ 1]) : NULL;
            struct kv_block kv = ring_block(s, cur, (me - step + r) % r);
            attend(s, &kv, a->lse, started, 0);
            kiln_comm_wait_stream(s->ring, w);
        }
    }
    if (u > 1)
        out_from_heads(s, a->out);
}

static void sp_backward(void *user, int l, const struct kiln_attn_back_args *a) {
    (void)l;
    struct kiln_sp *s = user;
    int r = s->lo.ring, me = s->lo.ring_rank, u = s->lo.ulysses;
    int qs = a->qkv_stride ? a->qkv_stride : (s->NH + 2 * s->NKV) * s->HS;
    int ds = a->dqkv_stride ? a->dqkv_stride : (s->NH + 2 * s->NKV) * s->HS;
    if (u == 1) {
        s->out_h = (void *)a->out;
        s->dout_h = (void *)a->dout;
        if (s->qkv_mode == SP_QKV_MODEL) { // the gradients go straight into the model's rows (overwritten)
            KILN_ASSERT(ds == s->wl);
            s->dqkv_h = a->dqkv;
        }
    } else { // (before q, k, v: their all-to-all leaves them in the receive buffer under SP_QKV_STAGING)
        out_to_heads(s, a->out, s->out_h);
        out_to_heads(s, a->dout, s->dout_h);
    }
    qkv_to_heads(s, a->qkv, qs);
    float *lse = (float *)a->lse;
    if (whole_sequence(s)) { // (overwrites dqkv_h's columns)
        struct kiln_attn_back_args at = {.dqkv = s->dqkv_h,
                                         .dout = s->dout_h,
                                         .qkv = s->qkv_h,
                                         .out = s->out_h,
                                         .lse = lse,
                                         .B = s->B,
                                         .T = s->S,
                                         .NH = s->nh,
                                         .NKV = s->nkv,
                                         .HS = s->HS,
                                         .pos = s->pos,
                                         .rope_theta = s->theta,
                                         .qkv_stride = s->wl,
                                         .dqkv_stride = s->wl};
        s->ops->attention_backward(s->ctx, &at);
        dqkv_from_heads(s, a->dqkv, ds);
        return;
    }
    s->ops->zero(s->ctx, s->dqkv_h, (size_t)s->B * s->S * s->wl * s->es);
    if (r == 1) {
        size_t kv_at = (size_t)s->nh * s->HS, v_at = kv_at + (size_t)s->nkv * s->HS;
        struct kv_block own = {.k = at(s, s->qkv_h, kv_at),
                               .v = at(s, s->qkv_h, v_at),
                               .dk = at(s, s->dqkv_h, kv_at),
                               .dv = at(s, s->dqkv_h, v_at),
                               .stride = s->wl,
                               .slot = 0};
        attend(s, &own, lse, NULL, 1);
    } else {
        size_t blk = (size_t)s->B * s->S * s->kvw;
        copy_rows(s, s->kv[0], s->kvw, at(s, s->qkv_h, (size_t)s->nh * s->HS), s->wl, s->kvw,
                  (size_t)s->B * s->S);
        s->ops->zero(s->ctx, s->dkv[0], blk * s->es);
        int cur = 0;
        for (int step = 0; step < r; step++, cur ^= 1) {
            struct kiln_comm_work *w = step + 1 < r ? ring_pass(s, s->kv[cur], s->kv[cur ^ 1]) : NULL;
            struct kv_block kv = ring_block(s, cur, (me - step + r) % r);
            attend(s, &kv, lse, NULL, 1);
            // the block's gradient follows it, and after r passes it is back with its owner
            struct kiln_comm_work *dw = ring_pass(s, s->dkv[cur], s->dkv[cur ^ 1]);
            kiln_comm_wait_stream(s->ring, w);
            kiln_comm_wait_stream(s->ring, dw);
        }
        copy_rows(s, at(s, s->dqkv_h, (size_t)s->nh * s->HS), s->wl, s->dkv[cur], s->kvw, s->kvw,
                  (size_t)s->B * s->S);
    }
    dqkv_from_heads(s, a->dqkv, ds);
}

// The buffers kiln_sp_create allocates, in elements of the act dtype: the slot's head-sharded qkv and its
// gradient (where sp_qkv_mode says copies); with Ulysses the all-to-all staging and the head-sharded output
// and its gradient; with a ring two k|v blocks and two of their gradients.
#define SP_BUFS 10
// Where qkv_h and dqkv_h live. Without Ulysses the slot is the model's own rows, unless those are wider than
// the slot's (the parallel block's fused projection): SP_QKV_MODEL, else copies (SP_QKV_OWN). With Ulysses
// and one sequence a rank, the all-to-all's blocks are the slot's runs in order, so its receive buffer holds
// qkv_h as it arrives and its send buffer can hold dqkv_h as it leaves (SP_QKV_STAGING); with more sequences
// the runs interleave, and they are copies.
static enum sp_qkv sp_qkv_mode(const struct kiln_sp_layout *lo, const struct kiln_model_config *m, int B) {
    if (lo->ulysses == 1)
        return m->parallel_block ? SP_QKV_OWN : SP_QKV_MODEL;
    return B == 1 ? SP_QKV_STAGING : SP_QKV_OWN;
}
const char *kiln_sp_qkv_place(const struct kiln_sp_layout *lo, const struct kiln_model_config *m, int B) {
    static const char *const where[] = {"copies of their own", "the model's rows",
                                        "the all-to-all's buffers"};
    return where[sp_qkv_mode(lo, m, B)];
}

static void buffer_elems(const struct kiln_sp_layout *lo, const struct kiln_model_config *m, int B,
                         size_t e[SP_BUFS]) {
    size_t HS = (size_t)(m->n_embd / m->n_head), nh = (size_t)m->n_head / lo->ulysses,
           nkv = (size_t)kiln_model_kv_heads(m) / lo->ulysses, slot = (size_t)B * lo->T_local * lo->ulysses;
    size_t wl = (nh + 2 * nkv) * HS, uly = lo->ulysses > 1, ring = lo->ring > 1;
    size_t copies = sp_qkv_mode(lo, m, B) == SP_QKV_OWN;
    size_t sizes[SP_BUFS] = {copies * slot * wl,
                             copies * slot * wl,
                             uly * slot * wl,
                             uly * slot * wl,
                             uly * slot * nh * HS,
                             uly * slot * nh * HS,
                             ring * slot * 2 * nkv * HS,
                             ring * slot * 2 * nkv * HS,
                             ring * slot * 2 * nkv * HS,
                             ring * slot * 2 * nkv * HS};
    memcpy(e, sizes, sizeof(sizes));
}

size_t kiln_sp_buffer_bytes(const struct kiln_sp_layout *lo, const struct kiln_model_config *m, int B,
                            enum kiln_dtype act) {
    if (lo->sp <= 1)
        return 0;
    size_t e[SP_BUFS], n = 0;
    buffer_elems(lo, m, B, e);
    for (int i = 0; i < SP_BUFS; i++)
        n += e[i];
    return n * kiln_dtype_bytes(act);
}

void kiln_sp_free(struct kiln_sp *s) {
    if (!s)
        return;
    int own = s->qkv_mode == SP_QKV_OWN;
    void *bufs[] = {own ? s->qkv_h : NULL,
                    own ? s->dqkv_h : NULL,
                    s->send,
                    s->recv,
                    s->kv[0],
                    s->kv[1],
                    s->dkv[0],
                    s->dkv[1]};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            s->ops->free(s->ctx, bufs[i]);
    if (s->lo.ulysses > 1 && s->out_h) // with one Ulysses rank they are the model's buffers
        s->ops->free(s->ctx, s->out_h);
    if (s->lo.ulysses > 1 && s->dout_h)
        s->ops->free(s->ctx, s->dout_h);
    if (s->ev)
        s->ops->event_destroy(s->ctx, s->ev);
    kiln_comm_close(s->uly);
    kiln_comm_close(s->ring);
    free(s);
}

int kiln_sp_create(struct kiln_sp **out, const struct kiln_sp_layout *lo, struct kiln_comm *world,
                   struct kiln_backend *be, struct kiln_model *g, const struct kiln_model_config *m, int B,
                   struct kiln_error *err) {
    *out = NULL;
    if (!be->ops->attention_block_forward || !be->ops->copy_2d)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "sp %d on the %s backend (--sp): it has no attention-block op yet; use --sp=1",
                           lo->sp, be->name);
    struct kiln_sp *s = calloc(1, sizeof(*s));
    if (!s)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "out of memory (--sp): sequence parallelism's state");
    s->lo = *lo;
    s->be = be, s->ops = be->ops, s->ctx = be->ctx;
    s->act = be->act_dtype, s->es = kiln_dtype_bytes(be->act_dtype);
    s->B = B, s->NH = m->n_head, s->NKV = kiln_model_kv_heads(m), s->HS = m->n_embd / m->n_head;
    s->nh = s->NH / lo->ulysses, s->nkv = s->NKV / lo->ulysses;
    s->pos = m->pos, s->theta = m->rope_theta;
    s->S = lo->T_local * lo->ulysses;
    s->wl = (s->nh + 2 * s->nkv) * s->HS, s->oh = s->nh * s->HS, s->kvw = 2 * s->nkv * s->HS;
    // the groups: the same data-parallel index and ring slot (Ulysses), the same Ulysses index (ring)
    if ((lo->ulysses > 1 &&
         kiln_comm_split(world, lo->dp_rank * lo->ring + lo->ring_rank, lo->uly_rank, &s->uly, err)) ||
        (lo->ring > 1 &&
         kiln_comm_split(world, lo->dp_rank * lo->ulysses + lo->uly_rank, lo->ring_rank, &s->ring, err))) {
        kiln_sp_free(s);
        return err->code;
    }
    size_t elems[SP_BUFS], fail = 0;
    s->qkv_mode = sp_qkv_mode(lo, m, B);
    buffer_elems(lo, m, B, elems);
    void **bufs[SP_BUFS] = {&s->qkv_h,  &s->dqkv_h, &s->send,  &s->recv,   &s->out_h,
                            &s->dout_h, &s->kv[0],  &s->kv[1], &s->dkv[0], &s->dkv[1]};
    for (size_t i = 0; i < sizeof(elems) / sizeof(elems[0]); i++) {
        if (!elems[i])
            continue;
        *bufs[i] = s->ops->alloc(s->ctx, elems[i] * s->es);
        if (!*bufs[i])
            fail += elems[i] * s->es;
    }
    if (fail) {
        kiln_sp_free(s);
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "out of memory (--sp=%d): %.1f MiB more for sequence parallelism's buffers; lower "
                           "--batch or --seq",
                           lo->sp, fail / 1048576.0);
    }
    if (s->qkv_mode == SP_QKV_STAGING) {
        s->qkv_h = s->recv;
        s->dqkv_h = s->send;
    }
    if (s->ops->event_create)
        s->ev = s->ops->event_create(s->ctx);
    struct kiln_model_attention at = {.user = s, .forward = sp_forward, .backward = sp_backward};
    kiln_model_set_attention(g, &at);
    kiln_model_set_positions(g, lo->pos0, lo->split, lo->pos1);
    *out = s;
    return 0;
}
