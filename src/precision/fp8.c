// FP8 training through the linear-layer hook. See fp8.h.
#include "precision/fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// The operands whose amaxes a delayed recipe keeps, per linear layer
enum { OP_X, OP_W, OP_DY, OPS };

// Backend memory for one operand's codes, its amaxes and inverse scales, grown on demand
struct operand {
    uint8_t *q, *qt; // codes, and (both layouts in one pass) the transposed codes
    size_t q_bytes, qt_bytes;
    float *amax, *sinv, *sinv_t; // sinv_t: the transposed layout's where its groups differ (rowwise)
    size_t n_amax;
};

// the inverse scales a GEMM reads with the plain or the transposed layout of o
static const float *sinv_of(const struct kiln_fp8 *f, const struct operand *o, int transposed);

// A weight's FP8 copies for one optimizer step: its codes (OC, IC) for the forward, its transpose's (IC, OC)
// for the backward's dinp, cast in one pass at the step's first use and reused by every micro-step after it
struct wcache {
    const void *w; // the weights they were cast from, NULL: empty
    int OC, IC;
    long step;
    struct operand op;
};

// Scratch operands of a layer's GEMMs
enum { S_X, S_W, S_DY, S_COUNT };

struct kiln_fp8 {
    struct kiln_fp8_opts o;
    const struct kiln_backend *be;
    struct kiln_model_linear prev; // what was installed before (nothing: the backend's op)
    int n_layer;
    struct operand s[S_COUNT];
    // the weights' copies, one per (layer, linear); off where weights move (ZeRO-3 gathers every layer into
    // the same few buffers) or the memory ran out
    struct wcache *wc;
    int n_wc, cache_off;
    long step; // optimizer steps so far: the copies of an older step are stale
    // delayed: per slot (layer, linear, operand), in backend memory, the history (a ring of `history`
    // amaxes), the step's amax so far, and the amax the step scales by (the history's largest)
    int n_slots;
    float *hist; // (n_slots, history)
    float *cur;  // (n_slots)
    float *use;  // (n_slots)
    // tensorwise: each (layer, linear)'s input amax from its forward (backend memory), which the backward's
    // transposed cast of the same input reuses instead of a pass of its own; and what it was taken of
    float *xamax;
    struct xseen {
        const void *inp;
        int N, IC;
    } * xseen;
    // kiln_fp8_set_weight_source: weights given as codes, and the operand that views them (its q not owned;
    // qt the transpose made per use, in the S_W scratch)
    int (*source)(void *user, const void *w, size_t n, const uint8_t **codes, const float **scale_inv);
    void *source_user;
    struct operand given;
    void (*reduce)(void *user, float *amax, size_t n); // kiln_fp8_set_amax_reduce (NULL: one rank)
    void *reduce_user;
    int pos, filled;
};

const char *kiln_fp8_recipe_name(enum kiln_fp8_recipe r) {
    return r == KILN_FP8_ROWWISE ? "rowwise" : r == KILN_FP8_DELAYED ? "delayed" : "tensorwise";
}

int kiln_fp8_check_backend(const struct kiln_backend *be, struct kiln_error *err) {
    const struct kiln_ops *ops = be->ops;
    if (!ops->amax || !ops->fp8_cast || !ops->fp8_matmul || !ops->bias_backward)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "precision fp8 on %s (--precision): this build's %s backend has no FP8 kernels; use "
                           "--precision=bf16, or --device=cpu to emulate FP8",
                           be->device_name, be->name);
    if (be->device_memory && !be->fp8_tensor_cores)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "precision fp8 on %s (--precision): FP8 tensor cores need compute capability 8.9 "
                           "or later (Ada, Hopper); use --precision=bf16",
                           be->device_name);
    return 0;
}

// ---- memory -------------------------------------------------------------------------------------------

