// The tensor-core block-attention kernels (src/backend/cuda/attention/attention_block_tc.cu) run on the CPU, through
// the SIMT emulation of tests/emu/shim (threads, barriers, shuffles, mma.sync's fragment layouts), against
// the CPU backend's block op, the reference. No GPU needed: what the kernels compute (indexing, masks, the
// online softmax, the lse merge, RoPE at global positions, ALiBi with global heads, GQA, the backward's sums)
// is checked on every machine. Not checked here: speed, and what only the hardware does (the real mma unit's
// summation order). Per case, as test_cuda_ops does on a GPU: one block with no key visible (out 0, lse
// -inf), then query blocks against key blocks cut elsewhere, merged in a shuffled order with accumulate,
// then the backward of every pair added onto the same starting gradients.
extern "C" {
#include "core/backend.h"
#include "core/ops.h"
#include "util/error.h"
}
#include "backend/cuda/attention/attention_block_tc.cu"

#include <stdio.h>

#include <random>
#include <vector>

static int failures;

struct tcase {
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;
    int head0, NH_total, pad, base, nqb;
};

// relative error ||a - b|| / ||b|| over n values; NaN anywhere fails
static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check(const char *what, const char *shape, double err, double tol) {
    int ok = err <= tol;
    printf("%-28s %-40s rel_err %.2e  tol %.0e  %s\n", what, shape, err, tol, ok ? "PASS" : "FAIL");
    fflush(stdout);
    failures += !ok;
}

static float round_bf16(float f) {
    return bf2f(f2bf(f));
}

// Both sides' copy of one tensor: f32 in the CPU backend's memory, bf16 for the emulated kernels.
struct twin {
    struct kiln_backend *cpu;
    size_t n;
    float *c;             // CPU backend allocation (act dtype f32)
    std::vector<bf16> g;  // the kernels' side
    std::vector<float> h; // host values, set on both sides
    void init(struct kiln_backend *b, size_t count) {
        cpu = b, n = count;
        c = (float *)cpu->ops->alloc(cpu->ctx, n * sizeof(float) + 16);
        g.assign(n, f2bf(0.0f));
        h.assign(n, 0.0f);
    }
    void set() { // h (rounded to bf16) to both sides
        for (size_t i = 0; i < n; i++) {
            h[i] = round_bf16(h[i]);
            g[i] = f2bf(h[i]);
        }
        cpu->ops->upload_f32(cpu->ctx, c, KILN_F32, h.data(), n);
    }
    std::vector<float> get_cpu() {
        std::vector<float> x(n);
        cpu->ops->download_f32(cpu->ctx, x.data(), c, KILN_F32, n);
        return x;
    }
    std::vector<float> get_emu() {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; i++)
            x[i] = bf2f(g[i]);
        return x;
    }
    void done() {
        cpu->ops->free(cpu->ctx, c);
    }
};

// The kernels' parameters as attention_block.cu's blk_setup makes them (blk_params_of), with the RoPE tables
// built on the host as rope_table_kernel builds them (double precision)
static struct blk_params setup(const struct kiln_attn_block_args *a, std::vector<float> &rope) {
    struct blk_params p = blk_params_of(a);
    if (a->pos == KILN_POS_ROPE) {
        int npos = blk_positions(a), half = a->HS / 2;
        rope.assign((size_t)2 * npos * half, 0.0f);
        for (int t = 0; t < npos; t++)
            for (int d = 0; d < half; d++) {
                double ang = (double)t * pow((double)a->rope_theta, -2.0 * d / (2.0 * half));
                rope[(size_t)t * half + d] = (float)cos(ang);
                rope[(size_t)npos * half + (size_t)t * half + d] = (float)sin(ang);
            }
        p.cos_tab = rope.data();
        p.sin_tab = rope.data() + (size_t)npos * half;
    }
    return p;
}

// As the launchers' tc_prepare: with RoPE, q and k rotated into a host buffer by tc_rope_kernel (a few
// blocks, grid-stride), then the tile sources planned on it.
static struct tc_params emu_prepare(const struct blk_params &p, std::vector<bf16> &rot) {
    rot.assign(tc_rot_elems(p) + 8, f2bf(0.0f));
    struct tc_params tp = tc_plan(p, rot.data());
    if (tp.rot)
        emu_launch(3, 1, 64, 0, [&] { tc_rope_kernel(tp); });
    return tp;
}

template <int HS> static void emu_forward(const struct blk_params &p) {
    std::vector<bf16> rot;
    struct tc_params tp = emu_prepare(p, rot);
    emu_launch(KILN_CEIL_DIV(p.Tq, TC_ROWS), p.B * p.NH, TC_THREADS, tc_fwd_smem(HS),
               [&] { tc_fwd_kernel<HS>(tp); });
}

