# PyTorch Lightning's side of the minGPT/Lightning benchmark table (bench/lightning_table.sh): a minGPT-style
# char-level GPT (GPT-2 124M's shape: 12 layers, 12 heads, 768 wide, learned positions, pre-LayerNorm, GELU MLP
# 4x, tied head, biases; the vocabulary = the text's distinct characters padded to a multiple of 128, as kiln
# pads) trained on Tiny Shakespeare by a Lightning Trainer under DDP, FSDP (FULL_SHARD, a unit a block), FSDP
# with cpu_offload, or FSDP with per-block activation checkpointing, in bf16-mixed precision.
#
#   python3 bench/lightning_gpt.py [--strategy=S[,S...]] [--devices=N]     (S: ddp, fsdp, fsdp-offload, fsdp-ac)
#                                  [--batch-sizes=64,256,1024] [--steps=10] [--warmup=3] [--seq=128]
#                                  [--data=data/tinyshakespeare.txt] [--precision=bf16-mixed] [--compile=0|1]
#                                  [--lr=6e-4] [--pg-timeout=120]
#
# Run it directly: with --devices=N > 1 Lightning starts the other ranks itself (it runs this script again with
# LOCAL_RANK set). The batch sizes (sequences per GPU) run in turn, ascending, in the same processes, each
# with a new model and a new Trainer. The data: one token a character; sample i is (chars[i:i+T],
# chars[i+1:i+T+1]), so an epoch is len(text) - T samples (every start position once, as minGPT's
# CharDataset), drawn by the DistributedSampler that Lightning puts in (shuffled, seed 1337).
#
# Timing: a callback synchronizes the GPU at the end of every batch (after the optimizer step); the first
# --warmup batches are not timed, and tokens/s = steps * batch * T * devices / (the time from the end of the
# last warm-up batch to the end of the last timed one): the whole job's rate, data loading included. Peak
# memory: rank 0's torch.cuda.max_memory_allocated over the fit. epoch_s = the epoch's tokens / tokens/s.
#
# Output: rank 0 prints one JSON line per batch size,
#   {"strategy","devices","batch","seq","tokens_per_s","epoch_s","peak_mem_bytes","loss",...}
# A rank that runs out of GPU memory prints {"strategy","devices","batch","error":"oom"} and leaves at once
# with exit status 3 (os._exit: the other ranks may wait in a collective that will never finish; the larger
# batch sizes and the strategies after it are not run: bench/lightning_table.sh starts those again). Any other failure: one "error: ..." line on stderr and exit status 1.
import argparse, datetime, gc, json, os, sys, time

p = argparse.ArgumentParser(description="PyTorch Lightning GPT-2 124M char-level benchmark (see the header)")
p.add_argument("--strategy", default="ddp",
               help="ddp, fsdp, fsdp-offload or fsdp-ac, or several comma-separated: run in turn in the same "
                    "processes (one start-up and process group for all)")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--batch-sizes", default="64,256,1024", help="sequences per GPU, comma-separated")
p.add_argument("--steps", type=int, default=10, help="timed steps")
p.add_argument("--warmup", type=int, default=3, help="untimed steps first (at least 1)")
p.add_argument("--seq", type=int, default=128, help="block size T")
p.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                              "tinyshakespeare.txt"))
p.add_argument("--precision", default="bf16-mixed")
p.add_argument("--compile", type=int, default=0, choices=[0, 1], help="torch.compile each block")
p.add_argument("--lr", type=float, default=6e-4)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--dim", type=int, default=768)
p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
p.add_argument("--pg-timeout", type=int, default=120,
               help="seconds a collective may wait before the process group gives up (a hang becomes an error)")
a = p.parse_args()
STRATEGIES = ("ddp", "fsdp", "fsdp-offload", "fsdp-ac")

RANK = int(os.environ.get("LOCAL_RANK", "0"))  # one node: the local rank is the global one