// p grown to n bytes (contents not kept); 0, or -1 when the backend is out of memory
static int grow(const struct kiln_backend *be, void **p, size_t *have, size_t n) {
    if (*have >= n)
        return 0;
    be->ops->free(be->ctx, *p);
    *p = n ? be->ops->alloc(be->ctx, n) : NULL;
    *have = *p ? n : 0;
    return n && !*p ? -1 : 0;
}

// room for codes of n elements (and their transpose's with both) and n_amax groups
static int operand_fit(const struct kiln_backend *be, struct operand *o, size_t n, int both, size_t n_amax) {
    size_t amax_bytes = o->n_amax * sizeof(float) * 3, need = n_amax * sizeof(float) * 3;
    if (grow(be, (void **)&o->q, &o->q_bytes, n) || (both && grow(be, (void **)&o->qt, &o->qt_bytes, n)))
        return -1;
    if (amax_bytes < need) {
        size_t have = 0;
        float *p = NULL;
        if (grow(be, (void **)&p, &have, need))
            return -1;
        be->ops->free(be->ctx, o->amax);
        o->amax = p;
        o->sinv = p + n_amax;
        o->sinv_t = p + 2 * n_amax;
        o->n_amax = n_amax;
    }
    return 0;
}

static void operand_free(const struct kiln_backend *be, struct operand *o) {
    be->ops->free(be->ctx, o->q);
    be->ops->free(be->ctx, o->qt);
    be->ops->free(be->ctx, o->amax);
    memset(o, 0, sizeof(*o));
}

// scratch operand i, which must fit: a few activations' worth beside the model's plan
static struct operand *scratch(struct kiln_fp8 *f, int i, size_t n, int both, size_t n_amax) {
    KILN_ASSERT(operand_fit(f->be, &f->s[i], n, both, n_amax) == 0);
    return &f->s[i];
}

// ---- one operand: its amax (the recipe's) and its cast ---------------------------------------------------

static int slot_of(const struct kiln_fp8 *f, int l, enum kiln_linear k, int op) {
    int layer = l < 0 ? f->n_layer : l; // the head after the layers
    return (layer * KILN_LINEARS + (int)k) * OPS + op;
}

// Where a tensorwise amax goes (at: NULL, the operand's own) and whether it already holds x's (ready)
struct amax_at {
    float *at;
    int ready;
};

// Casts x (rows, cols) into o: its codes (out), its transpose's (out_t), or both in one pass, with the
// inverse scales in o->sinv. per says the amax groups (rowwise: the GEMM's reduction runs along x's rows for
// the plain layout, down its columns for the transposed one). The delayed recipe scales by the slot's
// history (the tensor's own amax on the first step) and records the tensor's amax in the same pass.
static void cast_into(struct kiln_fp8 *f, struct operand *o, int slot, const void *x, int rows, int cols,
                      uint8_t *out, uint8_t *out_t, enum kiln_fp8_per per, float *sinv, enum kiln_fp8_fmt fmt,
                      struct amax_at am) {
    const struct kiln_backend *be = f->be;
    float *own = am.at && per == KILN_FP8_TENSOR ? am.at : o->amax;
    const float *amax = own;
    float *seen = NULL;
    if (f->o.recipe == KILN_FP8_DELAYED) {
        seen = &f->cur[slot];
        if (f->filled)
            amax = &f->use[slot];
    }
    if (amax == own && !(own == am.at && am.ready)) {
        struct kiln_amax_args aa = {.amax = own, .x = x, .rows = rows, .cols = cols, .per = per};
        be->ops->amax(be->ctx, &aa);
    }
    struct kiln_fp8_cast_args ca = {.out = out,
                                    .out_t = out_t,
                                    .x = x,
                                    .amax = amax,
                                    .scale_inv = sinv,
                                    .amax_seen = seen,
                                    .rows = rows,
                                    .cols = cols,
                                    .fmt = fmt,
                                    .per = per};
    be->ops->fp8_cast(be->ctx, &ca);
}

