# PyTorch's counterpart of kiln's sequence parallelism (bench/dist_multi_gpu.sh, part long): the peer
# baseline's GPT (.peer/bench/torch_gpt.py: pre-norm blocks, SDPA, tied head, fused AdamW; per-block
# activation checkpointing) with RoPE instead of learned positions, as kiln's long-context rows run, trained on one random sequence of --seq tokens split over
# the GPUs by PyTorch's context parallelism (torch.distributed.tensor.experimental.context_parallel: ring
# attention over SDPA, causal load balancing), with FSDP2 over the same GPUs for the gradients. Run under
# torchrun, a GPU a rank. Prints one JSON line (rank 0): tokens/s of the whole sequence, ms a step and the peak
# memory of a GPU. Failures print one "error: ..." line and exit 1; the process group has a timeout.
import argparse, datetime, json, os, sys, time

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=24)
p.add_argument("--heads", type=int, default=16)
p.add_argument("--dim", type=int, default=2048)
p.add_argument("--vocab", type=int, default=50304)
p.add_argument("--seq", type=int, default=131072)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--rotate", choices=["allgather", "alltoall"], default="alltoall",
               help="how K/V blocks pass between ranks (set_rotate_method)")
a = p.parse_args()


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import torch, torch.nn as nn, torch.nn.functional as F
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import sdpa_kernel, SDPBackend
    from torch_models import rope_tables, rotate  # (bench/ is on the path: this script's folder)
except ImportError as e:
    fail(f"this PyTorch lacks context parallelism or FSDP2 ({e})")
try:  # (a private module, which has moved between releases: without it, PyTorch's default rotation)
    from torch.distributed.tensor.experimental._attention import set_rotate_method
except ImportError:
    set_rotate_method = None
if "RANK" not in os.environ:
    fail("run under torchrun (a GPU a rank): torchrun --standalone --nproc-per-node=N bench/torch_cp.py")
world = int(os.environ["WORLD_SIZE"])
if a.seq % (2 * world):
    fail(f"--seq {a.seq} is not a multiple of 2 x {world} ranks (causal load balancing cuts 2 chunks a rank)")


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v)]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # ring attention under context_parallel
        x = x + s.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.fc2(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(a.vocab, a.dim)
        s.blocks = nn.ModuleList([Block(a.dim, a.heads) for _ in range(a.layers)])
        s.lnf = nn.LayerNorm(a.dim); s.head = nn.Linear(a.dim, a.vocab, bias=False)
        s.head.weight = s.wte.weight

    def forward(s, idx, cos, sin, tgt):  # cos, sin: the rank's global positions' (buffers context_parallel shards)
        x = s.wte(idx)
        for b in s.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, use_reentrant=False)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(dev)
try:
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=300), device_id=dev)
except Exception as e:
    fail(f"cannot start the process group: {e}")
mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
if set_rotate_method:
    set_rotate_method(a.rotate)
torch.manual_seed(1337)
m = GPT().to(dev)
with torch.no_grad():  # GPT-2's init, as kiln's (PyTorch's defaults gave a first loss near 180, not ln(vocab))
    for name, q in m.named_parameters():
        q.normal_(0.0, 0.02) if q.dim() > 1 else q.fill_(0.0 if name.endswith("bias") else 1.0)
n_params = sum(q.numel() for q in m.parameters())
# (not casting the blocks' inputs: FSDP2 would cast the f32 RoPE tables to bf16 in the forward but not in
# checkpoint's recompute, which then fails its metadata check; the activations are bf16 already)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
for b in m.blocks:
    fully_shard(b, mesh=mesh, mp_policy=mp)
fully_shard(m, mesh=mesh, mp_policy=mp)
opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
x = torch.randint(0, a.vocab, (1, a.seq), device=dev)
y = torch.randint(0, a.vocab, (1, a.seq), device=dev)
cos, sin = rope_tables(a.seq, a.dim // a.heads, 10000.0, dev)  # (T, hs/2): sharded with the tokens


def step():
    # context_parallel shards x, y, cos and sin along the sequence on entry (the same load-balanced chunks) and
    # routes SDPA through its ring; the backward runs inside it too
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        with context_parallel(mesh, buffers=[x, y, cos, sin], buffer_seq_dims=[1, 1, 0, 0],
                              no_restore_buffers={x, y, cos, sin}):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):  # FSDP2's policy casts to bf16
                loss = m(x, cos, sin, y)
            loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


try:
    # (the buffers stay sharded after the first step: no_restore_buffers; keep the full ones to reset them)
    full = (x.clone(), y.clone(), cos.clone(), sin.clone())

    def reset():
        global x, y, cos, sin
        x, y, cos, sin = (t.clone() for t in full)

    t0 = time.time()
    for _ in range(a.warmup):
        reset()
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    ms = 0.0
    for _ in range(a.steps):
        reset()
        torch.cuda.synchronize()
        t0 = time.time()
        loss = step()
        torch.cuda.synchronize()
        ms += (time.time() - t0) * 1e3
    ms /= a.steps
except torch.cuda.OutOfMemoryError as e:
    fail(f"out of GPU memory at seq {a.seq} over {world} GPUs: {str(e).splitlines()[0]}")
if dist.get_rank() == 0:
    print(json.dumps(dict(impl="pytorch-cp", rotate=a.rotate if set_rotate_method else "default", layers=a.layers, dim=a.dim, heads=a.heads,
                          seq=a.seq, world=world, params_M=round(n_params / 1e6, 1), ms_per_step=round(ms, 2),
                          tokens_per_s=round(a.seq / (ms / 1e3)), peak_mem_bytes=torch.cuda.max_memory_allocated(),
                          warmup_s=round(warm_s, 1), loss=float(loss))))
dist.destroy_process_group()