def fail(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if a.devices > 1:
        os._exit(1)  # (sys.exit would run the process group's teardown, which can wait on the other ranks)
    sys.exit(1)


try:
    sizes = sorted({int(s) for s in a.batch_sizes.split(",") if s.strip()})
except ValueError:
    fail(f"--batch-sizes={a.batch_sizes}: whole numbers, comma-separated (bench/lightning_gpt.py)")
strategies = [s for s in a.strategy.split(",") if s.strip()]
if not strategies or any(s not in STRATEGIES for s in strategies):
    fail(f"--strategy={a.strategy}: one or more of {', '.join(STRATEGIES)}, comma-separated (bench/lightning_gpt.py)")
if not sizes or min(sizes) < 1:
    fail(f"--batch-sizes={a.batch_sizes}: at least one size, each >= 1 (bench/lightning_gpt.py)")
if a.devices < 1 or a.steps < 1 or a.warmup < 1 or a.seq < 1:
    fail("--devices, --steps, --warmup and --seq must be >= 1 (bench/lightning_gpt.py)")
if a.dim % a.heads:
    fail(f"--dim={a.dim} is not a multiple of --heads={a.heads}")

try:
    import torch, torch.nn as nn, torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset
except ImportError as e:
    fail(f"no PyTorch ({e}); pip install torch")
try:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
except ImportError:
    try:
        import pytorch_lightning as L
        from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy
    except ImportError as e:
        fail(f"no PyTorch Lightning ({e}); pip install lightning")
if not torch.cuda.is_available():
    fail("torch sees no CUDA device; this benchmark compares GPU speed and memory")
if torch.cuda.device_count() < a.devices:
    fail(f"--devices={a.devices} but torch sees {torch.cuda.device_count()} GPU(s)")

if RANK > 0:
    # a rank Lightning started: leave with rank 0 (its parent), so that a rank 0 that stops early (out of
    # memory, an error) leaves no rank holding a GPU. PR_SET_PDEATHSIG = 1, Linux only.
    try:
        import ctypes, signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))
        if os.getppid() == 1:  # (the parent already went)
            os._exit(1)
    except (OSError, AttributeError):
        pass

torch.set_float32_matmul_precision("high")
DEV = torch.device("cuda", RANK)
torch.cuda.set_device(DEV)  # (as Lightning will: the peak-memory calls below touch this GPU only)


# ---- the model ----------------------------------------------------------------------------------------------
class Block(nn.Module):
    """pre-LayerNorm: x + attn(ln1(x)), then x + mlp(ln2(x)); causal SDPA, GELU (tanh) MLP 4x, biases"""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block_size, layers, heads, dim):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block_size, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        # GPT-2's init: N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 * layers)), biases 0, norms 1
        resid = 0.02 / (2 * layers) ** 0.5
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.normal_(0.0, 0.02)
                    if getattr(m, "bias", None) is not None:
                        m.bias.zero_()
                elif isinstance(m, nn.LayerNorm):
                    m.weight.fill_(1.0)
                    m.bias.zero_()
            for b in self.blocks:
                b.proj.weight.normal_(0.0, resid)
                b.fc2.weight.normal_(0.0, resid)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))


# ---- the data -----------------------------------------------------------------------------------------------
class CharData(Dataset):
    """sample i: (chars[i:i+T], chars[i+1:i+T+1]), one token a character"""

    def __init__(self, ids, T):
        self.ids, self.T = ids, T

    def __len__(self):
        return len(self.ids) - self.T

    def __getitem__(self, i):
        chunk = self.ids[i:i + self.T + 1]
        return chunk[:-1], chunk[1:]


try:
    with open(a.data, encoding="utf-8") as f:
        text = f.read()
except OSError as e:
    fail(f"cannot read --data={a.data}: {e}")
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
VOCAB = (len(chars) + 127) // 128 * 128  # padded to a multiple of 128, as kiln pads
DATA = CharData(torch.tensor([stoi[c] for c in text], dtype=torch.long), a.seq)
if len(DATA) < 1:
    fail(f"--data={a.data} has {len(text)} characters: fewer than --seq={a.seq} + 1")
EPOCH_TOKENS = len(DATA) * a.seq