static const float *sinv_of(const struct kiln_fp8 *f, const struct operand *o, int transposed) {
    return f->o.recipe == KILN_FP8_ROWWISE && transposed ? o->sinv_t : o->sinv;
}

// x (rows, cols) cast for a GEMM that reads it as it is (plain) and/or transposed, into o: tensorwise scales
// are one pass for both layouts; rowwise ones differ per layout (rows for the plain, columns for the
// transposed), so each layout is its own amax and cast
static void cast_layouts(struct kiln_fp8 *f, struct operand *o, int slot, const void *x, int rows, int cols,
                         int plain, int transposed, enum kiln_fp8_fmt fmt, struct amax_at am) {
    if (f->o.recipe != KILN_FP8_ROWWISE) {
        cast_into(f, o, slot, x, rows, cols, plain ? o->q : NULL, transposed ? o->qt : NULL, KILN_FP8_TENSOR,
                  o->sinv, fmt, am);
        return;
    }
    struct amax_at none = {0};
    if (plain)
        cast_into(f, o, slot, x, rows, cols, o->q, NULL, KILN_FP8_ROWS, o->sinv, fmt, none);
    if (transposed) {
        // the transposed layout's amaxes after the plain one's: both cast from the tensor, one at a time
        cast_into(f, o, slot, x, rows, cols, NULL, o->qt, KILN_FP8_COLS, o->sinv_t, fmt, none);
    }
}

// A layer's input: its forward records the amax it takes (a whole layer's input, tensorwise), and the
// backward's cast of the same input (the same rows at the same place) finds it ready
static struct amax_at input_amax(struct kiln_fp8 *f, int slot, const void *inp, int N, int IC, int part,
                                 int backward) {
    struct amax_at am = {0};
    if (f->o.recipe != KILN_FP8_TENSORWISE || part)
        return am;
    struct xseen *s = &f->xseen[slot / OPS];
    am.at = &f->xamax[slot / OPS];
    if (!backward) {
        *s = (struct xseen){.inp = inp, .N = N, .IC = IC};
        return am;
    }
    am.ready = s->inp == inp && s->N == N && s->IC == IC;
    return am;
}

// The weight W (OC, IC) of (l, k), both layouts, from the step's copies where it can; where the weight source
// gives its codes, those, and (transposed) the transpose made from them
static struct operand *weight(struct kiln_fp8 *f, int l, enum kiln_linear k, const void *w, int OC, int IC,
                              int transposed) {
    int slot = slot_of(f, l, k, OP_W);
    size_t n = (size_t)OC * IC, groups = (size_t)(OC > IC ? OC : IC);
    const uint8_t *codes;
    const float *sinv;
    if (f->source && f->source(f->source_user, w, n, &codes, &sinv) == 0) {
        struct operand *o = &f->given;
        o->q = (uint8_t *)codes;
        o->sinv = (float *)sinv;
        o->qt = NULL;
        if (transposed) {
            struct operand *t = scratch(f, S_W, n, 1, 1);
            f->be->ops->fp8_transpose(f->be->ctx, t->qt, codes, OC, IC);
            o->qt = t->qt;
        }
        return o;
    }
    struct wcache *c = f->cache_off ? NULL : &f->wc[slot / OPS];
    if (c && c->w == w && c->OC == OC && c->IC == IC && c->step == f->step)
        return &c->op;
    if (c && c->w != w) {
        // weights that another layer's weights shared a buffer with (gathered per layer): no copies kept
        for (int i = 0; i < f->n_wc && !f->cache_off; i++)
            if (i != slot / OPS && f->wc[i].w == w)
                f->cache_off = 1;
    }
    if (c && !f->cache_off && operand_fit(f->be, &c->op, n, 1, groups))
        f->cache_off = 1; // out of memory: cast per use
    if (f->cache_off && f->wc) {
        for (int i = 0; i < f->n_wc; i++)
            operand_free(f->be, &f->wc[i].op);
        free(f->wc);
        f->wc = NULL;
        c = NULL;
    }
    struct operand *o = c ? &c->op : scratch(f, S_W, n, 1, groups);
    cast_layouts(f, o, slot, w, OC, IC, 1, 1, KILN_FP8_E4M3, (struct amax_at){0});
    if (c) {
        c->w = w;
        c->OC = OC;
        c->IC = IC;
        c->step = f->step;
    }
    return o;
}
// ---- the hook -----------------------------------------------------------------------------------------

