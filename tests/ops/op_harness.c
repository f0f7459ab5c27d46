// The op table's machinery (op_table.h): a row's case instantiated with host values, put on a backend, run,
// read back, and the error metrics. The rows themselves are in op_table.c.
#include "ops/op_table.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"

// ---- random values ----------------------------------------------------------------------------------------

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// xorshift64*
static uint64_t rng_u64(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}
static double rng_uniform(uint64_t *s) { // [0, 1)
    return (double)(rng_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}
static double rng_normal(uint64_t *s) {
    double u1 = rng_uniform(s) + 1e-12, u2 = rng_uniform(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static float bf16_round(float f) { // round to nearest even, as the backends' upload_f32 does
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return f;
    u += 0x7fffu + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "op_table: out of host memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

// ---- instances --------------------------------------------------------------------------------------------

enum kiln_dtype opt_dtype_on(const struct kiln_backend *be, enum opt_dtype d) {
    switch (d) {
    case OPT_ACT:
        return be->act_dtype;
    case OPT_GRAD:
        return be->grad_dtype;
    case OPT_F32:
        return KILN_F32;
    case OPT_I32:
        break;
    }
    return KILN_I32;
}

// Does the harness hold host values of this tensor (what it uploads before the op)?
static int has_host(const struct opt_tensor *t) {
    if (t->n == 0)
        return 0;
    return t->role == OPT_IN || t->role == OPT_INOUT || t->role == OPT_DOUT ||
           ((t->role == OPT_OUT || t->role == OPT_DIN) && t->accum);
}

static void fill(const struct opt_tensor *t, void *host, uint64_t *s) {
    if (t->dtype == OPT_I32) {
        int32_t *h = host;
        for (size_t i = 0; i < t->n; i++) {
            if (t->init == OPT_CONST)
                h[i] = (int32_t)t->a;
            else if (t->init == OPT_TARGETS)
                h[i] = i % 5 == 3 ? -1 : (int32_t)(rng_u64(s) % (uint64_t)t->b);
            else // OPT_INTS
                h[i] = (int32_t)t->a + (int32_t)(rng_u64(s) % (uint64_t)(t->b - t->a));
        }
        return;
    }
    float *h = host;
    size_t side = (size_t)t->a;
    for (size_t i = 0; i < t->n; i++) {
        switch (t->init) {
        case OPT_NORMAL:
            h[i] = (float)(t->a * rng_normal(s) + t->b);
            break;
        case OPT_UNIFORM:
            h[i] = (float)(t->a + (t->b - t->a) * rng_uniform(s));
            break;
        case OPT_CONST:
            h[i] = t->a;
            break;
        case OPT_IDENTITY:
            h[i] = i / side == i % side ? 1.0f : 0.0f;
            break;
        default:
            h[i] = (float)(rng_u64(s) % (uint64_t)t->b);
        }
    }
}

void opt_inst_init(struct opt_inst *in, const struct opt_row *row, const struct opt_case *c, uint64_t seed,
                   const struct kiln_backend *round_to) {
    memset(in, 0, sizeof(*in));
    in->row = row;
    in->c = *c;
    in->nt = row->tensors(&in->c, in->t);
    if (in->nt > OPT_MAX_TENSORS) {
        fprintf(stderr, "op_table: row %s has %d tensors (at most %d)\n", row->name, in->nt, OPT_MAX_TENSORS);
        abort();
    }
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (!has_host(t))
            continue;
        // a stream of its own per tensor: a row that gains a tensor does not change the others' values
        uint64_t s = splitmix64(seed ^ splitmix64((uint64_t)i + 1));
        if (!s)
            s = 1;
        in->host[i] = xmalloc(t->n * 4);
        fill(t, in->host[i], &s);
        if (round_to && t->dtype != OPT_I32 && opt_dtype_on(round_to, t->dtype) == KILN_BF16) {
            float *h = in->host[i];
            for (size_t k = 0; k < t->n; k++)
                h[k] = bf16_round(h[k]);
        }
    }
}

void opt_inst_free(struct opt_inst *in) {
    for (int i = 0; i < in->nt; i++)
        free(in->host[i]);
    memset(in, 0, sizeof(*in));
}

// ---- on a backend -----------------------------------------------------------------------------------------

void opt_on_open(struct opt_on *on, const struct opt_inst *in, const struct kiln_backend *be) {
    memset(on, 0, sizeof(*on));
    on->in = in;
    on->be = be;
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (t->n == 0)
            continue;
        // 16 bytes more: a kernel's vector tail never reads past an allocation
        on->dev[i] = be->ops->alloc(be->ctx, t->n * kiln_dtype_bytes(opt_dtype_on(be, t->dtype)) + 16);
        if (!on->dev[i]) {
            fprintf(stderr, "op_table: %s: allocating %s (%zu elements) failed\n", in->row->name, t->name,
                    t->n);
            abort();
        }
    }
}

void opt_on_close(struct opt_on *on) {
    for (int i = 0; i < on->in->nt; i++)
        if (on->dev[i])
            on->be->ops->free(on->be->ctx, on->dev[i]);
    memset(on, 0, sizeof(*on));
}

static void upload(struct opt_on *on, int i, const void *host) {
    const struct opt_tensor *t = &on->in->t[i];
    const struct kiln_backend *be = on->be;
    if (t->dtype == OPT_I32)
        be->ops->upload(be->ctx, on->dev[i], host, t->n * 4);
    else
        be->ops->upload_f32(be->ctx, on->dev[i], opt_dtype_on(be, t->dtype), host, t->n);
}

// NaN into every element: an element the op should write and does not then shows
static void poison(struct opt_on *on, int i) {
    const struct opt_tensor *t = &on->in->t[i];
    float *nan = xmalloc(t->n * 4);
    for (size_t k = 0; k < t->n; k++)
        nan[k] = NAN;
    upload(on, i, nan);
    free(nan);
}

static struct opt_args args_of(const struct opt_on *on) {
    return (struct opt_args){
        .be = on->be, .c = &on->in->c, .t = on->dev, .host = (const void *const *)on->in->host};
}

void opt_on_run_forward(struct opt_on *on) {
    struct opt_args x = args_of(on);
    on->in->row->forward(&x);
}

void opt_on_run_backward(struct opt_on *on) {
    struct opt_args x = args_of(on);
    on->in->row->backward(&x);
}

// The forward with its inputs uploaded: every one and NaN into the outputs (changed < 0), or only input
// `changed`
static void forward_with(struct opt_on *on, int changed) {
    const struct opt_inst *in = on->in;
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (t->n == 0)
            continue;
        if (t->role == OPT_IN) {
            if (changed < 0 || changed == i)
                upload(on, i, in->host[i]);
        } else if (t->role == OPT_INOUT || (t->role == OPT_OUT && t->accum)) {
            upload(on, i, in->host[i]);
        } else if ((t->role == OPT_OUT || t->role == OPT_SAVED) && changed < 0) {
            poison(on, i);
        }
    }
    opt_on_run_forward(on);
}

void opt_on_forward(struct opt_on *on) {
    forward_with(on, -1);
}

void opt_on_forward_changed(struct opt_on *on, int changed) {
    forward_with(on, changed);
}

void opt_on_backward(struct opt_on *on) {
    const struct opt_inst *in = on->in;
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (t->n == 0)
            continue;
        if (t->role == OPT_DOUT || (t->role == OPT_DIN && t->accum))
            upload(on, i, in->host[i]);
        else if (t->role == OPT_DIN)
            poison(on, i);
    }
    opt_on_run_backward(on);
}