# ---- the Lightning module -----------------------------------------------------------------------------------
class LitGPT(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.gpt = GPT(VOCAB, a.seq, a.layers, a.heads, a.dim)
        if a.compile:  # each block in place, before Lightning wraps it (FSDP's hooks stay outside the graphs)
            if not hasattr(nn.Module, "compile"):
                fail(f"--compile=1 needs nn.Module.compile (torch >= 2.2; this is {torch.__version__})")
            for b in self.gpt.blocks:
                b.compile()
        self.last_loss = None

    def forward(self, x, y):
        return self.gpt(x, y)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self(x, y)
        self.last_loss = loss.detach()
        return loss

    def configure_optimizers(self):
        # Called after Lightning's wrap; FSDPStrategy sets use_orig_params=True (torch >= 2.0), so
        # self.named_parameters() are the wrapped model's, in their original names (a wrapper's prefix aside).
        # No weight decay on biases and LayerNorms (their names: ".bias", ln1, ln2, ln_f); the shapes cannot
        # tell them apart here, as FSDP's sharded views are flat.
        decay, no_decay = [], []
        for name, prm in self.named_parameters():
            if not prm.requires_grad:
                continue
            norm = any(part.startswith("ln") for part in name.split("."))
            (no_decay if name.endswith("bias") or norm else decay).append(prm)
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # the global norm clipped to 1.0. Lightning's FSDP precision plugin refuses gradient_clip_val with the
        # norm ("not supported for FSDPPrecision"): FSDP's root module computes the norm across the shards.
        # DDP: Lightning's own clipping (torch.nn.utils.clip_grad_norm_ on the whole gradients).
        from torch.distributed.fsdp import FullyShardedDataParallel

        root = self.trainer.strategy.model
        if isinstance(root, FullyShardedDataParallel):
            root.clip_grad_norm_(1.0)
        else:
            self.clip_gradients(optimizer, gradient_clip_val=1.0, gradient_clip_algorithm="norm")


class StepTimer(L.Callback):
    """the wall clock at the end of every training batch, the GPU synchronized"""

    def __init__(self):
        self.t = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        torch.cuda.synchronize(DEV)
        self.t.append(time.perf_counter())


def make_strategy(strategy):
    timeout = datetime.timedelta(seconds=a.pg_timeout)
    if strategy == "ddp":
        return DDPStrategy(timeout=timeout)
    kw = dict(sharding_strategy="FULL_SHARD", auto_wrap_policy={Block}, timeout=timeout)
    if strategy == "fsdp-offload":
        kw["cpu_offload"] = True  # parameters and gradients on the host; AdamW steps there
    if strategy == "fsdp-ac":
        kw["activation_checkpointing_policy"] = {Block}
    return FSDPStrategy(**kw)


def is_oom(e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    s = str(e)
    return "out of memory" in s.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in s


def run(strategy, B):
    L.seed_everything(1337)  # the same initial model for every batch size; also the sampler's seed
    module = LitGPT()
    loader = DataLoader(DATA, batch_size=B, shuffle=True, drop_last=True, num_workers=a.workers,
                        pin_memory=True)
    timer = StepTimer()
    trainer = L.Trainer(accelerator="cuda", devices=a.devices, strategy=make_strategy(strategy), precision=a.precision,
                        max_epochs=1, limit_train_batches=a.warmup + a.steps, num_sanity_val_steps=0,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        logger=False, callbacks=[timer])
    torch.cuda.reset_peak_memory_stats(DEV)
    trainer.fit(module, train_dataloaders=loader)
    peak = torch.cuda.max_memory_allocated(DEV)
    n = a.warmup + a.steps
    if len(timer.t) < n:
        raise RuntimeError(f"the fit ran {len(timer.t)} batches, not {n} (too few samples for batch {B} on "
                           f"{a.devices} GPU(s)?)")
    dt = timer.t[n - 1] - timer.t[a.warmup - 1]
    tok_s = a.steps * B * a.seq * a.devices / dt
    loss = float(module.last_loss) if module.last_loss is not None else float("nan")
    del trainer, module, loader, timer
    gc.collect()
    torch.cuda.empty_cache()
    return dict(strategy=strategy, devices=a.devices, batch=B, seq=a.seq, tokens_per_s=round(tok_s, 1),
                epoch_s=round(EPOCH_TOKENS / tok_s, 2), peak_mem_bytes=peak, loss=round(loss, 5),
                ms_per_step=round(dt * 1e3 / a.steps, 2), epoch_tokens=EPOCH_TOKENS, vocab=VOCAB,
                steps=a.steps, warmup=a.warmup, precision=a.precision, compile=a.compile,
                torch=torch.__version__, lightning=L.__version__)


def emit(row):
    print(json.dumps(row, separators=(",", ":")), flush=True)


for strategy in strategies:
    for B in sizes:
        try:
            row = run(strategy, B)
        except Exception as e:  # (SystemExit and KeyboardInterrupt pass through)
            if is_oom(e):  # (the strategies after this one need new processes: the caller starts them)
                emit(dict(strategy=strategy, devices=a.devices, batch=B, error="oom", rank=RANK))
                sys.stderr.flush()
                os._exit(3)
            first = (str(e).strip().splitlines() or [""])[0]
            fail(f"{strategy} on {a.devices} GPU(s), batch {B}: {type(e).__name__}: {first}")
        if RANK == 0:
            emit(row)
