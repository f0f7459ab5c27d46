# PyTorch's counterpart of kiln's world-size-1 strategy rows (bench/strategies.sh): the GPT of the peer
# baseline (.peer/bench/torch_gpt.py: pre-norm blocks, SDPA, tied head, bf16 autocast, fused AdamW) trained on
# random tokens, plainly (--fsdp=0), under FSDP2's fully_shard at world size 1 (--fsdp=1, kiln's ZeRO-3) or
# with its CPUOffloadPolicy (--offload=1, kiln's ZeRO-3 + offload), with optional per-block activation
# checkpointing (--ckpt=1, kiln's --recompute=block) and torch.compile. Prints one JSON line: tokens/s and
# torch.cuda.max_memory_allocated. Failures print one "error: ..." line and exit 1; the process group has a
# timeout, so nothing waits forever. Under torchrun it runs FSDP2 across the GPUs (a GPU a rank), or with
# --fsdp=0 DistributedDataParallel (bucketed all-reduce overlapped with the backward, fp32 gradients) around
# the compiled model: kiln's DDP row. --arch=llama trains a Llama-shaped model instead (RoPE, RMSNorm, SwiGLU,
# GQA; kiln's llama-8b with --layers 32 --dim 4096 --heads 32 --kv-heads 8 --ffn 14336), built on the meta
# device under FSDP2 across GPUs, so that no rank holds the whole model.
import argparse, datetime, json, os, socket, sys, time

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=12)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--dim", type=int, default=768)
p.add_argument("--vocab", type=int, default=50304)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step")
p.add_argument("--steps", type=int, default=30)
p.add_argument("--warmup", type=int, default=5, help="steps before timing (compilation)")
p.add_argument("--fsdp", type=int, default=1)
p.add_argument("--offload", type=int, default=0)
p.add_argument("--ckpt", type=int, default=0)
p.add_argument("--compile", type=int, default=1)
p.add_argument("--arch", choices=["gpt", "llama"], default="gpt",
               help="llama: RoPE, RMSNorm, SwiGLU, GQA, no bias, untied (kiln's llama-8b with --kv-heads=8 "
                    "--ffn=14336; its no-bias LayerNorm variant is olmo-7b's shape)")
p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
p.add_argument("--ffn", type=int, default=0, help="llama: SwiGLU hidden width (0: 4 dim)")
p.add_argument("--rope-theta", type=float, default=500000.0)
a = p.parse_args()
a.kv_heads = a.kv_heads or a.heads
a.ffn = a.ffn or 4 * a.dim


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import torch, torch.nn as nn, torch.nn.functional as F
    import torch.distributed as dist
    from torch_models import Llama  # (bench/ is on the path: this script's folder)
except ImportError as e:
    fail(f"no PyTorch ({e}); pip install torch")
if not torch.cuda.is_available():
    fail("torch sees no CUDA device; this benchmark compares GPU memory and speed")
if a.offload and not a.fsdp:
    fail("--offload=1 needs --fsdp=1 (CPUOffloadPolicy is an FSDP2 policy)")