template <int HS> static void emu_backward(const struct blk_params &p) {
    std::vector<bf16> rot;
    struct tc_params tp = emu_prepare(p, rot);
    emu_launch(KILN_CEIL_DIV(p.Tq, TC_ROWS), p.B * p.NH, TC_THREADS, tc_dq_smem(HS),
               [&] { tc_dq_kernel<HS>(tp); });
    emu_launch(KILN_CEIL_DIV(p.Tk, TC_ROWS), p.B * p.NKV, TC_THREADS, tc_dkdv_smem(HS),
               [&] { tc_dkdv_kernel<HS>(tp); });
}

struct bufs {
    const tcase *c;
    size_t W, rows, ors, lse_s;
    twin qkv, out, dout, dqkv;
    std::vector<float> lse_c; // the CPU's lse (f32 on both sides: no rounding)
    float *lse_cpu;           // CPU backend allocation
    std::vector<float> lse_g; // the kernels'
};

// the op's arguments for queries [i0, i0 + Tq) against keys [j0, j0 + Tk); side 0 = CPU, 1 = emulated
static void fwd_args(struct kiln_attn_block_args *a, bufs &u, int side, int i0, int Tq, int j0, int Tk,
                     int acc) {
    const tcase *c = u.c;
    memset(a, 0, sizeof(*a));
    size_t qa = (size_t)i0 * u.W, ka = (size_t)j0 * u.W + (size_t)c->NH * c->HS,
           va = (size_t)j0 * u.W + (size_t)(c->NH + c->NKV) * c->HS;
    if (side == 0) {
        a->out = u.out.c + (size_t)i0 * u.ors;
        a->lse = u.lse_cpu + i0;
        a->q = u.qkv.c + qa, a->k = u.qkv.c + ka, a->v = u.qkv.c + va;
    } else {
        a->out = u.out.g.data() + (size_t)i0 * u.ors;
        a->lse = u.lse_g.data() + i0;
        a->q = u.qkv.g.data() + qa, a->k = u.qkv.g.data() + ka, a->v = u.qkv.g.data() + va;
    }
    a->B = c->B, a->Tq = Tq, a->Tk = Tk, a->NH = c->NH, a->NKV = c->NKV, a->HS = c->HS;
    a->q0 = c->base + i0, a->k0 = c->base + j0;
    a->q_bstride = a->kv_bstride = u.rows * u.W;
    a->out_bstride = u.rows * u.ors;
    a->lse_stride = u.lse_s;
    a->q_stride = a->kv_stride = (int)u.W;
    a->out_stride = (int)u.ors;
    a->pos = c->pos;
    a->rope_theta = 10000.0f;
    a->head0 = c->head0, a->NH_total = c->NH_total;
    a->accumulate = acc;
}

static void run_forward(struct kiln_backend *cpu, bufs &u, int i0, int Tq, int j0, int Tk, int acc) {
    struct kiln_attn_block_args ac, ag;
    fwd_args(&ac, u, 0, i0, Tq, j0, Tk, acc);
    fwd_args(&ag, u, 1, i0, Tq, j0, Tk, acc);
    cpu->ops->attention_block_forward(cpu->ctx, &ac);
    std::vector<float> rope;
    struct blk_params p = setup(&ag, rope);
    p.out = (bf16 *)ag.out;
    p.lse = ag.lse;
    p.accumulate = acc;
    if (u.c->HS == 64)
        emu_forward<64>(p);
    else
        emu_forward<128>(p);
}

static void run_backward(struct kiln_backend *cpu, bufs &u, int i0, int Tq, int j0, int Tk) {
    const tcase *c = u.c;
    struct kiln_attn_block_back_args bc;
    memset(&bc, 0, sizeof(bc));
    fwd_args(&bc.blk, u, 0, i0, Tq, j0, Tk, 0);
    size_t qa = (size_t)i0 * u.W, ka = (size_t)j0 * u.W + (size_t)c->NH * c->HS,
           va = (size_t)j0 * u.W + (size_t)(c->NH + c->NKV) * c->HS;
    bc.dq = u.dqkv.c + qa, bc.dk = u.dqkv.c + ka, bc.dv = u.dqkv.c + va;
    bc.dout = u.dout.c + (size_t)i0 * u.ors;
    cpu->ops->attention_block_backward(cpu->ctx, &bc);

    struct kiln_attn_block_args ag;
    fwd_args(&ag, u, 1, i0, Tq, j0, Tk, 0);
    std::vector<float> rope;
    struct blk_params p = setup(&ag, rope);
    p.out = (bf16 *)ag.out;
    p.lse = ag.lse;
    p.dout = u.dout.g.data() + (size_t)i0 * u.ors;
    p.dq = u.dqkv.g.data() + qa, p.dk = u.dqkv.g.data() + ka, p.dv = u.dqkv.g.data() + va;
    // D = rowsum(dout * out), as blk_dsum_kernel
    std::vector<float> dsum((size_t)c->B * c->NH * Tq);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int i = 0; i < Tq; i++) {
                size_t off = b * ag.out_bstride + (size_t)i * ag.out_stride + (size_t)h * c->HS;
                float s = 0;
                for (int d = 0; d < c->HS; d++)
                    s = fmaf(bf2f(p.dout[off + d]), bf2f(p.out[off + d]), s);
                dsum[((size_t)b * c->NH + h) * Tq + i] = s;
            }
    p.dsum = dsum.data();
    if (c->HS == 64)
        emu_backward<64>(p);
    else
        emu_backward<128>(p);
}