static int in_fp8(const struct kiln_fp8 *f, enum kiln_linear k) {
    return k != KILN_LINEAR_HEAD || f->o.include_head;
}

static size_t max_sz(int a, int b) {
    return (size_t)(a > b ? a : b);
}

static void fp8_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    struct kiln_fp8 *f = user;
    const struct kiln_backend *be = f->be;
    if (!in_fp8(f, k)) {
        kiln_model_linear_forward_with(&f->prev, be, l, k, a);
        return;
    }
    int rowwise = f->o.recipe == KILN_FP8_ROWWISE;
    struct operand *w = weight(f, l, k, a->weight, a->OC, a->IC, 0); // (OC, IC)
    struct operand *x = scratch(f, S_X, (size_t)a->N * a->IC, 0, max_sz(a->N, a->IC));
    int xs = slot_of(f, l, k, OP_X);
    cast_layouts(f, x, xs, a->inp, a->N, a->IC, 1, 0, KILN_FP8_E4M3,
                 input_amax(f, xs, a->inp, a->N, a->IC, a->rows_part, 0)); // (N, IC)
    // bias and GELU in the GEMM's epilogue: pre gets the sum, out its GELU
    struct kiln_fp8_matmul_args m = {.out = a->out,
                                     .pre = a->act == KILN_ACT_GELU ? a->pre : NULL,
                                     .a = x->q,
                                     .b = w->q,
                                     .a_fmt = KILN_FP8_E4M3,
                                     .b_fmt = KILN_FP8_E4M3,
                                     .a_scale_inv = sinv_of(f, x, 0),
                                     .b_scale_inv = sinv_of(f, w, 0),
                                     .a_rowwise = rowwise,
                                     .b_rowwise = rowwise,
                                     .bias = a->bias,
                                     .M = a->N,
                                     .N = a->OC,
                                     .K = a->IC,
                                     .accumulate = a->accumulate};
    be->ops->fp8_matmul(be->ctx, &m);
}