if a.fsdp:
    try:
        from torch.distributed.fsdp import fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy
    except ImportError as e:
        fail(f"this torch ({torch.__version__}) lacks FSDP2 ({e}); it needs torch >= 2.6")


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)

    def attn(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(x).split(C, dim=2)
        q, k, v = [t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return s.proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(s, x):
        x = x + s.attn(s.ln1(x))
        return x + s.fc2(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(a.vocab, a.dim); s.wpe = nn.Embedding(a.seq, a.dim)
        s.blocks = nn.ModuleList([Block(a.dim, a.heads) for _ in range(a.layers)])
        s.lnf = nn.LayerNorm(a.dim); s.head = nn.Linear(a.dim, a.vocab, bias=False)
        s.head.weight = s.wte.weight

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if a.ckpt else b(x)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


torch.backends.cuda.matmul.allow_tf32 = True
# under torchrun (bench/dist_multi_gpu.sh): a GPU a rank; tokens/s is then per GPU (each rank's batch)
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(dev)
ddp = not a.fsdp and int(os.environ.get("WORLD_SIZE", "1")) > 1
if a.fsdp or ddp:
    # world size 1 on localhost; the timeout turns a stuck collective into an error, not a hang
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    # (with CPUOffloadPolicy the gradients and parameters live on the host, and clip_grad_norm_'s reduction of
    # their norms runs on CPU tensors: NCCL alone has no CPU backend, so several ranks need gloo beside it, as
    # torchtitan sets up: the likely cause of the failed 4-rank offload rows of 2026-11-26; at 1 rank nothing reduces)
    backend = "cuda:nccl,cpu:gloo" if a.offload else "nccl"
    try:
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=120),
                                device_id=dev)
    except Exception as e:
        fail(f"cannot start the process group ({backend}, {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}): {e}")

torch.manual_seed(1337)
if a.arch == "llama" and (a.heads % a.kv_heads or a.dim % a.heads or (a.dim // a.heads) % 2):
    fail(f"--arch=llama needs heads ({a.heads}) divisible by --kv-heads ({a.kv_heads}) and an even head size")
# (the GPT's tied head stays on the device as before: only the untied Llama is built on the meta device)
meta = a.arch == "llama" and a.fsdp and int(os.environ.get("WORLD_SIZE", "1")) > 1
with torch.device("meta" if meta else dev):
    m = (Llama(a.vocab, a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.rope_theta, ckpt=bool(a.ckpt))
         if a.arch == "llama" else GPT())
n_params = sum(p.numel() for p in m.parameters())


def gpt2_init(model):  # matrices N(0, 0.02), biases 0, norm weights 1: kiln's init (PyTorch's defaults gave
    with torch.no_grad():  # losses near 68 after 40 steps of random tokens; the step time does not change)
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(0.0 if name.endswith("bias") else 1.0)


if not meta:
    gpt2_init(m)
if a.fsdp:
    # like kiln's ZeRO-3: bf16 compute copy, fp32 gradient reduction and master; each block its own unit
    # (the Llama's blocks take the f32 RoPE tables as inputs: FSDP2 would cast them to bf16 in the forward but
    # not in checkpoint's recompute, which then fails its metadata check; the activations are bf16 already)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                              cast_forward_inputs=a.arch != "llama")
    kw = dict(mp_policy=mp)
    if a.offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for i, b in enumerate(m.blocks):
        if a.compile:  # per block, before sharding, as torchtitan does: FSDP2's hooks stay outside the graphs
            b = torch.compile(b)
            m.blocks[i] = b
        fully_shard(b, **kw)
    fully_shard(m, **kw)  # embeddings, final norm and the tied head
    if any(p.is_meta for p in m.parameters()):  # built on the meta device: each rank materialises its shard
        m.to_empty(device=dev)
        gpt2_init(m)
opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                        fused=not a.offload)  # offloaded parameters live on the CPU: no fused CUDA AdamW
step_fn = m
if ddp:  # compile around DDP, as its documentation recommends (DDPOptimizer splits the graph at the buckets)
    step_fn = torch.nn.parallel.DistributedDataParallel(m, device_ids=[dev.index])
if a.compile and not a.fsdp:
    step_fn = torch.compile(step_fn)
x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)


def step():
    for _ in range(a.accum):
        if a.fsdp:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):
                loss = step_fn(x, y) / a.accum  # FSDP2's policy casts to bf16
        else:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_fn(x, y) / a.accum
        loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


try:
    t0 = time.time()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    ms = (time.time() - t0) * 1e3 / a.steps
except torch.cuda.OutOfMemoryError as e:
    fail(f"out of GPU memory at batch {a.batch}, seq {a.seq}: {str(e).splitlines()[0]}")
tokens = a.batch * a.seq * a.accum
if int(os.environ.get("RANK", "0")) == 0:
    impl = "pytorch-fsdp2" if a.fsdp else "pytorch-ddp" if ddp else "pytorch"
    print(json.dumps(dict(impl=impl, offload=a.offload, ckpt=a.ckpt,
                        compile=a.compile, arch=a.arch, layers=a.layers, dim=a.dim, heads=a.heads, vocab=a.vocab, seq=a.seq,
                        batch=a.batch, accum=a.accum, params_M=round(n_params / 1e6, 1),
                        ms_per_step=round(ms, 2), tokens_per_s=round(tokens / (ms / 1e3)),
                        peak_mem_bytes=torch.cuda.max_memory_allocated(), warmup_s=round(warm_s, 1),
                        loss=float(loss) * a.accum, world=int(os.environ.get("WORLD_SIZE", "1")))))
if a.fsdp or ddp:
    dist.destroy_process_group()
