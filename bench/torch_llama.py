# Llama-style peer baseline for kiln's llama presets: the nanoGPT-style GPT baseline (torch_gpt.py, not shipped)
# extended to RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied head. bf16 autocast, SDPA
# flash attention, fused AdamW, torch.compile; random tokens. Prints one JSON line like torch_gpt.py.
import argparse, json
import torch

from torch_models import Llama, timed_steps  # (bench/ is on the path: this script's folder)

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=16)
ap.add_argument("--dim", type=int, default=2048)
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv-heads", type=int, default=8)
ap.add_argument("--hidden", type=int, default=5632)
ap.add_argument("--theta", type=float, default=500000.0)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--vocab", type=int, default=50304)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=8)
ap.add_argument("--compile", type=int, default=1)
ap.add_argument("--peak", type=float, default=989e12)
args = ap.parse_args()
HS = args.dim // args.heads


torch.backends.cuda.matmul.allow_tf32 = True
m = Llama(args.vocab, args.dim, args.layers, args.heads, args.kv_heads, args.hidden, args.theta).cuda()
n_params = sum(p.numel() for p in m.parameters())
opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
fn = torch.compile(m) if args.compile else m
x = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
y = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")


ms, loss, warm = timed_steps(m, fn, opt, x, y, args.warmup, args.steps)
tok_s = args.batch * args.seq / (ms / 1e3)
fpt = 6 * n_params + 12 * args.layers * args.heads * HS * args.seq
print(json.dumps(dict(impl="pytorch-llama", layers=args.layers, dim=args.dim, heads=args.heads,
                      kv_heads=args.kv_heads, hidden=args.hidden, seq=args.seq, batch=args.batch,
                      params_M=round(n_params / 1e6, 1), ms_per_step=round(ms, 2), tok_per_s=round(tok_s),
                      mfu_989=round(fpt * tok_s / args.peak, 4), warmup_s=round(warm, 1),
                      peak_mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 2), loss=loss)))