float *opt_on_get(const struct opt_on *on, int i) {
    const struct opt_tensor *t = &on->in->t[i];
    const struct kiln_backend *be = on->be;
    float *h = xmalloc(t->n * 4);
    if (t->dtype == OPT_I32) {
        int32_t *v = xmalloc(t->n * 4);
        be->ops->download(be->ctx, v, on->dev[i], t->n * 4);
        for (size_t k = 0; k < t->n; k++)
            h[k] = (float)v[k];
        free(v);
    } else {
        be->ops->download_f32(be->ctx, h, on->dev[i], opt_dtype_on(be, t->dtype), t->n);
    }
    return h;
}

void opt_describe(const struct opt_case *c, char *buf, size_t cap) {
    static const char *pos_names[] = {"learned", "rope", "alibi", "none"};
    size_t len = 0;
    buf[0] = 0;
#define FIELD(name, fmt, v, shown)                                                                           \
    if ((shown) && len < cap)                                                                                \
        len += (size_t)snprintf(buf + len, cap - len, "%s" name "=" fmt, len ? " " : "", v);
    FIELD("B", "%d", c->B, c->B);
    FIELD("T", "%d", c->T, c->T);
    FIELD("N", "%d", c->N, c->N);
    FIELD("C", "%d", c->C, c->C);
    FIELD("IC", "%d", c->IC, c->IC);
    FIELD("H", "%d", c->H, c->H);
    FIELD("OC", "%d", c->OC, c->OC);
    FIELD("NH", "%d", c->NH, c->NH);
    FIELD("NKV", "%d", c->NKV, c->NKV);
    FIELD("HS", "%d", c->HS, c->HS);
    FIELD("V", "%d", c->V, c->V);
    FIELD("Vp", "%d", c->Vp, c->Vp);
    FIELD("Tq", "%d", c->Tq, c->Tq);
    FIELD("Tk", "%d", c->Tk, c->Tk);
    FIELD("q0", "%d", c->q0, c->q0);
    FIELD("k0", "%d", c->k0, c->k0);
    FIELD("heads", "%d..", c->head0, c->NH_total);
    FIELD("of", "%d", c->NH_total, c->NH_total);
    FIELD("maxT", "%d", c->maxT, c->maxT);
    FIELD("at", "%d", c->pos_at, c->maxT && c->NH); // decoding's position
    FIELD("P", "%zu", c->P, c->P);
    FIELD("pos", "%s", pos_names[c->pos & 3], c->pos != KILN_POS_LEARNED);
    FIELD("bias", "%d", c->bias, c->bias);
    FIELD("accum", "%d", c->accum, c->accum);
    FIELD("assign", "%d", c->assign, c->assign);
    FIELD("rms", "%d", c->rms, c->rms);
    FIELD("residual", "%d", c->residual, c->residual);
    FIELD("res_bias", "%d", c->res_bias, c->res_bias);
    FIELD("learned", "%d", c->learned, c->learned);
    FIELD("split", "%d", c->split, c->split);
    FIELD("vocab_lo", "%d", c->vocab_lo, c->vocab_n);
    FIELD("vocab_n", "%d", c->vocab_n, c->vocab_n);
    FIELD("parts", "%d", c->parts, c->parts);
    FIELD("merge", "%d", c->merge, c->merge);
    FIELD("z_loss", "%g", c->z_loss, c->z_loss != 0);
    FIELD("dloss", "%g", c->dloss, c->dloss != 0);
    FIELD("step", "%d", c->step, c->step);
    FIELD("sr", "%d", c->stochastic, c->stochastic);
    FIELD("per", "%d", c->per, c->per); // FP8
    FIELD("a", "%s", c->fmt_a ? "e5m2" : "e4m3", c->fmt_a);
    FIELD("b", "%s", c->fmt_b ? "e5m2" : "e4m3", c->fmt_b);
    FIELD("ta", "%d", c->ta, c->ta);
    FIELD("tb", "%d", c->tb, c->tb);
    FIELD("dgelu", "%d", c->dgelu, c->dgelu);
    FIELD("grad_out", "%d", c->grad_out, c->grad_out);
    FIELD("gelu", "%d", c->gelu, c->gelu);
    FIELD("both", "%d", c->both, c->both);
#undef FIELD
}