static void fp8_backward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_back_args *a) {
    struct kiln_fp8 *f = user;
    const struct kiln_backend *be = f->be;
    if (!in_fp8(f, k)) {
        kiln_model_linear_backward_with(&f->prev, be, l, k, a);
        return;
    }
    int rowwise = f->o.recipe == KILN_FP8_ROWWISE;
    enum kiln_fp8_fmt gf = f->o.grad_fmt;
    // dout (N, OC): as it is for dinp, transposed for dW; one pass for both with tensorwise scales
    struct operand *dy = scratch(f, S_DY, (size_t)a->N * a->OC, 1, max_sz(a->N, a->OC));
    cast_layouts(f, dy, slot_of(f, l, k, OP_DY), a->dout, a->N, a->OC, a->dinp != NULL, a->dweight != NULL, gf,
                 (struct amax_at){0});
    if (a->dinp) {
        // dinp (N, IC) = dout (N, OC) @ W (OC, IC): the GEMM reads W^T (IC, OC), the step's transposed copy;
        // the previous layer's GELU backward (DGELU) is its epilogue
        struct operand *w = weight(f, l, k, a->weight, a->OC, a->IC, 1);
        struct kiln_fp8_matmul_args m = {.out = a->dinp,
                                         .a = dy->q,
                                         .b = w->qt,
                                         .a_fmt = gf,
                                         .b_fmt = KILN_FP8_E4M3,
                                         .a_scale_inv = sinv_of(f, dy, 0),
                                         .b_scale_inv = sinv_of(f, w, 1),
                                         .a_rowwise = rowwise,
                                         .b_rowwise = rowwise,
                                         .gelu_pre = a->dinp_gelu_pre,
                                         .gelu_pre_stride = a->gelu_pre_stride,
                                         .M = a->N,
                                         .N = a->IC,
                                         .K = a->OC,
                                         .ldc = a->dinp_stride,
                                         .accumulate = a->dinp_accumulate};
        be->ops->fp8_matmul(be->ctx, &m);
    }
    // dW (OC, IC) = dout^T (OC, N) @ inp (N, IC): both operands transposed, reducing over the N rows
    KILN_ASSERT(a->dweight || !a->dbias);
    if (!a->dweight)
        return;
    struct operand *x = scratch(f, S_X, (size_t)a->N * a->IC, 1, max_sz(a->N, a->IC));
    int xs = slot_of(f, l, k, OP_X);
    cast_layouts(f, x, xs, a->inp, a->N, a->IC, 0, 1, KILN_FP8_E4M3,
                 input_amax(f, xs, a->inp, a->N, a->IC, a->rows_part, 1));
    struct kiln_fp8_matmul_args m = {.out = a->dweight,
                                     .a = dy->qt,
                                     .b = x->qt,
                                     .a_fmt = gf,
                                     .b_fmt = KILN_FP8_E4M3,
                                     .a_scale_inv = sinv_of(f, dy, 1),
                                     .b_scale_inv = sinv_of(f, x, 1),
                                     .a_rowwise = rowwise,
                                     .b_rowwise = rowwise,
                                     .M = a->OC,
                                     .N = a->IC,
                                     .K = a->N,
                                     .out_grad = 1,
                                     .accumulate = !a->grad_assign};
    be->ops->fp8_matmul(be->ctx, &m);
    if (a->dbias) {
        struct kiln_bias_back_args b = {
            .dbias = a->dbias, .x = a->dout, .M = a->N, .N = a->OC, .assign = a->grad_assign};
        be->ops->bias_backward(be->ctx, &b);
    }
}

// ---- the strategy -------------------------------------------------------------------------------------

// delayed: the amax each slot's casts scale by, the history's largest (an empty slot of the ring holds 0)
static void delayed_use(struct kiln_fp8 *f) {
    struct kiln_amax_args aa = {.amax = f->use,
                                .x = f->hist,
                                .rows = f->n_slots,
                                .cols = f->o.history,
                                .per = KILN_FP8_ROWS,
                                .x_f32 = 1};
    f->be->ops->amax(f->be->ctx, &aa);
}

