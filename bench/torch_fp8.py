# The PyTorch peer of kiln's --precision=fp8: the same GPT (or Llama) with every linear layer of its blocks
# run through torch._scaled_mm with tensorwise scales (each operand scaled by fmax / its amax, computed just
# before its cast: torchtitan's default recipe), e4m3 for weights and activations and e5m2 for the output
# gradients, everything else in bf16 autocast, under torch.compile. torchao is not assumed to be installed;
# this is the recipe it runs, written out. --fp8 0 gives the bf16 model for the same call's ratio.
# Prints one JSON line (tok/s, MFU against the bf16 peak, peak memory, the last loss).
import argparse, json
import torch, torch.nn as nn, torch.nn.functional as F

from torch_models import Llama, timed_steps  # (bench/ is on the path: this script's folder)

ap = argparse.ArgumentParser()
ap.add_argument("--model", choices=["gpt", "llama"], default="gpt")
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--dim", type=int, default=768)
ap.add_argument("--heads", type=int, default=12)
ap.add_argument("--kv-heads", type=int, default=8)  # llama
ap.add_argument("--hidden", type=int, default=5632)  # llama
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--vocab", type=int, default=50304)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=8)
ap.add_argument("--fp8", type=int, default=1)
ap.add_argument("--peak", type=float, default=989e12)
args = ap.parse_args()

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def cast(t, dtype):
    """t's codes in dtype with a tensorwise scale, and the inverse scale _scaled_mm multiplies back by"""
    fmax = torch.finfo(dtype).max
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    s = fmax / amax
    return (t.float() * s).clamp(-fmax, fmax).to(dtype), s.reciprocal()


class ScaledLinearFn(torch.autograd.Function):
    """y = x W^T with all three GEMMs in FP8; the backward is the unquantized layer's (straight through)"""

    @staticmethod
    def forward(ctx, x, w):
        xq, xi = cast(x, E4M3)
        wq, wi = cast(w, E4M3)
        ctx.save_for_backward(xq, xi, wq, wi)
        ctx.w_dtype = w.dtype
        # _scaled_mm: a row-major (M, K), b column-major (K, N)
        return torch._scaled_mm(xq, wq.t(), scale_a=xi, scale_b=wi, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        xq, xi, wq, wi = ctx.saved_tensors
        gq, gi = cast(dy, E5M2)
        dx = torch._scaled_mm(gq, wq.t().contiguous().t(), scale_a=gi, scale_b=wi, out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(gq.t().contiguous(), xq.t().contiguous().t(), scale_a=gi, scale_b=xi,
                              out_dtype=ctx.w_dtype)
        return dx, dw


class FP8Linear(nn.Linear):
    def forward(self, x):
        shape = x.shape
        y = ScaledLinearFn.apply(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight)
        y = y.view(*shape[:-1], y.shape[-1])
        return y + self.bias.to(y.dtype) if self.bias is not None else y


def to_fp8(blocks):
    """every nn.Linear inside the blocks as an FP8Linear (the same parameters)"""
    for mod in blocks.modules():
        for name, child in list(mod.named_children()):
            if type(child) is nn.Linear:
                child.__class__ = FP8Linear


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


torch.backends.cuda.matmul.allow_tf32 = True
if args.model == "gpt":
    m = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq).cuda()
else:
    m = Llama(args.vocab, args.dim, args.layers, args.heads, args.kv_heads, args.hidden).cuda()
if args.fp8:
    to_fp8(m.blocks)
n_params = sum(p.numel() for p in m.parameters())
opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
fn = torch.compile(m)
x = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
y = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")


ms, loss, warm = timed_steps(m, fn, opt, x, y, args.warmup, args.steps)
tok_s = args.batch * args.seq / (ms / 1e3)
hs = args.dim // args.heads
fpt = 6 * n_params + 12 * args.layers * args.heads * hs * args.seq
print(json.dumps(dict(impl="pytorch", precision="fp8" if args.fp8 else "bf16", model=args.model,
                      layers=args.layers, dim=args.dim, seq=args.seq, batch=args.batch,
                      params_M=round(n_params / 1e6, 1), ms_per_step=round(ms, 2), tok_per_s=round(tok_s),
                      mfu_989=round(fpt * tok_s / args.peak, 4), warmup_s=round(warm, 1),
                      peak_mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 2), loss=loss)))
