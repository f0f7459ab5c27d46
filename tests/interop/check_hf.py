#!/usr/bin/env python3
"""Checks kiln's Hugging Face interop against transformers (5.x; 4.4x should work too), on the CPU.

For each supported architecture:
  export:  kiln train (5 steps, tiny model, embedded Tiny Shakespeare) -> kiln export --format=hf ->
           transformers' AutoModelForCausalLM.from_pretrained -> logits on the same tokens as `kiln logits`;
  back:    kiln import of that export -> `kiln logits` again (must equal the original run's);
  hf->kiln: a random transformers model (GPT2Config / LlamaConfig / OlmoConfig, norm weights perturbed) ->
           save_pretrained -> kiln import -> `kiln logits` against transformers' logits.
Prints a table (markdown, ready for docs/models.md) and exits 1 on any mismatch, 2 on a setup error.

  python3 tests/interop/check_hf.py --kiln=build/kiln [--keep=DIR] [--tol=1e-4]

The tolerance is relative: ||kiln - hf|| / ||hf|| over all positions and vocabulary entries, fp32 both sides.
The bf16 export row compares bf16 weights (loaded by transformers as fp32) with kiln's fp32 logits: 2e-2.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

TINY = ["--layers=2", "--heads=4", "--dim=64", "--seq=64", "--block-size=64", "--batch=4", "--max-steps=5",
        "--warmup=1", "--eval-every=0", "--eval-steps=1", "--device=cpu", "--quiet", "--lr=1e-2"]

# name, expected architecture, kiln train flags, export flags, tolerance
EXPORT_CASES = [
    ("gpt2 (char)", "GPT2LMHeadModel", ["--tokenizer=char"], [], None),
    ("gpt2 untied (gpt2 bpe)", "GPT2LMHeadModel", ["--tokenizer=gpt2", "--tie-embeddings=0"], [], None),
    ("llama gqa untied", "LlamaForCausalLM",
     ["--tokenizer=char", "--pos=rope", "--rope-theta=500000", "--norm=rmsnorm", "--mlp=swiglu", "--kv-heads=2",
      "--bias=0", "--tie-embeddings=0"], [], None),
    ("llama mqa tied bias", "LlamaForCausalLM",
     ["--tokenizer=char", "--pos=rope", "--norm=rmsnorm", "--mlp=swiglu", "--mlp-hidden=96", "--kv-heads=1",
      "--bias=1", "--tie-embeddings=1"], [], None),
    ("olmo tied (norms folded)", "OlmoForCausalLM",
     ["--tokenizer=char", "--pos=rope", "--norm=layernorm", "--norm-bias=0", "--bias=0", "--mlp=swiglu",
      "--tie-embeddings=1"], [], None),
    ("olmo gqa untied", "OlmoForCausalLM",
     ["--tokenizer=gpt2", "--pos=rope", "--norm=layernorm", "--norm-bias=0", "--bias=0", "--mlp=swiglu",
      "--kv-heads=2", "--tie-embeddings=0"], [], None),
    ("llama bf16 export", "LlamaForCausalLM",
     ["--tokenizer=char", "--pos=rope", "--norm=rmsnorm", "--mlp=swiglu", "--kv-heads=2", "--bias=0"],
     ["--dtype=bf16"], 2e-2),
]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def kiln_logits(kiln, run_dir, tokens):
    out = run([kiln, "logits", f"--run={run_dir}", "--tokens=" + ",".join(map(str, tokens)), "--device=cpu"])
    return json.loads(out)


def hf_logits(torch, transformers, hf_dir, tokens):
    kw = dict(attn_implementation="eager")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, **kw)
    except TypeError:  # transformers 4.x
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, **kw)
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([tokens], dtype=torch.long)).logits[0].double()
    return type(model).__name__, out.tolist()


def compare(a, b):
    """(||a - b|| / ||b||, max |a - b|) over nested lists of rows; inf when the shapes differ."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        return float("inf"), float("inf")
    num = den = mx = 0.0
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            d = u - v
            num += d * d
            den += v * v
            mx = max(mx, abs(d))
    return (num / max(den, 1e-300)) ** 0.5, mx