int kiln_fp8_apply(struct kiln_fp8 **out, struct kiln_model *g, const struct kiln_backend *be,
                   const struct kiln_fp8_opts *o, int n_layer, struct kiln_error *err) {
    *out = NULL;
    int rc = kiln_fp8_check_backend(be, err);
    if (rc)
        return rc;
    if (o->recipe == KILN_FP8_DELAYED && o->history < 1)
        return kiln_errorf(err, KILN_ERR_USAGE, "fp8-history %d (--fp8-history): must be at least 1",
                           o->history);
    struct kiln_fp8 *f = kiln_xcalloc(1, sizeof(*f));
    f->o = *o;
    f->be = be;
    f->n_layer = n_layer;
    f->n_wc = (n_layer + 1) * KILN_LINEARS;
    f->wc = kiln_xcalloc((size_t)f->n_wc, sizeof(*f->wc));
    f->xseen = kiln_xcalloc((size_t)f->n_wc, sizeof(*f->xseen));
    f->xamax = be->ops->alloc(be->ctx, (size_t)f->n_wc * sizeof(float));
    KILN_ASSERT(f->xamax); // a few hundred bytes
    if (o->recipe == KILN_FP8_DELAYED) {
        f->n_slots = (n_layer + 1) * KILN_LINEARS * OPS;
        size_t hb = (size_t)f->n_slots * o->history * sizeof(float), sb = (size_t)f->n_slots * sizeof(float);
        f->hist = be->ops->alloc(be->ctx, hb);
        f->cur = be->ops->alloc(be->ctx, sb);
        f->use = be->ops->alloc(be->ctx, sb);
        KILN_ASSERT(f->hist && f->cur && f->use); // a few KiB
    }
    struct kiln_model_linear h = {.user = f, .forward = fp8_forward, .backward = fp8_backward};
    kiln_model_set_linear(g, &h, &f->prev);
    if (f->prev.forward || f->prev.backward) {
        kiln_model_set_linear(g, &f->prev, NULL);
        kiln_fp8_free(f);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "precision fp8 (--precision): another strategy already replaced the linear layers' "
                           "GEMMs; FP8 must be applied first, so that it runs the GEMMs of those above it");
    }
    *out = f;
    return 0;
}

void kiln_fp8_set_amax_reduce(struct kiln_fp8 *f, void (*reduce)(void *user, float *amax, size_t n),
                              void *user) {
    if (!f)
        return;
    f->reduce = reduce;
    f->reduce_user = user;
}

void kiln_fp8_set_weight_source(struct kiln_fp8 *f,
                                int (*source)(void *user, const void *w, size_t n, const uint8_t **codes,
                                              const float **scale_inv),
                                void *user) {
    if (!f)
        return;
    KILN_ASSERT(!source || f->o.recipe == KILN_FP8_TENSORWISE);
    f->source = source;
    f->source_user = user;
}

void kiln_fp8_after_step(struct kiln_fp8 *f) {
    if (!f)
        return;
    f->step++; // the weights changed: their FP8 copies are stale
    if (f->o.recipe != KILN_FP8_DELAYED)
        return;
    // on the backend's stream, no wait: the step's amaxes (the largest over the ranks) into the ring's column
    // pos, then the next step's
    const struct kiln_backend *be = f->be;
    size_t H = (size_t)f->o.history;
    if (f->reduce)
        f->reduce(f->reduce_user, f->cur, (size_t)f->n_slots);
    be->ops->copy_2d(be->ctx, f->hist + f->pos, H * sizeof(float), f->cur, sizeof(float), sizeof(float),
                     (size_t)f->n_slots);
    be->ops->zero(be->ctx, f->cur, (size_t)f->n_slots * sizeof(float));
    f->pos = (f->pos + 1) % f->o.history;
    if (f->filled < f->o.history)
        f->filled++;
    delayed_use(f);
}

// ---- checkpoints: the histories as the hex of their f32 bytes (bit for bit) -----------------------------

cJSON *kiln_fp8_state_to_json(const struct kiln_fp8 *f) {
    if (!f || f->o.recipe != KILN_FP8_DELAYED)
        return NULL;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "recipe", "delayed");
    cJSON_AddNumberToObject(j, "history", f->o.history);
    cJSON_AddNumberToObject(j, "slots", f->n_slots);
    cJSON_AddNumberToObject(j, "pos", f->pos);
    cJSON_AddNumberToObject(j, "filled", f->filled);
    size_t n = (size_t)f->n_slots * f->o.history * sizeof(float);
    unsigned char *b = kiln_xcalloc(n ? n : 1, 1);
    f->be->ops->download(f->be->ctx, b, f->hist, n); // a checkpoint's one wait
    char *hex = kiln_xcalloc(2 * n + 1, 1);
    for (size_t i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    cJSON_AddStringToObject(j, "amax_history", hex);
    free(hex);
    free(b);
    return j;
}