// ---- selecting rows, seeding cases ------------------------------------------------------------------------

int opt_row_selected(const struct opt_row *row) {
    const char *sel = getenv("KILN_OP_TABLE_ROWS");
    if (!sel || !*sel)
        return 1;
    size_t len = strlen(row->name);
    for (const char *p = sel; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, row->name, n) == 0)
            return 1;
        p += n + (end ? 1 : 0);
    }
    return 0;
}

uint64_t opt_case_seed(uint64_t run_seed, const struct opt_row *row, int k) {
    uint64_t s = run_seed * 1000003u + (uint64_t)k;
    for (const char *p = row->name; *p; p++)
        s = s * 31u + (uint8_t)*p;
    return splitmix64(s);
}

// ---- metrics ----------------------------------------------------------------------------------------------

double opt_nmse(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == b[i])
            continue; // also equal infinities
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
    }
    for (size_t i = 0; i < n; i++)
        if (isfinite(b[i]))
            den += (double)b[i] * b[i];
    return den > 0 ? num / den : num;
}

double opt_rel_err_d(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if ((double)a[i] == b[i])
            continue;
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
    }
    for (size_t i = 0; i < n; i++)
        if (isfinite(b[i]))
            den += b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double opt_nmse_tol(const struct opt_inst *in, int i, const struct kiln_backend *gpu) {
    const struct opt_tensor *t = &in->t[i];
    const struct opt_tol *tol = &in->row->tol;
    if (t->nmse > 0)
        return t->nmse;
    if (t->role == OPT_DIN) {
        if (t->dtype != OPT_GRAD)
            return tol->grad;
        if (gpu->grad_dtype == KILN_BF16)
            return tol->pgrad > OPT_NMSE_BF16_GRAD ? tol->pgrad : OPT_NMSE_BF16_GRAD;
        return tol->pgrad;
    }
    return opt_dtype_on(gpu, t->dtype) == KILN_BF16 ? tol->out : tol->stat;
}
