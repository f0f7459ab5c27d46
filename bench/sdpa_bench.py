# PyTorch SDPA causal attention timings at attn_bench's shapes, for docs/benchmarks.md.
# Prints one line per shape and backend: fwd, bwd and fwd+bwd ms and TFLOP/s with attn_bench's FLOP convention
# (causal forward 2*2*B*NH*T*T*HS/2, backward 2.5x that).
#   python3 bench/sdpa_bench.py [--backends=flash,cudnn,efficient,default] [B,T,NH,HS ...]
# Without shapes: attn_bench's table. Backends default to flash (what docs/benchmarks.md's table used);
# "default" lets PyTorch choose, as the training baseline (torch_gpt.py) does. Long lengths (B=1 T=65536) are
# issue 15's question: which kernel PyTorch's step runs there, and how fast.
import contextlib, sys, torch
import torch.nn.functional as F

shapes = [(32, 1024, 12, 64), (16, 1024, 16, 64), (8, 1024, 25, 64), (16, 2048, 16, 64), (8, 8192, 16, 64),
          (32, 1024, 16, 128), (16, 2048, 16, 128), (8, 8192, 16, 128), (8, 1024, 16, 128)]
backends = ["flash"]
given = []
for a in sys.argv[1:]:
    if a.startswith("--backends="):
        backends = a.split("=", 1)[1].split(",")
    else:
        try:
            B, T, NH, HS = (int(x) for x in a.split(","))
        except ValueError:
            sys.exit(f"error: shape {a!r} (bench/sdpa_bench.py): write B,T,NH,HS, e.g. 1,65536,16,128")
        given.append((B, T, NH, HS))
shapes = given or shapes
B_ = torch.nn.attention.SDPBackend
known = {"flash": [B_.FLASH_ATTENTION], "cudnn": [B_.CUDNN_ATTENTION], "efficient": [B_.EFFICIENT_ATTENTION],
         "default": None}
for b in backends:
    if b not in known:
        sys.exit(f"error: backend {b!r} (bench/sdpa_bench.py --backends): one of {', '.join(known)}")


def bench(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: SDPA causal, bf16, median of 20")
for B, T, NH, HS in shapes:
    q, k, v = [torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
    reps = 20 if T <= 16384 else 5
    for name in backends:
        # (default: no context, PyTorch chooses the kernel)
        ctx = torch.nn.attention.sdpa_kernel(known[name]) if known[name] else contextlib.nullcontext()
        try:
            with ctx:
                fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps)

                def fb():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    o.backward(do)
                both = bench(fb, reps)
        except RuntimeError as e:
            print(f"B={B:<3} T={T:<5} NH={NH:<3} HS={HS:<4} {name:<9} not available: {str(e).splitlines()[0][:80]}")
            continue
        bwd = both - fwd
        fl = 2 * 2 * B * NH * T * T * HS / 2
        print(f"B={B:<3} T={T:<5} NH={NH:<3} HS={HS:<4} {name:<9} fwd {fwd:8.3f} ms {fl/fwd/1e9:6.1f} TF/s  "
              f"bwd {bwd:8.3f} ms {2.5*fl/bwd/1e9:6.1f} TF/s  f+b {3.5*fl/both/1e9:6.1f} TF/s")
        sys.stdout.flush()