static int json_int(const cJSON *j, const char *name, int lo, int hi, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi || v->valuedouble != (int)v->valuedouble)
        return -1;
    *out = (int)v->valuedouble;
    return 0;
}

int kiln_fp8_state_from_json(struct kiln_fp8 *f, const cJSON *j, struct kiln_error *err) {
    if (!f || f->o.recipe != KILN_FP8_DELAYED || !j)
        return 0;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "recipe");
    if (!cJSON_IsString(r) || strcmp(r->valuestring, "delayed"))
        return 0; // another recipe's checkpoint: the histories start empty
    int H = 0, slots = 0, pos = 0, filled = 0;
    if (json_int(j, "history", 1, 1 << 20, &H) || json_int(j, "slots", 0, 1 << 30, &slots))
        return kiln_errorf(err, KILN_ERR_RUNTIME, "state.json's precision state has no valid history or "
                                                  "slots: the checkpoint is damaged");
    if (H != f->o.history || slots != f->n_slots)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "fp8-history %d with a checkpoint of history %d and %d amax slots, this model %d "
                           "(--fp8-history): delayed scaling resumes its own histories; resume with "
                           "--fp8-history=%d",
                           f->o.history, H, slots, f->n_slots, H);
    const cJSON *hx = cJSON_GetObjectItemCaseSensitive(j, "amax_history");
    size_t n = (size_t)slots * H * sizeof(float);
    if (json_int(j, "pos", 0, H - 1, &pos) || json_int(j, "filled", 0, H, &filled) || !cJSON_IsString(hx) ||
        strlen(hx->valuestring) != 2 * n)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "state.json's precision state is malformed (pos, filled or "
                                                  "amax_history): the checkpoint is damaged");
    unsigned char *b = kiln_xcalloc(n ? n : 1, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hx->valuestring + 2 * i, "%2x", &v) != 1) {
            free(b);
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "state.json's precision amax_history is not hex: the checkpoint is damaged");
        }
        b[i] = (unsigned char)v;
    }
    // the ring's entries not yet filled count as 0 (the largest is taken over all of them)
    float *h = (float *)b;
    for (int s = 0; s < slots; s++)
        for (int i = filled; i < H; i++)
            h[(size_t)s * H + i] = 0.0f;
    f->be->ops->upload(f->be->ctx, f->hist, b, n);
    free(b);
    f->pos = pos;
    f->filled = filled;
    f->be->ops->zero(f->be->ctx, f->cur, sizeof(float) * (size_t)f->n_slots);
    delayed_use(f);
    return 0;
}

void kiln_fp8_describe(const struct kiln_fp8_opts *o, const char *device, char *buf, size_t cap) {
    const char *where = !strcmp(device, "cpu")    ? "emulated on the CPU"
                        : !strcmp(device, "cuda") ? "FP8 tensor cores"
                                                  : "FP8 tensor cores, or emulated on the CPU";
    int n = snprintf(buf, cap, "fp8 (%s), recipe %s, gradients %s, LM head %s", where,
                     kiln_fp8_recipe_name(o->recipe), o->grad_fmt == KILN_FP8_E4M3 ? "e4m3" : "e5m2",
                     o->include_head ? "in fp8" : "not in fp8");
    if (o->recipe == KILN_FP8_DELAYED && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, ", amax history %d", o->history);
}

void kiln_fp8_free(struct kiln_fp8 *f) {
    if (!f)
        return;
    const struct kiln_backend *be = f->be;
    for (int i = 0; i < S_COUNT; i++)
        operand_free(be, &f->s[i]);
    for (int i = 0; f->wc && i < f->n_wc; i++)
        operand_free(be, &f->wc[i].op);
    free(f->wc);
    free(f->xseen);
    be->ops->free(be->ctx, f->xamax);
    be->ops->free(be->ctx, f->hist);
    be->ops->free(be->ctx, f->cur);
    be->ops->free(be->ctx, f->use);
    free(f);
}
