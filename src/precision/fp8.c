// FP8 training through the linear-layer hook. See fp8.h.
#include "precision/fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// The operands whose amaxes a delayed recipe keeps, per linear layer
enum { OP_X, OP_W, OP_DY, OPS };

struct kiln_fp8 {
    struct kiln_fp8_opts o;
    const struct kiln_backend *be;
    struct kiln_model_linear prev; // what was installed before (nothing: the backend's op)
    int n_layer;
    // backend scratch, grown on demand: two operands' codes and their amaxes at a time
    uint8_t *q[2];
    size_t q_bytes[2];
    float *amax[2];
    size_t amax_n[2];
    // delayed: per slot (layer, linear, operand) the history (ring of `history` amaxes) and this step's amax
    int n_slots;
    float *hist; // (n_slots, history)
    float *cur;  // (n_slots)
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

// ---- scratch ------------------------------------------------------------------------------------------

static uint8_t *codes(struct kiln_fp8 *f, int i, size_t n) {
    if (f->q_bytes[i] < n) {
        f->be->ops->free(f->be->ctx, f->q[i]);
        f->q[i] = f->be->ops->alloc(f->be->ctx, n);
        KILN_ASSERT(f->q[i]); // a few MiB beside the model's plan
        f->q_bytes[i] = n;
    }
    return f->q[i];
}

static float *amaxes(struct kiln_fp8 *f, int i, size_t n) {
    if (f->amax_n[i] < n) {
        f->be->ops->free(f->be->ctx, f->amax[i]);
        f->amax[i] = f->be->ops->alloc(f->be->ctx, n * sizeof(float));
        KILN_ASSERT(f->amax[i]);
        f->amax_n[i] = n;
    }
    return f->amax[i];
}

// ---- one operand: its amax (the recipe's) and its cast ---------------------------------------------------

static int slot_of(const struct kiln_fp8 *f, int l, enum kiln_linear k, int op) {
    int layer = l < 0 ? f->n_layer : l; // the head after the layers
    return (layer * KILN_LINEARS + (int)k) * OPS + op;
}

// The delayed recipe's amax for a slot: the history's largest, or (an empty history: the first step) the
// tensor's own. The step's own amax is kept for the history (NaN sticks, as the amax op's).
static float delayed_amax(struct kiln_fp8 *f, int slot, float now) {
    float *c = &f->cur[slot];
    *c = isnan(*c) || isnan(now) ? NAN : (now > *c ? now : *c);
    if (!f->filled)
        return now;
    float m = 0.0f;
    for (int i = 0; i < f->filled; i++) {
        float h = f->hist[(size_t)slot * f->o.history + i];
        m = isnan(m) || isnan(h) ? NAN : (h > m ? h : m);
    }
    return m;
}

// x (rows, cols), or x^T with transpose, cast to fmt into buffer i; returns its codes and leaves the amaxes
// the GEMM reads in f->amax[i]
static uint8_t *operand(struct kiln_fp8 *f, int i, int slot, const void *x, int rows, int cols, int transpose,
                        enum kiln_fp8_fmt fmt) {
    const struct kiln_backend *be = f->be;
    int rowwise = f->o.recipe == KILN_FP8_ROWWISE;
    // rowwise: one scale per row of the operand as the GEMM reads it, along its reduction dimension
    enum kiln_fp8_per per = !rowwise ? KILN_FP8_TENSOR : transpose ? KILN_FP8_COLS : KILN_FP8_ROWS;
    float *am = amaxes(f, i, !rowwise ? 1 : transpose ? (size_t)cols : (size_t)rows);
    struct kiln_amax_args aa = {.amax = am, .x = x, .rows = rows, .cols = cols, .per = per};
    be->ops->amax(be->ctx, &aa);
    if (f->o.recipe == KILN_FP8_DELAYED) {
        // the history lives on the host: one float each way (on a GPU, a wait for the stream)
        float now;
        be->ops->download(be->ctx, &now, am, sizeof(float));
        float use = delayed_amax(f, slot, now);
        be->ops->upload(be->ctx, am, &use, sizeof(float));
    }
    uint8_t *q = codes(f, i, (size_t)rows * cols);
    struct kiln_fp8_cast_args ca = {
        .out = q, .x = x, .amax = am, .rows = rows, .cols = cols, .transpose = transpose, .fmt = fmt, .per = per};
    be->ops->fp8_cast(be->ctx, &ca);
    return q;
}

// ---- the hook -----------------------------------------------------------------------------------------

static int in_fp8(const struct kiln_fp8 *f, enum kiln_linear k) {
    return k != KILN_LINEAR_HEAD || f->o.include_head;
}

static void fp8_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    struct kiln_fp8 *f = user;
    const struct kiln_backend *be = f->be;
    if (!in_fp8(f, k)) {
        kiln_model_linear_forward_with(&f->prev, be, l, k, a);
        return;
    }
    int rowwise = f->o.recipe == KILN_FP8_ROWWISE;
    uint8_t *qx = operand(f, 0, slot_of(f, l, k, OP_X), a->inp, a->N, a->IC, 0, KILN_FP8_E4M3); // (N, IC)
    uint8_t *qw = operand(f, 1, slot_of(f, l, k, OP_W), a->weight, a->OC, a->IC, 0, KILN_FP8_E4M3); // (OC, IC)
    // the GELU is not fused into the FP8 GEMM: it writes pre (with the bias), the GELU op reads it
    struct kiln_fp8_matmul_args m = {.out = a->act == KILN_ACT_NONE ? a->out : a->pre,
                                     .a = qx,
                                     .b = qw,
                                     .a_fmt = KILN_FP8_E4M3,
                                     .b_fmt = KILN_FP8_E4M3,
                                     .a_amax = f->amax[0],
                                     .b_amax = f->amax[1],
                                     .a_rowwise = rowwise,
                                     .b_rowwise = rowwise,
                                     .bias = a->bias,
                                     .M = a->N,
                                     .N = a->OC,
                                     .K = a->IC,
                                     .accumulate = a->accumulate};
    be->ops->fp8_matmul(be->ctx, &m);
    if (a->act == KILN_ACT_GELU) {
        struct kiln_gelu_args g = {.out = a->out, .inp = a->pre, .N = a->N, .H = a->OC};
        be->ops->gelu_forward(be->ctx, &g);
    }
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
    if (a->dinp) {
        // dinp (N, IC) = dout (N, OC) @ W (OC, IC): the GEMM reads W^T (IC, OC), cast transposed; the previous
        // layer's GELU backward (DGELU) is its epilogue
        uint8_t *qd = operand(f, 0, slot_of(f, l, k, OP_DY), a->dout, a->N, a->OC, 0, gf);
        uint8_t *qwt = operand(f, 1, slot_of(f, l, k, OP_W), a->weight, a->OC, a->IC, 1, KILN_FP8_E4M3);
        struct kiln_fp8_matmul_args m = {.out = a->dinp,
                                         .a = qd,
                                         .b = qwt,
                                         .a_fmt = gf,
                                         .b_fmt = KILN_FP8_E4M3,
                                         .a_amax = f->amax[0],
                                         .b_amax = f->amax[1],
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
    uint8_t *qdt = operand(f, 0, slot_of(f, l, k, OP_DY), a->dout, a->N, a->OC, 1, gf);
    uint8_t *qxt = operand(f, 1, slot_of(f, l, k, OP_X), a->inp, a->N, a->IC, 1, KILN_FP8_E4M3);
    struct kiln_fp8_matmul_args m = {.out = a->dweight,
                                     .a = qdt,
                                     .b = qxt,
                                     .a_fmt = gf,
                                     .b_fmt = KILN_FP8_E4M3,
                                     .a_amax = f->amax[0],
                                     .b_amax = f->amax[1],
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
    if (o->recipe == KILN_FP8_DELAYED) {
        f->n_slots = (n_layer + 1) * KILN_LINEARS * OPS;
        f->hist = kiln_xcalloc((size_t)f->n_slots * o->history, sizeof(float));
        f->cur = kiln_xcalloc((size_t)f->n_slots, sizeof(float));
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

void kiln_fp8_after_step(struct kiln_fp8 *f) {
    if (!f || f->o.recipe != KILN_FP8_DELAYED)
        return;
    int H = f->o.history;
    for (int s = 0; s < f->n_slots; s++) {
        f->hist[(size_t)s * H + f->pos] = f->cur[s];
        f->cur[s] = 0.0f;
    }
    f->pos = (f->pos + 1) % H;
    if (f->filled < H)
        f->filled++;
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
    char *hex = kiln_xcalloc(2 * n + 1, 1);
    const unsigned char *b = (const unsigned char *)f->hist;
    for (size_t i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    cJSON_AddStringToObject(j, "amax_history", hex);
    free(hex);
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
    unsigned char *b = (unsigned char *)f->hist;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hx->valuestring + 2 * i, "%2x", &v) != 1)
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "state.json's precision amax_history is not hex: the checkpoint is damaged");
        b[i] = (unsigned char)v;
    }
    f->pos = pos;
    f->filled = filled;
    memset(f->cur, 0, sizeof(float) * (size_t)f->n_slots);
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
    for (int i = 0; i < 2; i++) {
        f->be->ops->free(f->be->ctx, f->q[i]);
        f->be->ops->free(f->be->ctx, f->amax[i]);
    }
    free(f->hist);
    free(f->cur);
    free(f);
}