// columns [off, off + w) of rows [r0, r1) of every batch
static std::vector<float> cols(const std::vector<float> &x, const bufs &u, size_t rs, int r0, int r1,
                               size_t off, size_t w) {
    std::vector<float> y;
    for (int b = 0; b < u.c->B; b++)
        for (int r = r0; r < r1; r++)
            for (size_t i = 0; i < w; i++)
                y.push_back(x[((size_t)b * u.rows + r) * rs + off + i]);
    return y;
}

static void run_case(struct kiln_backend *cpu, const tcase &c, std::mt19937 &rng) {
    bufs u;
    u.c = &c;
    int B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, HS = c.HS, nqb = c.nqb, nkb = c.nqb + 1, S = T / nqb;
    size_t C = (size_t)NH * HS;
    u.W = (size_t)(NH + 2 * NKV) * HS + c.pad;
    u.rows = (size_t)T + (c.pad ? 1 : 0);
    u.ors = C + c.pad;
    u.lse_s = (size_t)T + c.pad;
    char sh[128];
    snprintf(sh, sizeof(sh), "B=%d T=%d NH=%d/%d HS=%d %s h0=%d/%d pad=%d base=%d", B, T, NH, NKV, HS,
             c.pos == KILN_POS_ROPE    ? "rope"
             : c.pos == KILN_POS_ALIBI ? "alibi"
                                       : "none",
             c.head0, c.NH_total, c.pad, c.base);
    u.qkv.init(cpu, (size_t)B * u.rows * u.W);
    u.out.init(cpu, (size_t)B * u.rows * u.ors);
    u.dout.init(cpu, (size_t)B * u.rows * u.ors);
    u.dqkv.init(cpu, (size_t)B * u.rows * u.W);
    size_t n_lse = (size_t)B * NH * u.lse_s;
    u.lse_cpu = (float *)cpu->ops->alloc(cpu->ctx, n_lse * sizeof(float) + 16);
    u.lse_g.assign(n_lse, 0.0f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float &x : u.qkv.h)
        x = nd(rng);
    u.qkv.set();
    for (float &x : u.out.h)
        x = nd(rng); // overwritten by each query block's first call
    u.out.set();
    std::vector<float> l0(n_lse);
    for (float &x : l0)
        x = nd(rng);
    cpu->ops->upload_f32(cpu->ctx, u.lse_cpu, KILN_F32, l0.data(), n_lse);
    u.lse_g = l0;

    // a block no query sees, no accumulate: out = 0 and lse = -inf on the kernels' side
    run_forward(cpu, u, 0, S, S, S, 0);
    int zero = 1, ninf = 1;
    std::vector<float> og = u.out.get_emu();
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++) {
            for (size_t d = 0; d < C; d++)
                zero &= og[((size_t)b * u.rows + i) * u.ors + d] == 0.0f;
            for (int h = 0; h < NH; h++) {
                float l = u.lse_g[((size_t)b * NH + h) * u.lse_s + i];
                ninf &= isinf(l) && l < 0;
            }
        }
    check("fwd masked: out 0, lse -inf", sh, zero && ninf ? 0.0 : INFINITY, 0.0);

    // every (query block, key block) pair merged in a shuffled order; key blocks cut elsewhere than queries;
    // query block 0 starts with a key block it cannot see
    int kb_at[17];
    for (int kb = 0; kb <= nkb; kb++)
        kb_at[kb] = kb * T / nkb;
    std::vector<std::vector<int>> order(nqb);
    for (int qb = 0; qb < nqb; qb++) {
        for (int k = 0; k < nkb; k++)
            order[qb].push_back(k);
        std::shuffle(order[qb].begin(), order[qb].end(), rng);
        if (qb == 0)
            for (int k = 1; k < nkb; k++)
                if (order[0][k] == nkb - 1)
                    std::swap(order[0][k], order[0][0]);
        for (int k = 0; k < nkb; k++) {
            int kb = order[qb][k];
            run_forward(cpu, u, qb * S, S, kb_at[kb], kb_at[kb + 1] - kb_at[kb], k > 0);
        }
    }
    std::vector<float> oc = u.out.get_cpu();
    og = u.out.get_emu();
    check("fwd merged: out", sh,
          rel_err(cols(og, u, u.ors, 0, T, 0, C).data(), cols(oc, u, u.ors, 0, T, 0, C).data(),
                  (size_t)B * T * C),
          2e-2);
    std::vector<float> lc(n_lse), lg, lcf, lgf;
    cpu->ops->download_f32(cpu->ctx, lc.data(), u.lse_cpu, KILN_F32, n_lse);
    int inf_agree = 1;
    for (int bh = 0; bh < B * NH; bh++)
        for (int i = 0; i < T; i++) {
            float a = u.lse_g[(size_t)bh * u.lse_s + i], b = lc[(size_t)bh * u.lse_s + i];
            if (isinf(a) || isinf(b))
                inf_agree &= a == b;
            else
                lgf.push_back(a), lcf.push_back(b);
        }
    check("fwd merged: lse", sh, inf_agree ? rel_err(lgf.data(), lcf.data(), lgf.size()) : INFINITY, 1e-3);

    // the backward of every pair, dq, dk, dv added onto the same small values on both sides
    for (float &x : u.dout.h)
        x = nd(rng);
    u.dout.set();
    for (float &x : u.dqkv.h)
        x = 0.05f * nd(rng);
    u.dqkv.set();
    for (int qb = 0; qb < nqb; qb++)
        for (int k = nkb - 1; k >= 0; k--) {
            int kb = order[qb][k];
            run_backward(cpu, u, qb * S, S, kb_at[kb], kb_at[kb + 1] - kb_at[kb]);
        }
    std::vector<float> dc = u.dqkv.get_cpu(), dg = u.dqkv.get_emu();
    size_t off[4] = {0, C, (size_t)(NH + NKV) * HS, (size_t)(NH + 2 * NKV) * HS};
    const char *names[3] = {"bwd: dq", "bwd: dk", "bwd: dv"};
    for (int part = 0; part < 3; part++) {
        size_t w = off[part + 1] - off[part];
        std::vector<float> a = cols(dg, u, u.W, 0, T, off[part], w), b = cols(dc, u, u.W, 0, T, off[part], w);
        check(names[part], sh, rel_err(a.data(), b.data(), a.size()), 4e-2);
    }
    u.qkv.done();
    u.out.done();
    u.dout.done();
    u.dqkv.done();
    cpu->ops->free(cpu->ctx, u.lse_cpu);
}