def hf_native_models(transformers, torch, V):
    """Random transformers models with kiln-compatible configs (vocab 50257 = kiln's gpt2 tokenizer)."""
    common = dict(vocab_size=V, bos_token_id=50256, eos_token_id=50256, pad_token_id=None)
    yield "gpt2", transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64,
                                          activation_function="gelu_new", **common)
    yield "llama", transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                            rms_norm_eps=1e-5, tie_word_embeddings=False, **common)
    yield "olmo", transformers.OlmoConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                          tie_word_embeddings=False, **common)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.environ.get("KILN", "build/kiln"))
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--tokens", type=int, default=32, help="sequence length compared")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--keep", help="work in this directory and keep it")
    ap.add_argument("--kiln-only", action="store_true",
                    help="skip transformers: only train, export, import and compare kiln with itself")
    args = ap.parse_args()
    torch = transformers = None
    if not args.kiln_only:
        try:
            import torch
            import transformers
        except ImportError as e:
            print(f"error: {e} (check_hf.py): needs torch and transformers (or --kiln-only)", file=sys.stderr)
            return 2
        torch.manual_seed(args.seed)
    if not os.access(args.kiln, os.X_OK):
        print(f"error: no kiln binary at {args.kiln} (--kiln): build it first", file=sys.stderr)
        return 2
    rnd = random.Random(args.seed)
    work = args.keep or tempfile.mkdtemp(prefix="kiln_check_hf_")
    os.makedirs(work, exist_ok=True)
    rows, failed = [], 0

    def row(case, direction, arch, rel, maxabs, tol):
        nonlocal failed
        ok = rel <= tol
        failed += not ok
        rows.append((case, direction, arch, rel, maxabs, tol, "ok" if ok else "MISMATCH"))

    try:
        for i, (name, arch, flags, exp_flags, tol) in enumerate(EXPORT_CASES):
            tol = tol or args.tol
            d = os.path.join(work, f"case{i}")
            shutil.rmtree(d, ignore_errors=True)
            run([args.kiln, "train", *TINY, *flags, f"--seed={args.seed + i}", f"--out={d}/run"])
            run([args.kiln, "export", f"--run={d}/run", "--format=hf", f"--out={d}/hf", *exp_flags])
            cfg = json.load(open(f"{d}/hf/config.json"))
            if cfg["architectures"][0] != arch:
                raise RuntimeError(f"{name}: exported {cfg['architectures'][0]}, expected {arch}")
            V = cfg["vocab_size"]
            tokens = [rnd.randrange(V) for _ in range(args.tokens)]
            k = kiln_logits(args.kiln, f"{d}/run", tokens)
            if not args.kiln_only:
                loaded, h = hf_logits(torch, transformers, f"{d}/hf", tokens)
                rel, mx = compare(k["logits"], h)
                row(name, "kiln -> HF", loaded, rel, mx, tol)
            # and back: kiln import of the export must reproduce the run (exactly, except folded OLMo norms)
            run([args.kiln, "import", f"--from={d}/hf", f"--out={d}/back"])
            kb = kiln_logits(args.kiln, f"{d}/back", tokens)
            rel, mx = compare(kb["logits"], k["logits"])
            row(name, "kiln -> HF -> kiln", "kiln", rel, mx, tol)

        for name, config in ([] if args.kiln_only else hf_native_models(transformers, torch, 50257)):
            d = os.path.join(work, f"native_{name}")
            shutil.rmtree(d, ignore_errors=True)
            model = transformers.AutoModelForCausalLM.from_config(config)
            with torch.no_grad():  # move norm weights and biases away from their 1 / 0 init
                for pname, p in model.named_parameters():
                    if p.dim() == 1:
                        p.add_(0.1 * torch.randn_like(p))
            model.save_pretrained(f"{d}/hf")
            run([args.kiln, "import", f"--from={d}/hf", f"--out={d}/run"])
            tokens = [rnd.randrange(50257) for _ in range(args.tokens)]
            k = kiln_logits(args.kiln, f"{d}/run", tokens)
            loaded, h = hf_logits(torch, transformers, f"{d}/hf", tokens)
            rel, mx = compare(k["logits"], h)
            row(f"{name} (random, transformers-made)", "HF -> kiln", loaded, rel, mx, args.tol)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    versions = "kiln only" if args.kiln_only else f"transformers {transformers.__version__}, torch {torch.__version__}"
    print(f"kiln HF interop check: {versions}, "
          f"{args.tokens} tokens, fp32 on CPU, relative error ||kiln - hf|| / ||hf||\n")
    print("| case | direction | loaded as | rel err | max abs diff | tolerance | result |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case, direction, arch, rel, mx, tol, res in rows:
        print(f"| {case} | {direction} | {arch} | {rel:.2e} | {mx:.2e} | {tol:.0e} | {res} |")
    print(f"\n{len(rows) - failed} of {len(rows)} comparisons within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
