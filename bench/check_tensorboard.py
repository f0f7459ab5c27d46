#!/usr/bin/env python3
"""Reads a kiln --tensorboard directory with TensorBoard's own reader and compares it with the run's
metrics.jsonl: every number of every line must be there as a scalar, under its tag, at its step, with the
same value (as a float32, and up to the rounding of the printed line), each step once (a resumed run's
files drop the steps a killed run logged past its checkpoint), and the config must be there as text.

    python3 bench/check_tensorboard.py TB_DIR RUN/metrics.jsonl

Prints one line per tag and exits 0 when everything matches, 1 otherwise (2: TensorBoard is not installed).
"""
import json
import math
import sys

# metrics.jsonl field -> TensorBoard tag (src/run/metrics.c)
TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens": "train/tokens",
    "val_loss": "val/loss",
    "tokens_per_s": "perf/tokens_per_s",
    "ms": "perf/step_ms",
    "peak_mem_bytes": "perf/peak_mem_bytes",
    "mfu": "perf/mfu",
    "mfu_causal": "perf/mfu_causal",
    "hfu": "perf/hfu",
    "comm_wait_ms": "perf/comm_wait_ms",
    "ckpt_stall_ms": "ckpt/stall_ms",
    "prev_ckpt_write_ms": "ckpt/prev_write_ms",
    "skipped_steps": "guards/skipped_steps",
    "skipped_nan": "guards/skipped_nan",
    "skipped_spike_loss": "guards/skipped_spike_loss",
    "skipped_spike_grad": "guards/skipped_spike_grad",
}


# how metrics.jsonl prints each field (src/run/metrics.c): half its last digit is what printing may have
# rounded away; ("abs", 0.5e-6) for %.6f, ("rel", 0.5e-5) for %.6g
PRINTED = {
    "loss": ("abs", 0.5e-6),
    "val_loss": ("abs", 0.5e-6),
    "lr": ("rel", 0.5e-5),
    "grad_norm": ("rel", 0.5e-5),
    "tokens_per_s": ("abs", 0.05),
    "ms": ("abs", 0.5e-3),
    "ckpt_stall_ms": ("abs", 0.5e-3),
    "comm_wait_ms": ("abs", 0.5e-3),
    "prev_ckpt_write_ms": ("abs", 0.5e-3),
    "mfu": ("abs", 0.5e-4),
    "mfu_causal": ("abs", 0.5e-4),
    "hfu": ("abs", 0.5e-4),
}


def matches(key, printed, stored):
    """stored is the float32 of the value that metrics.jsonl printed, rounded, as printed."""
    if math.isnan(printed) or math.isnan(stored):
        return math.isnan(printed) and math.isnan(stored)
    kind, tol = PRINTED.get(key, ("abs", 0.0))  # integers are printed exactly
    tol = tol * abs(printed) if kind == "rel" else tol
    return abs(printed - stored) <= tol * 1.01 + 2 ** -23 * abs(printed)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    tb_dir, jsonl = sys.argv[1], sys.argv[2]
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        print(f"check_tensorboard: tensorboard is not installed ({e})", file=sys.stderr)
        return 2

    want = {}  # tag -> {step: value}
    key_of = {tag: key for key, tag in TAGS.items()}
    with open(jsonl) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            for key, value in row.items():
                if key == "step" or not isinstance(value, (int, float)):
                    continue
                if key not in TAGS:
                    print(f"FAIL: {jsonl} has a field '{key}' with no tag here")
                    return 1
                want.setdefault(TAGS[key], {})[row["step"]] = value

    # size_guidance 0: keep every event (the default samples scalars down to 10000 per tag)
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    failures = 0
    for tag in sorted(want):
        if tag not in tags["scalars"]:
            print(f"FAIL: {tag}: not in the event files (scalars: {', '.join(sorted(tags['scalars']))})")
            failures += 1
            continue
        got = {}
        for ev in acc.Scalars(tag):
            if ev.step in got:
                print(f"FAIL: {tag}: step {ev.step} twice")
                failures += 1
            got[ev.step] = ev.value
        bad = [
            (s, v, got.get(s))
            for s, v in sorted(want[tag].items())
            if s not in got or not matches(key_of[tag], v, got[s])
        ]
        extra = sorted(set(got) - set(want[tag]))
        if bad or extra:
            failures += 1
            print(f"FAIL: {tag}: {len(bad)} of {len(want[tag])} steps differ (first: step, jsonl, events = "
                  f"{bad[:3]}); steps only in the events: {extra[:10]}")
        else:
            print(f"ok: {tag}: {len(got)} steps")
    extra_tags = sorted(set(tags["scalars"]) - set(want))
    if extra_tags:
        print(f"FAIL: tags in the events but not in {jsonl}: {extra_tags}")
        failures += 1
    if "config" not in tags["tensors"]:
        print(f"FAIL: no config text (tensors: {tags['tensors']})")
        failures += 1
    else:
        text = acc.Tensors("config")[-1].tensor_proto.string_val[0].decode()
        if "tensorboard = " not in text:
            print("FAIL: the config text lacks the options")
            failures += 1
        else:
            print(f"ok: config: {len(text.splitlines())} lines of text")
    print("check_tensorboard:", "all match" if not failures else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
