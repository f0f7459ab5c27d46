# The PyTorch models kiln's baselines share (bench/torch_llama.py, torch_fsdp.py, torch_cp.py): RoPE in kiln's
# convention and a Llama-style model (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied head).
import torch, torch.nn as nn, torch.nn.functional as F
import torch.utils.checkpoint


def rope_tables(T, hs, theta, device):  # cos, sin of (T, hs/2): position t, frequency i
    inv = 1.0 / (theta ** (torch.arange(0, hs, 2, device=device, dtype=torch.float32) / hs))
    ang = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def rotate(x, cos, sin):  # x (..., T, hs): pairs (i, i + hs/2), HF Llama's rotate_half convention (kiln's too)
    # in f32, back in x's dtype: without autocast (FSDP2's mixed precision casts instead) a bf16 q rotated by
    # f32 tables would reach SDPA as f32 beside a bf16 v
    h = x.shape[-1] // 2
    a, b = x[..., :h].float(), x[..., h:].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


class LlamaBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.nh, self.kv, self.hs = heads, kv_heads, dim // heads
        self.n1, self.n2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.hs, bias=False)
        self.o = nn.Linear(heads * self.hs, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        nh, kv, hs = self.nh, self.kv, self.hs
        q, k, v = self.qkv(self.n1(x)).split([nh * hs, kv * hs, kv * hs], dim=-1)
        q = rotate(q.view(B, T, nh, hs).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, T, kv, hs).transpose(1, 2), cos, sin)
        v = v.view(B, T, kv, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != nh)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, nh * hs))
        g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    """ckpt: each block's activations recomputed in the backward (torch.utils.checkpoint)"""

    def __init__(self, vocab, dim, layers, heads, kv_heads, hidden, theta=500000.0, ckpt=False):
        super().__init__()
        self.theta, self.hs, self.ckpt = theta, dim // heads, ckpt
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([LlamaBlock(dim, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, tgt):
        cos, sin = rope_tables(idx.shape[1], self.hs, self.theta, idx.device)
        x = self.emb(idx)
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, use_reentrant=False) if self.ckpt else b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


def timed_steps(model, fn, opt, x, y, warmup, steps):
    """warmup steps, then steps timed by CUDA events (bf16 autocast, clipping at 1, AdamW): the mean ms a
    step, the last loss, and the seconds the warm-up took (compilation included). Peak memory is counted
    from after the warm-up."""
    import time

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    loss = None
    for _ in range(steps):
        loss = step()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / steps, float(loss), warm
