# PyTorch SDPA (flash backend) causal attention timings at attn_bench's shapes, for docs/benchmarks.md.
# Prints one line per shape: fwd, bwd and fwd+bwd ms and TFLOP/s with attn_bench's FLOP convention
# (causal forward 2*2*B*NH*T*T*HS/2, backward 2.5x that).
import sys, torch
import torch.nn.functional as F

shapes = [(32, 1024, 12, 64), (16, 1024, 16, 64), (8, 1024, 25, 64), (16, 2048, 16, 64), (8, 8192, 16, 64),
          (32, 1024, 16, 128), (16, 2048, 16, 128), (8, 8192, 16, 128), (8, 1024, 16, 128)]

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
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        def fb():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)
        both = bench(fb)
    bwd = both - fwd
    fl = 2 * 2 * B * NH * T * T * HS / 2
    print(f"B={B:<3} T={T:<5} NH={NH:<3} HS={HS:<4} sdpa  fwd {fwd:8.3f} ms {fl/fwd/1e9:6.1f} TF/s  "
          f"bwd {bwd:8.3f} ms {2.5*fl/bwd/1e9:6.1f} TF/s  f+b {3.5*fl/both/1e9:6.1f} TF/s")
    sys.stdout.flush()