int main(void) {
    struct kiln_backend cpu;
    struct kiln_backend_opts o;
    memset(&o, 0, sizeof(o));
    o.threads = 1;
    struct kiln_error err;
    if (kiln_backend_open("cpu", &o, &cpu, &err)) {
        fprintf(stderr, "cannot open the cpu backend: %s\n", err.msg);
        return 1;
    }
    unsigned seed =
        getenv("KILN_TEST_SEED") ? (unsigned)atoi(getenv("KILN_TEST_SEED")) : std::random_device{}();
    printf("seed %u (KILN_TEST_SEED=%u runs it again)\n", seed, seed);
    std::mt19937 rng(seed);
    // RoPE at shifted positions with GQA, ALiBi with global heads (NH_total not a power of two) and odd
    // strides, no positions with B = 2; HS 64 and 128; lengths that are not multiples of the tiles. The tiles
    // are staged by cp.async where a source's rows allow 16-byte copies and by plain loads where not (pad =
    // 1: odd strides): q and k are rotated copies with RoPE, the inputs without. One case has blocks of 3 to
    // 5 tiles (the double buffers alternate, the dK/dV loop crosses heads), at positions past 1000.
    const tcase cases[] = {
        {1, 100, 4, 2, 64, KILN_POS_ROPE, 0, 0, 0, 37, 2},
        {1, 70, 2, 1, 128, KILN_POS_ALIBI, 1, 3, 1, 50, 2},
        {2, 48, 2, 2, 64, KILN_POS_NONE, 0, 0, 0, 0, 3},
        {1, 130, 2, 1, 128, KILN_POS_ROPE, 0, 0, 0, 0, 2},
        {1, 300, 4, 2, 128, KILN_POS_ROPE, 0, 0, 0, 1000, 1},
        {2, 70, 4, 1, 64, KILN_POS_ROPE, 0, 0, 1, 3, 2},
        {1, 90, 4, 2, 64, KILN_POS_ALIBI, 2, 7, 0, 11, 2},
    };
    for (const tcase &c : cases)
        run_case(&cpu, c, rng);
    kiln_backend_close(&cpu);
    printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
