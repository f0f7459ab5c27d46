// Options, presets and validation. See options.h.
#include "run/options.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// the option table

enum opt_type { OPT_INT, OPT_LONG, OPT_FLOAT, OPT_DOUBLE, OPT_U64, OPT_STR, OPT_ENUM, OPT_BOOL };

struct opt {
    const char *name;
    enum opt_type type;
    size_t offset;
    size_t size;         // OPT_STR: capacity
    double min, max;     // numeric range (inclusive)
    const char *choices; // OPT_ENUM: space-separated names, index = value
    const char *help;
};

#define OFF(field) offsetof(struct kiln_config, field), sizeof(((struct kiln_config *)0)->field)
#define M(field) OFF(model.field)

static const struct opt OPTS[] = {
    // model
    {"family", OPT_ENUM, M(family), 0, 0, "gpt", "model family (model/family.h): gpt"},
    {"layers", OPT_INT, M(n_layer), 1, 1024, NULL, "number of transformer blocks (L)"},
    {"heads", OPT_INT, M(n_head), 1, 1024, NULL, "attention heads (NH)"},
    {"kv-heads", OPT_INT, M(n_kv_head), 0, 1024, NULL, "key/value heads for GQA/MQA (0 = heads)"},
    {"dim", OPT_INT, M(n_embd), 8, 65536, NULL, "model width (C)"},
    {"block-size", OPT_INT, M(block_size), 1, 1 << 22, NULL, "maximum sequence length the model supports"},
    {"vocab-multiple", OPT_INT, M(vocab_multiple), 1, 4096, NULL, "pad the vocab to a multiple of this"},
    {"pos", OPT_ENUM, M(pos), 0, 0, "learned rope alibi none", "position encoding"},
    {"rope-theta", OPT_FLOAT, M(rope_theta), 1, 1e9, NULL, "RoPE base"},
    {"norm", OPT_ENUM, M(norm_rms), 0, 0, "layernorm rmsnorm", "normalization"},
    {"norm-bias", OPT_BOOL, M(norm_bias), 0, 1, NULL, "LayerNorm has a bias"},
    {"norm-eps", OPT_FLOAT, M(norm_eps), 1e-12, 1, NULL, "normalization epsilon"},
    {"bias", OPT_BOOL, M(bias), 0, 1, NULL, "linear layers have biases"},
    {"mlp", OPT_ENUM, M(mlp_swiglu), 0, 0, "gelu swiglu", "MLP type"},
    {"mlp-hidden", OPT_INT, M(mlp_hidden), 0, 1 << 20, NULL, "MLP hidden size (0 = 4C, or 8C/3 for SwiGLU)"},
    {"block", OPT_ENUM, M(parallel_block), 0, 0, "sequential parallel", "block layout"},
    {"tie-embeddings", OPT_BOOL, M(tie_embeddings), 0, 1, NULL, "LM head shares the token embedding"},
    {"qk-norm", OPT_BOOL, M(qk_norm), 0, 1, NULL,
     "normalize each token's queries and keys (OLMo-2's QK-norm)"},
    // data
    {"data", OPT_STR, OFF(data), 0, 0, NULL,
     "training shards (glob); empty = embedded Tiny Shakespeare; random = random tokens"},
    {"val-data", OPT_STR, OFF(val_data), 0, 0, NULL, "validation shards (glob)"},
    {"tokenizer", OPT_STR, OFF(tokenizer), 0, 0, NULL,
     "char, gpt2, or a Hugging Face tokenizer.json of a byte-level BPE (Llama 3's: "
     "--tokenizer=DIR/tokenizer.json)"},
    {"val-fraction", OPT_FLOAT, OFF(val_fraction), 0.001, 0.5, NULL, "held-out tail of a single text source"},
    // batch
    {"batch", OPT_INT, OFF(batch_size), 1, 1 << 20, NULL, "sequences per micro-step (B)"},
    {"seq", OPT_INT, OFF(seq_len), 1, 1 << 22, NULL, "sequence length (T)"},
    {"total-batch", OPT_LONG, OFF(total_batch_tokens), 0, 1e12, NULL,
     "tokens per optimizer step, a multiple of B*T (0 = B*T)"},
    // optimization
    {"max-steps", OPT_INT, OFF(max_steps), 1, 1e9, NULL, "optimizer steps"},
    {"lr", OPT_FLOAT, OFF(lr), 0, 10, NULL, "peak learning rate"},
    {"final-lr-frac", OPT_FLOAT, OFF(final_lr_frac), 0, 1, NULL, "final learning rate as a fraction of lr"},
    {"warmup", OPT_INT, OFF(warmup_steps), 0, 1e9, NULL, "linear warmup steps"},
    {"schedule", OPT_ENUM, OFF(schedule), 0, 0, "cosine linear constant wsd", "decay after warmup"},
    {"wsd-decay", OPT_FLOAT, OFF(wsd_decay_frac), 0, 1, NULL, "WSD: fraction of steps spent decaying"},
    {"beta1", OPT_FLOAT, OFF(beta1), 0, 0.999999, NULL, "AdamW beta1"},
    {"beta2", OPT_FLOAT, OFF(beta2), 0, 0.999999, NULL, "AdamW beta2"},
    {"eps", OPT_FLOAT, OFF(eps), 1e-30, 1, NULL, "AdamW epsilon"},
    {"weight-decay", OPT_FLOAT, OFF(weight_decay), 0, 10, NULL, "AdamW weight decay (2-D weights only)"},
    {"grad-clip", OPT_FLOAT, OFF(grad_clip), 0, 1e9, NULL, "clip gradients to this global norm (0 = off)"},
    {"stochastic-rounding", OPT_BOOL, OFF(stochastic_rounding), 0, 1, NULL,
     "round the bf16 weight copy stochastically (CUDA; the CPU keeps f32 weights)"},
    {"z-loss", OPT_FLOAT, OFF(z_loss), 0, 1, NULL, "z-loss coefficient on the logits' log-sum-exp"},
    // evaluation, logging
    {"eval-every", OPT_INT, OFF(eval_every), 0, 1e9, NULL,
     "validation loss every N steps (0 = only at the end)"},
    {"eval-steps", OPT_INT, OFF(eval_steps), 1, 1e9, NULL, "batches per validation pass"},
    {"log-every", OPT_INT, OFF(log_every), 1, 1e9, NULL, "write a metrics line every N steps"},
    {"sample-every", OPT_INT, OFF(sample_every), 0, 1e9, NULL,
     "print a short sample every N steps (0 = never)"},
    {"quiet", OPT_BOOL, OFF(quiet), 0, 1, NULL, "no progress line"},
    // run
    {"seed", OPT_U64, OFF(seed), 0, 0, NULL, "random seed (init, data order)"},
    {"device", OPT_ENUM, OFF(device), 0, 0, "auto cpu cuda", "compute backend"},
    {"threads", OPT_INT, OFF(threads), 0, 4096, NULL, "CPU threads (0 = all cores)"},
    {"deterministic", OPT_BOOL, OFF(deterministic), 0, 1, NULL, "bitwise-repeatable GPU kernels"},
    {"recompute", OPT_ENUM, OFF(recompute), 0, 0, "none mlp block act selective auto",
     "activation recompute (act: the MLP activation's output, from its kept input; selective: as block, but "
     "each layer keeps its attention's output, so the backward does not redo the attention: long context; "
     "auto: the least of none, act, mlp, selective, block whose memory plan fits the GPU's free memory)"},
    {"grad-dtype", OPT_ENUM, OFF(grad_dtype), 0, 0, "auto fp32 bf16",
     "parameter gradients (auto = bf16 on CUDA when a step is one micro-step, else fp32)"},
    {"peak-flops", OPT_DOUBLE, OFF(peak_flops), 0, 1e18, NULL,
     "peak FLOP/s for MFU (0 = from the GPU table)"},
    {"out", OPT_STR, OFF(out), 0, 0, NULL, "run directory for config, metrics and the model"},
    // many processes
    {"comm", OPT_ENUM, OFF(comm), 0, 0, "auto nccl mpi single",
     "transport between processes (auto: nccl on GPUs, mpi on CPUs, single for one process)"},
    {"zero", OPT_INT, OFF(zero), -1, 3, NULL,
     "data parallelism: 0 DDP, 1 optimizer state sharded (ZeRO-1), 2 gradients sharded too (ZeRO-2), 3 "
     "parameters sharded too, gathered per layer (ZeRO-3, FSDP); auto: 1 with several data-parallel ranks "
     "(less traffic than DDP's all-reduce and 1/N of the optimizer state), else 0"},
    {"prefetch", OPT_INT, OFF(prefetch), 1, 2, NULL,
     "ZeRO-3: layers whose weights are gathered ahead of the one computing (bounds the gathered copies)"},
    {"zero3-reshard-after-forward", OPT_BOOL, OFF(zero3_reshard), 0, 1, NULL,
     "ZeRO-3: free each layer's gathered weights after its forward and gather them again for its backward "
     "(0: keep them, a whole model's compute weights, and gather each layer once a step)"},
    {"zero3-accumulate", OPT_ENUM, OFF(zero3_accumulate), 0, 0, "sharded whole",
     "ZeRO-3 with several micro-steps: reduce-scatter every micro-step onto the shard (sharded), or hold "
     "whole gradients and reduce-scatter on the last micro-step only (whole: fewer reductions, 4 bytes a "
     "parameter more)"},
    {"offload", OPT_ENUM, OFF(offload), 0, 0, "none optimizer activations all",
     "to pinned host memory: optimizer (fp32 master weights and AdamW moments, AdamW on the CPU), "
     "activations (each layer's input kept for --recompute=block, back before its backward), or all"},
    {"tp", OPT_INT, OFF(tp), 1, 65536, NULL,
     "tensor parallelism: ranks that split each layer's heads, MLP width and vocabulary (Megatron's), "
     "consecutive ranks, innermost (world = tp x sp x data-parallel ranks)"},
    {"tp-sp", OPT_BOOL, OFF(tp_sp), 0, 1, NULL,
     "with --tp: Megatron's sequence parallelism inside the group: the norms and the residual stream hold "
     "1/tp of the token rows, with an all-gather before each column-parallel layer and a reduce-scatter "
     "after "
     "each row-parallel one, instead of all-reduces (0: every rank holds every row)"},
    {"tp-overlap", OPT_ENUM, OFF(tp_overlap), 0, 0, "off ring bulk",
     "with --tp and --tp-sp: off (the default) issues each all-gather and reduce-scatter whole and waits for "
     "it before the GEMM; ring runs them chunk by chunk around the group, each chunk's transfer under the "
     "GEMM "
     "of another chunk (async TP, a collective matmul: 0.83x off's speed on 4 H100s so far); bulk keeps "
     "off's "
     "collectives whole but runs each under a GEMM: an all-gather under the GEMM of the rank's own rows "
     "(column-parallel forward, row-parallel backward) or under the dinp GEMM, and dinp's reduce-scatter "
     "under "
     "the dW GEMM (column-parallel backward); off's products. The row-parallel forward's reduce-scatter, the "
     "LM head and the embedding stay synchronous"},
    {"tp-keep-gathered", OPT_BOOL, OFF(tp_keep_gathered), 0, 1, NULL,
     "with --tp and --tp-sp (off or bulk overlap): each column-parallel layer keeps the input it gathered in "
     "the "
     "forward for its weight gradient, instead of gathering it again in the backward: a third fewer "
     "all-gathers, for (batch x seq x dim) activations a layer and column-parallel layer; the same numbers"},
    {"sp", OPT_INT, OFF(sp), 1, 65536, NULL,
     "sequence parallelism: ranks that split each sequence (world = sp x data-parallel ranks)"},
    {"sp-mode", OPT_ENUM, OFF(sp_mode), 0, 0, "ulysses ring hybrid auto",
     "how attention crosses the sequence: all-to-all to heads (ulysses), key/value blocks around a ring "
     "(ring), Ulysses inside groups of --sp-ulysses ranks and a ring across them (hybrid), or auto: Ulysses "
     "over the largest group of a node's ranks that the heads divide, a ring across the groups"},
    {"sp-ulysses", OPT_INT, OFF(sp_ulysses), 0, 65536, NULL,
     "hybrid: ranks per Ulysses group (0: the ranks per node)"},
    // precision (docs/precision.md)
    {"precision", OPT_ENUM, OFF(precision), 0, 0, "bf16 fp8",
     "the blocks' linear layers: bf16 (the backend's precision; f32 on the CPU) or fp8 (FP8 GEMMs on sm_89+ "
     "GPUs, emulated exactly on the CPU)"},
    {"fp8-recipe", OPT_ENUM, OFF(fp8_recipe), 0, 0, "tensorwise rowwise delayed",
     "fp8 scaling: each tensor's amax now (tensorwise), each row's along the reduction (rowwise), or the "
     "largest of the last --fp8-history steps' (delayed)"},
    {"fp8-grad", OPT_ENUM, OFF(fp8_grad), 0, 0, "e5m2 e4m3", "fp8: the format of the output gradients"},
    {"fp8-head", OPT_BOOL, OFF(fp8_head), 0, 1, NULL, "fp8: the LM head in FP8 too"},
    {"fp8-history", OPT_INT, OFF(fp8_history), 1, 1024, NULL, "fp8 delayed: steps of amax history"},
    {"fp8-all-gather", OPT_BOOL, OFF(fp8_all_gather), 0, 1, NULL,
     "fp8 tensorwise with --zero=3: the layers' linear weights all-gathered as FP8 codes (half the bytes), "
     "not in bf16 and cast on each use"},
    {"bucket-mb", OPT_FLOAT, OFF(bucket_mb), 0.001, 1e5, NULL,
     "MiB of gradients per reduction bucket, each reduced while the backward goes on"},
    {"reduce-dtype", OPT_ENUM, OFF(reduce_dtype), 0, 0, "auto fp32 bf16",
     "dtype of gradients between ranks: auto/fp32 keep fp32 gradients when there are several ranks; bf16 "
     "(GPU, one micro-step) halves the bytes"},
    // checkpoints
    {"checkpoint", OPT_BOOL, OFF(checkpoint), 0, 1, NULL,
     "write checkpoints into --out (0 = none, for benchmarks)"},
    {"save-model", OPT_BOOL, OFF(save_model), 0, 1, NULL,
     "write RUN/model.safetensors when the run ends (0: metrics only, for benchmarks)"},
    {"ckpt-every", OPT_INT, OFF(ckpt_every), 0, 1e9, NULL, "checkpoint every N steps (0 = at the end only)"},
    {"keep-last", OPT_INT, OFF(keep_last), 0, 1e9, NULL, "keep the newest K checkpoints (0 = all)"},
    {"keep-every", OPT_INT, OFF(keep_every), 0, 1e9, NULL, "also keep checkpoints at multiples of M steps"},
    {"resume", OPT_STR, OFF(resume), 0, 0, NULL,
     "auto (newest checkpoint in --out), never, or a checkpoint dir"},
    // health guards
    {"spike-z", OPT_FLOAT, OFF(spike_z), 0, 1000, NULL,
     "skip steps whose loss or grad norm is this many standard deviations above the recent steps' (on "
     "logarithms; 0 = off)"},
    {"spike-window", OPT_INT, OFF(spike_window), 2, 1e6, NULL,
     "steps in the spike detector's running statistics"},
    {"max-bad-steps", OPT_INT, OFF(max_bad_steps), 1, 1e9, NULL,
     "stop after this many consecutive skipped steps"},
    // cluster operations (docs/operations.md)
    {"hang-timeout", OPT_FLOAT, OFF(hang_timeout), 0, 1e6, NULL,
     "seconds without progress in a step or a collective before the watchdog dumps RUN/hang/ and aborts "
     "the job (0 = off)"},
    {"tensorboard", OPT_STR, OFF(tensorboard), 0, 0, NULL,
     "also write TensorBoard event files into this directory"},
    // fault injection (tests only)
    {"inject-nan", OPT_STR, OFF(inject_nan), 0, 0, NULL,
     "testing only: steps (1-based, comma-separated) whose loss is made NaN"},
    {"inject-crash", OPT_INT, OFF(inject_crash), 0, 1e9, NULL,
     "testing only: abort() before step N of a fresh run, after the last checkpoint is written (0 = off)"},
    {"inject-stall", OPT_STR, OFF(inject_stall), 0, 0, NULL,
     "testing only: RANK:STEP, that rank stops making progress (sleeps) before step STEP"},
};
#define N_OPTS (sizeof(OPTS) / sizeof(OPTS[0]))

// ----------------------------------------------------------------------------
// presets

struct preset {
    const char *name;
    const char *desc;
    const char *settings; // "name=value" pairs separated by spaces, applied over the defaults
};

static const struct preset PRESETS[] = {
    {"shakespeare-char", "character-level GPT for the embedded Tiny Shakespeare (CPU-sized)",
     "layers=4 heads=4 dim=128 block-size=128 seq=128 batch=16 tokenizer=char lr=3e-3 warmup=50 "
     "max-steps=1000 final-lr-frac=0.1 weight-decay=0.1 beta2=0.99 eval-every=200 eval-steps=20 "
     "vocab-multiple=128 sample-every=0"},
    {"gpt2-124m", "GPT-2 small (d12)",
     "layers=12 heads=12 dim=768 block-size=1024 seq=1024 tokenizer=gpt2 "
     "batch=4 lr=6e-4 warmup=700 max-steps=20000"},
    {"gpt2-350m", "GPT-2 medium (d24)",
     "layers=24 heads=16 dim=1024 block-size=1024 seq=1024 tokenizer=gpt2 "
     "batch=4 lr=3e-4 warmup=700 max-steps=20000"},
    {"gpt2-774m", "GPT-2 large (d36)",
     "layers=36 heads=20 dim=1280 block-size=1024 seq=1024 tokenizer=gpt2 "
     "batch=4 lr=2.5e-4 warmup=700 max-steps=20000"},
    {"gpt2-1.5b", "GPT-2 XL (d48)",
     "layers=48 heads=25 dim=1600 block-size=1024 seq=1024 tokenizer=gpt2 "
     "batch=4 lr=2e-4 warmup=700 max-steps=20000"},
    // OLMo-1 shapes from the OLMo paper (Groeneveld et al. 2024, table 1) and allenai's configs
    // (OLMo-1B.yaml, OLMo-7B.yaml): sequential pre-norm blocks, RoPE (theta 1e4), SwiGLU, no biases anywhere,
    // a LayerNorm without bias, context 2048, AdamW beta2 0.95, eps 1e-5, weight decay 0.1, clip 1.0.
    // OLMo's embedding is 50304 rows (its 50280-token vocab padded), as kiln's gpt2 vocab 50257 padded to
    // 50304, so the parameter counts match OLMo's exactly except for one difference: OLMo-1's LayerNorm is
    // non-parametric (no weight), kiln's keeps a weight of C per norm (2L+1 norms: +67,584 for 1B, +266,240
    // for 7B). `kiln export` folds those weights into the next linear layer, so the HF model is exact.
    // mlp-hidden is OLMo's mlp_hidden_size / 2 (kiln counts one half of the fused [gate | up]).
    // Published: OLMo-1B 1,176,764,416 parameters (tied), OLMo-7B 6,888,095,744 (untied).
    {"olmo-1b", "OLMo-1 1B shape: 16 layers, dim 2048, RoPE, SwiGLU, no-bias LayerNorm, tied",
     "layers=16 heads=16 dim=2048 mlp-hidden=8192 block-size=2048 seq=2048 tokenizer=gpt2 pos=rope "
     "rope-theta=10000 norm=layernorm norm-bias=0 norm-eps=1e-5 bias=0 mlp=swiglu tie-embeddings=1 "
     "batch=4 lr=4e-4 warmup=2000 max-steps=20000 beta2=0.95 eps=1e-5 weight-decay=0.1 grad-clip=1"},
    {"olmo-7b", "OLMo-1 7B shape: 32 layers, dim 4096, RoPE, SwiGLU, no-bias LayerNorm, untied",
     "layers=32 heads=32 dim=4096 mlp-hidden=11008 block-size=2048 seq=2048 tokenizer=gpt2 pos=rope "
     "rope-theta=10000 norm=layernorm norm-bias=0 norm-eps=1e-5 bias=0 mlp=swiglu tie-embeddings=0 "
     "batch=2 lr=3e-4 warmup=5000 max-steps=20000 beta2=0.95 eps=1e-5 weight-decay=0.1 grad-clip=1"},
    // Llama-style shapes from Meta's config.json files: llama-1b is Llama 3.2 1B's (16 layers, dim 2048,
    // 32 heads, 8 kv heads, SwiGLU 8192, RMSNorm eps 1e-5, RoPE theta 5e5) but untied (3.2 1B ties) and
    // without its long-context RoPE scaling; llama-8b is Llama 3 8B's (32 layers, dim 4096, 32/8 heads,
    // SwiGLU 14336, theta 5e5, untied, context 8192). Published counts use the 128,256-token vocab:
    // 1,235,814,400 (3.2 1B, tied) and 8,030,261,248 (3 8B); kiln's gpt2 vocab (50304 padded rows) gives
    // 1,179,191,296 for llama-1b untied and 7,391,678,464 for llama-8b (docs/models.md works them out).
    {"llama-1b",
     "Llama-style 1B (Llama 3.2 1B shape, untied, GPT-2 vocabulary): RoPE, RMSNorm, SwiGLU, GQA 32/8, no "
     "bias",
     "layers=16 heads=32 kv-heads=8 dim=2048 mlp-hidden=8192 block-size=2048 seq=2048 tokenizer=gpt2 "
     "pos=rope "
     "rope-theta=500000 norm=rmsnorm norm-eps=1e-5 bias=0 mlp=swiglu tie-embeddings=0 "
     "batch=4 lr=3e-4 warmup=2000 max-steps=20000 beta2=0.95 eps=1e-8 weight-decay=0.1 grad-clip=1"},
    {"llama-8b",
     "Llama-style 8B (Llama 3 8B shape, GPT-2 vocabulary): RoPE, RMSNorm, SwiGLU, GQA 32/8, no bias, untied",
     "layers=32 heads=32 kv-heads=8 dim=4096 mlp-hidden=14336 block-size=8192 seq=8192 tokenizer=gpt2 "
     "pos=rope "
     "rope-theta=500000 norm=rmsnorm norm-eps=1e-5 bias=0 mlp=swiglu tie-embeddings=0 "
     "batch=1 lr=3e-4 warmup=2000 max-steps=20000 beta2=0.95 eps=1e-8 weight-decay=0.1 grad-clip=1"},
    // Llama 3 70B's shape (80 layers, dim 8192, 64/8 heads, SwiGLU 28672, RMSNorm, RoPE theta 5e5, untied,
    // context 8192); 70,553,706,496 parameters with its 128,256-token vocabulary, 69,276,540,928 with GPT-2's.
    {"llama-70b",
     "Llama-style 70B (Llama 3 70B shape, GPT-2 vocabulary): RoPE, RMSNorm, SwiGLU, GQA 64/8, no bias, untied",
     "layers=80 heads=64 kv-heads=8 dim=8192 mlp-hidden=28672 block-size=8192 seq=8192 tokenizer=gpt2 "
     "pos=rope rope-theta=500000 norm=rmsnorm norm-eps=1e-5 bias=0 mlp=swiglu tie-embeddings=0 "
     "batch=1 lr=1.5e-4 warmup=2000 max-steps=20000 beta2=0.95 eps=1e-8 weight-decay=0.1 grad-clip=1"},
    // The GPT-3-style shapes of the long-sequence work in Megatron-DeepSpeed's example model table (its
    // ALCF/model.sh: 25B is 64 layers of 5760, 33B 80 of 5760), with the table's 80-head variant (head size
    // 72, its FlashAttention setting), RoPE as its long-sequence examples enable, LayerNorm, GELU, biases
    {"gpt-25b", "GPT-3-style 25B of the long-sequence work (64 layers, dim 5760, 80 heads, RoPE, GELU)",
     "layers=64 heads=80 dim=5760 block-size=2048 seq=2048 tokenizer=gpt2 pos=rope rope-theta=10000 "
     "batch=1 lr=1e-4 warmup=2000 max-steps=20000 beta2=0.95 weight-decay=0.1 grad-clip=1"},
    {"gpt-33b", "GPT-3-style 33B of the long-sequence work (80 layers, dim 5760, 80 heads, RoPE, GELU)",
     "layers=80 heads=80 dim=5760 block-size=2048 seq=2048 tokenizer=gpt2 pos=rope rope-theta=10000 "
     "batch=1 lr=1e-4 warmup=2000 max-steps=20000 beta2=0.95 weight-decay=0.1 grad-clip=1"},
};
#define N_PRESETS (sizeof(PRESETS) / sizeof(PRESETS[0]))

const char *kiln_config_preset_names(void) {
    static char buf[512];
    if (!buf[0])
        for (size_t i = 0; i < N_PRESETS; i++) {
            if (i)
                strcat(buf, " ");
            strcat(buf, PRESETS[i].name);
        }
    return buf;
}

// The vocabulary of the published model whose shape a preset copies, where the preset trains with another
// (kiln info says so, with the parameters that vocabulary would give): its size and whose it is.
static const struct {
    const char *preset;
    int vocab;
    const char *whose;
} REF_VOCAB[] = {{"llama-1b", 128256, "Llama 3.2 1B's"},
                 {"llama-8b", 128256, "Llama 3 8B's"},
                 {"llama-70b", 128256, "Llama 3 70B's"}};

int kiln_config_preset_ref_vocab(const char *preset, const char **whose) {
    for (size_t i = 0; i < sizeof(REF_VOCAB) / sizeof(REF_VOCAB[0]); i++)
        if (!strcmp(REF_VOCAB[i].preset, preset)) {
            *whose = REF_VOCAB[i].whose;
            return REF_VOCAB[i].vocab;
        }
    return 0;
}

static void config_defaults(struct kiln_config *c) {
    memset(c, 0, sizeof(*c));
    struct kiln_model_config *m = &c->model;
    m->n_layer = 12;
    m->n_head = 12;
    m->n_embd = 768;
    m->block_size = 1024;
    m->vocab_size = 0;
    m->vocab_multiple = 128;
    m->pos = KILN_POS_LEARNED;
    m->rope_theta = 10000.0f;
    m->norm_bias = 1;
    m->norm_eps = 1e-5f;
    m->bias = 1;
    m->tie_embeddings = 1;
    strcpy(c->tokenizer, "char");
    c->val_fraction = 0.1f;
    c->batch_size = 4;
    c->seq_len = 1024;
    c->max_steps = 1000;
    c->lr = 6e-4f;
    c->final_lr_frac = 0.1f;
    c->warmup_steps = 100;
    c->schedule = KILN_SCHED_COSINE;
    c->wsd_decay_frac = 0.2f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->weight_decay = 0.1f;
    // The GELU/SwiGLU output is recomputed from its kept input before each layer's backward, as
    // torch.compile's partitioner does: 1 GELU output (4C) less per layer for one elementwise pass (H100: ~1%
    // of a step; at the 1.3B shape 2.9 GiB less, docs/benchmarks.md). --recompute=none keeps it.
    c->recompute = KILN_RECOMPUTE_ACT;
    c->grad_clip = 1.0f;
    c->eval_every = 250;
    c->eval_steps = 20;
    c->log_every = 1;
    c->seed = 1337;
    strcpy(c->device, "auto");
    strcpy(c->comm, "auto");
    c->bucket_mb = 25;
    c->fp8_history = 16;
    c->prefetch = 1;
    c->zero = -1; // auto: ZeRO-1 with several data-parallel ranks (kiln_config_resolve)
    c->zero3_reshard = 1;
    c->sp = 1;
    c->tp = 1;
    c->tp_sp = 1;
    c->tp_overlap = 0; // off: the ring measured slower on 4 H100s (2026-11-27, docs/distributed.md)
    c->save_model = 1;
    c->hang_timeout = 600;
    c->world = 1;
    c->checkpoint = 1;
    c->keep_last = 3;
    strcpy(c->resume, "auto");
    c->spike_z = 6.0f;
    c->spike_window = 100;
    c->max_bad_steps = 10;
}

static int apply_settings(struct kiln_config *c, const char *settings, const char *where,
                          struct kiln_error *err) {
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", settings);
    for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        KILN_ASSERT(eq);
        *eq = 0;
        int rc = kiln_config_set(c, tok, eq + 1, where, err);
        if (rc)
            return rc;
    }
    return 0;
}

int kiln_config_init(struct kiln_config *cfg, const char *preset, struct kiln_error *err) {
    config_defaults(cfg);
    if (!preset)
        preset = "shakespeare-char";
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (strcmp(PRESETS[i].name, preset) == 0) {
            snprintf(cfg->preset, sizeof(cfg->preset), "%s", preset);
            return apply_settings(cfg, PRESETS[i].settings, "preset", err);
        }
    }
    return kiln_errorf(err, KILN_ERR_USAGE, "unknown preset '%s' (--preset): allowed values are %s", preset,
                       kiln_config_preset_names());
}

// ----------------------------------------------------------------------------
// setting one option

static const struct opt *find_opt(const char *name) {
    for (size_t i = 0; i < N_OPTS; i++)
        if (strcmp(OPTS[i].name, name) == 0)
            return &OPTS[i];
    return NULL;
}

// Closest option name by edit distance, for "did you mean".
static const char *suggest(const char *name) {
    const char *best = NULL;
    int best_d = 4;
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *o = OPTS[i].name;
        int n = (int)strlen(name), k = (int)strlen(o);
        if (n > 64 || k > 64)
            continue;
        int d[65][65];
        for (int a = 0; a <= n; a++)
            d[a][0] = a;
        for (int b = 0; b <= k; b++)
            d[0][b] = b;
        for (int a = 1; a <= n; a++)
            for (int b = 1; b <= k; b++) {
                int x = d[a - 1][b] + 1, y = d[a][b - 1] + 1, z = d[a - 1][b - 1] + (name[a - 1] != o[b - 1]);
                d[a][b] = x < y ? (x < z ? x : z) : (y < z ? y : z);
            }
        if (d[n][k] < best_d) {
            best_d = d[n][k];
            best = o;
        }
    }
    return best;
}

static int enum_index(const char *choices, const char *value) {
    int idx = 0;
    const char *p = choices;
    size_t n = strlen(value);
    while (*p) {
        const char *end = strchr(p, ' ');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, value, n) == 0)
            return idx;
        idx++;
        if (!end)
            break;
        p = end + 1;
    }
    return -1;
}

// A range bound as a person writes it: whole numbers in full (1048576, not 1.04858e+06), others briefly.
static void format_bound(double x, char *buf, size_t cap) {
    if (x == floor(x) && fabs(x) < 1e15) {
        snprintf(buf, cap, "%.0f", x);
        return;
    }
    char tmp[32], *out = buf;
    snprintf(tmp, sizeof(tmp), "%g", x);
    // 1e+18 -> 1e18, 1e-05 -> 1e-5
    for (const char *c = tmp; *c && (size_t)(out - buf) + 1 < cap; c++) {
        if ((c[0] == '+' || c[0] == '0') && c > tmp && (c[-1] == 'e' || (c[-1] == '-' && c[-2] == 'e')))
            continue;
        *out++ = *c;
    }
    *out = 0;
}

static int range_error(const struct opt *o, const char *value, const char *where, struct kiln_error *err) {
    char lo[32], hi[32];
    format_bound(o->min == -1 ? 0 : o->min, lo, sizeof(lo));
    format_bound(o->max, hi, sizeof(hi));
    return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for %s (%s): allowed range is %s to %s%s", value,
                       o->name, where, lo, hi, o->min == -1 ? ", or auto" : "");
}

int kiln_config_set(struct kiln_config *cfg, const char *name, const char *value, const char *where,
                    struct kiln_error *err) {
    if (strcmp(name, "preset") == 0)
        return kiln_errorf(err, KILN_ERR_USAGE, "preset (%s): a preset must come first; use --preset=NAME",
                           where);
    const struct opt *o = find_opt(name);
    if (!o) {
        const char *s = suggest(name);
        if (s)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "unknown option '%s' (%s): did you mean '%s'? see kiln help train", name,
                               where, s);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "unknown option '%s' (%s): see kiln help train for the options", name, where);
    }
    char *p = (char *)cfg + o->offset;
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_INT:
    case OPT_LONG: {
        // an integer option whose least value is -1 takes "auto" for it (--zero)
        if (o->min == -1 && !strcmp(value, "auto")) {
            *(int *)p = -1;
            return 0;
        }
        // integers, also written in scientific notation (1e6) as long as they are whole
        double d = strtod(value, &end);
        if (end == value || *end || errno || d != floor(d))
            return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for %s (%s): expected an integer%s", value,
                               o->name, where, o->min == -1 ? " or auto" : "");
        if (d < (o->min == -1 ? 0 : o->min) || d > o->max)
            return range_error(o, value, where, err);
        if (o->type == OPT_INT)
            *(int *)p = (int)d;
        else
            *(long *)p = (long)d;
        return 0;
    }
    case OPT_FLOAT:
    case OPT_DOUBLE: {
        double d = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(d))
            return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for %s (%s): expected a number", value,
                               o->name, where);
        if (d < o->min || d > o->max)
            return range_error(o, value, where, err);
        if (o->type == OPT_FLOAT)
            *(float *)p = (float)d;
        else
            *(double *)p = d;
        return 0;
    }
    case OPT_U64: {
        if (!*value || *value == '-')
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "bad value '%s' for %s (%s): expected a non-negative integer", value, o->name,
                               where);
        unsigned long long u = strtoull(value, &end, 10);
        if (end == value || *end || errno)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "bad value '%s' for %s (%s): expected a non-negative integer", value, o->name,
                               where);
        *(uint64_t *)p = (uint64_t)u;
        return 0;
    }
    case OPT_STR:
        if (strlen(value) >= o->size)
            return kiln_errorf(err, KILN_ERR_USAGE, "value for %s (%s) is too long: at most %zu characters",
                               o->name, where, o->size - 1);
        if (!strcmp(o->name, "tokenizer") && strcmp(value, "char") && strcmp(value, "gpt2") &&
            (strlen(value) < 5 || strcmp(value + strlen(value) - 5, ".json")))
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "bad value '%s' for tokenizer (%s): allowed values are char,gpt2, or the path "
                               "of a Hugging Face tokenizer.json",
                               value, where);
        snprintf(p, o->size, "%s", value);
        return 0;
    case OPT_BOOL:
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on"))
            *(int *)p = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no") ||
                 !strcmp(value, "off"))
            *(int *)p = 0;
        else
            return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for %s (%s): allowed values are 0, 1",
                               value, o->name, where);
        return 0;
    case OPT_ENUM: {
        int idx = enum_index(o->choices, value);
        if (idx < 0) {
            char choices[256];
            snprintf(choices, sizeof(choices), "%s", o->choices);
            for (char *c = choices; *c; c++)
                if (*c == ' ')
                    *c = ',';
            return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for %s (%s): allowed values are %s",
                               value, o->name, where, choices);
        }
        if (o->size == sizeof(int)) // an enum field; char arrays hold string-valued enums
            *(int *)p = idx;
        else
            snprintf(p, o->size, "%s", value); // string-valued enums (tokenizer, device)
        return 0;
    }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// flags and config files

// Config files: `name = value` lines; '#' or ';' starts a comment line, and a '#' after a blank a comment at
// the end of a line (`lr = 3e-3   # peak`); [section] headers are ignored.
// Calls fn(user, name, value, lineno) for each setting; stops at the first non-zero return.
typedef int (*config_line_fn)(void *user, const char *name, const char *value, int lineno);

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

// Cuts a line at its trailing comment: a '#' after a space or tab. Values are unquoted, so a '#' inside one
// (`data = shards/a#b.bin`) stays part of it.
static void strip_comment(char *s) {
    for (char *p = s; *p; p++)
        if (*p == '#' && p > s && (p[-1] == ' ' || p[-1] == '\t')) {
            *p = 0;
            return;
        }
}

static int read_config_lines(const char *path, config_line_fn fn, void *user, struct kiln_error *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return kiln_errorf(err, KILN_ERR_USAGE, "cannot open config file '%s' (--config): %s", path,
                           strerror(errno));
    // fopen opens a directory for reading and the first read fails: it would read as an empty config
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "cannot open config file '%s' (--config): it is a directory; give a file of "
                           "name = value lines",
                           path);
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    while (!rc && (len = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        // a NUL would cut the line short unseen: config files are text
        if (memchr(line, '\0', (size_t)len)) {
            rc = kiln_errorf(
                err, KILN_ERR_USAGE,
                "NUL byte in config file (%s:%d): config files are text of name = value lines; is "
                "this a binary file?",
                path, lineno);
            break;
        }
        if (len > 4094) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "line too long in config file (%s:%d): at most %d characters", path, lineno,
                             4094);
            break;
        }
        char *s = line;
        // a UTF-8 byte order mark, which some editors put first: not part of the first option's name
        if (lineno == 1 && !strncmp(s, "\xEF\xBB\xBF", 3))
            s += 3;
        s = trim(s);
        if (!*s || *s == '#' || *s == ';' || *s == '[')
            continue;
        strip_comment(s);
        s = trim(s);
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "syntax error in config file (%s:%d): expected 'name = value'", path, lineno);
            break;
        }
        *eq = 0;
        char *name = trim(s), *value = trim(eq + 1);
        if (!*name) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "syntax error in config file (%s:%d): missing the option name", path, lineno);
            break;
        }
        rc = fn(user, name, value, lineno);
    }
    if (!rc && ferror(f)) // a read that failed part-way must not pass for the end of the file
        rc = kiln_errorf(err, KILN_ERR_USAGE, "cannot read config file '%s' (--config): %s", path,
                         strerror(errno));
    free(line);
    fclose(f);
    return rc;
}

struct file_ctx {
    struct kiln_config *cfg;
    const char *path;
    struct kiln_error *err;
};

static int set_from_file(void *user, const char *name, const char *value, int lineno) {
    struct file_ctx *c = user;
    if (strcmp(name, "preset") == 0)
        return 0; // applied first, before the file's other settings
    char where[1200];
    snprintf(where, sizeof(where), "%s:%d", c->path, lineno);
    if (strcmp(name, "config") == 0) // (it is a flag, not an option of the table)
        return kiln_errorf(c->err, KILN_ERR_USAGE,
                           "config files do not nest (%s): 'config = %s' names another config file; give "
                           "its options here instead",
                           where, value);
    return kiln_config_set(c->cfg, name, value, where, c->err);
}

static int find_preset(void *user, const char *name, const char *value, int lineno) {
    (void)lineno;
    if (strcmp(name, "preset") == 0)
        snprintf((char *)user, 64, "%s", value);
    return 0;
}

static const char *flag_value(int argc, char **argv, int *i, const char *flag) {
    // --flag=value or --flag value
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) == 0 && argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (strcmp(argv[*i], flag) == 0 && *i + 1 < argc) {
        (*i)++;
        return argv[*i];
    }
    return NULL;
}

int kiln_config_parse(struct kiln_config *cfg, int argc, char **argv, struct kiln_error *err) {
    // pass 1: the preset (flag wins over the config file) and the config file
    const char *preset = NULL, *config_path = NULL;
    char file_preset[64] = "";
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = flag_value(argc, argv, &i, "--preset")))
            preset = v;
        else if ((v = flag_value(argc, argv, &i, "--config")))
            config_path = v;
        else if (!strcmp(argv[i], "--preset") || !strcmp(argv[i], "--config"))
            return kiln_errorf(err, KILN_ERR_USAGE, "%s needs a value (%s=...)", argv[i], argv[i]);
    }
    int rc;
    if (config_path && !preset) {
        if ((rc = read_config_lines(config_path, find_preset, file_preset, err)))
            return rc;
        if (file_preset[0])
            preset = file_preset;
    }
    if ((rc = kiln_config_init(cfg, preset, err)))
        return rc;
    struct file_ctx fc = {cfg, config_path, err};
    if (config_path && (rc = read_config_lines(config_path, set_from_file, &fc, err)))
        return rc;
    // pass 2: flags
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (flag_value(argc, argv, &i, "--preset") || flag_value(argc, argv, &i, "--config"))
            continue;
        if (strncmp(a, "--", 2) != 0)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "unexpected argument '%s': options are written --name=value", a);
        const char *eq = strchr(a, '=');
        char name[128];
        const char *value;
        if (eq) {
            size_t n = (size_t)(eq - a - 2);
            if (n >= sizeof(name))
                n = sizeof(name) - 1;
            memcpy(name, a + 2, n);
            name[n] = 0;
            value = eq + 1;
        } else {
            // a bare --flag is allowed for booleans only
            snprintf(name, sizeof(name), "%s", a + 2);
            const struct opt *o = find_opt(name);
            if (o && o->type == OPT_BOOL)
                value = "1";
            else if (o)
                return kiln_errorf(err, KILN_ERR_USAGE, "option --%s needs a value: write --%s=VALUE", name,
                                   name);
            else
                value = "";
        }
        char where[160];
        snprintf(where, sizeof(where), "--%s", name);
        if ((rc = kiln_config_set(cfg, name, value, where, err)))
            return rc;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// validation and derived quantities

int kiln_config_validate(const struct kiln_config *c, struct kiln_error *err) {
    const struct kiln_model_config *m = &c->model;
    if (m->n_embd % m->n_head)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "dim %d is not divisible by heads %d (--dim, --heads): choose heads "
                           "that divide dim",
                           m->n_embd, m->n_head);
    int kv = kiln_model_kv_heads(m);
    if (kv > m->n_head || m->n_head % kv)
        return kiln_errorf(err, KILN_ERR_USAGE, "kv-heads %d must divide heads %d (--kv-heads)", kv,
                           m->n_head);
    int hs = kiln_model_head_size(m);
    if (m->pos == KILN_POS_ROPE && hs % 2)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "RoPE needs an even head size, got %d (--pos=rope, --dim/--heads)", hs);
    if (c->seq_len > m->block_size)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "seq %d is longer than block-size %d (--seq): raise --block-size or "
                           "lower --seq",
                           c->seq_len, m->block_size);
    int dp = kiln_config_dp(c);
    long bt = (long)c->batch_size * c->seq_len * (dp > 0 ? dp : 1);
    if (c->total_batch_tokens && c->total_batch_tokens % bt)
        return dp > 1 ? kiln_errorf(err, KILN_ERR_USAGE,
                                    "total-batch %ld is not a multiple of batch*seq*%s = %d*%d*%d = %ld "
                                    "(--total-batch): every rank takes whole micro-batches",
                                    c->total_batch_tokens,
                                    c->sp > 1 || c->tp > 1 ? "data-parallel ranks" : "ranks",
                                    c->batch_size, c->seq_len, dp, bt)
                      : kiln_errorf(err, KILN_ERR_USAGE,
                                    "total-batch %ld is not a multiple of batch*seq = %ld (--total-batch)",
                                    c->total_batch_tokens, bt);
    if (c->reduce_dtype == KILN_GRAD_BF16 && c->grad_dtype == KILN_GRAD_FP32)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "reduce-dtype bf16 with grad-dtype fp32 (--reduce-dtype): gradients travel in their own "
            "dtype; use --grad-dtype=auto (bf16 with one micro-step) or --reduce-dtype=fp32");
    if (c->reduce_dtype == KILN_GRAD_BF16 && kiln_config_micro_steps(c) > 1)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "reduce-dtype bf16 with %d micro-steps per step (--reduce-dtype): gradients accumulate "
            "in fp32 and travel in their own dtype; use --reduce-dtype=fp32, or one micro-step",
            kiln_config_micro_steps(c));
    if (c->reduce_dtype == KILN_GRAD_BF16 && !strcmp(c->device, "cpu"))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "reduce-dtype bf16 on device cpu (--reduce-dtype): the cpu backend reduces fp32 "
                           "gradients; use --reduce-dtype=auto or fp32");
    if (c->grad_dtype == KILN_GRAD_BF16 && kiln_config_micro_steps(c) > 1)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "grad-dtype bf16 with %d micro-steps per step (--grad-dtype): gradients would "
                           "accumulate in bf16; use --grad-dtype=auto or fp32, or --total-batch=%ld",
                           kiln_config_micro_steps(c), bt);
    if (c->grad_dtype == KILN_GRAD_BF16 && !strcmp(c->device, "cpu"))
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "grad-dtype bf16 on device cpu (--grad-dtype): the cpu backend keeps fp32 gradients; "
            "use --grad-dtype=auto or fp32, or --device=cuda");
    if (c->zero != 3 && (!c->zero3_reshard || c->zero3_accumulate != KILN_ACCUMULATE_SHARDED))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "%s with zero %d (--%s): it says how ZeRO-3 keeps gathered weights or gradients; "
                           "add --zero=3 or drop it",
                           !c->zero3_reshard ? "zero3-reshard-after-forward 0" : "zero3-accumulate whole",
                           c->zero, !c->zero3_reshard ? "zero3-reshard-after-forward" : "zero3-accumulate");
    if (c->tp > 1 && c->sample_every)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "sample-every with tp %d (--sample-every): a sample decodes on rank 0 alone, and "
                           "tensor parallelism splits every layer; sample from RUN/model.safetensors with "
                           "kiln sample instead",
                           c->tp);
    if (c->sample_every && c->zero == 3)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "sample-every with zero 3 (--sample-every): a sample decodes on rank 0 alone, and ZeRO-3's "
            "weights are sharded; sample from a checkpoint with kiln sample instead");
    if (c->tensorboard[0] && !c->out[0])
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "tensorboard without a run directory (--tensorboard=%s): the events mirror "
                           "RUN/metrics.jsonl; add --out=DIR",
                           c->tensorboard);
    if ((c->offload & KILN_OFFLOAD_ACTIVATIONS) && c->recompute != KILN_RECOMPUTE_BLOCK &&
        c->recompute != KILN_RECOMPUTE_SELECTIVE && c->recompute != KILN_RECOMPUTE_AUTO)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "offload %s without --recompute=block (--offload): what goes to the host is each "
                           "layer's input, which is all the backward keeps only when it recomputes whole "
                           "blocks; add --recompute=block",
                           c->offload == KILN_OFFLOAD_ALL ? "all" : "activations");
    // precision: the fp8 options need fp8, and what fp8 does not do yet is refused
    if (!c->precision && (c->fp8_recipe || c->fp8_grad || c->fp8_head || c->fp8_history != 16 || c->fp8_all_gather))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "--fp8-%s with precision bf16 (--precision): the fp8 options apply to FP8 "
                           "training; add --precision=fp8 or drop them",
                           c->fp8_recipe  ? "recipe"
                           : c->fp8_grad  ? "grad"
                           : c->fp8_head  ? "head"
                           : c->fp8_all_gather ? "all-gather"
                                          : "history");
    if (c->fp8_all_gather && c->zero != 3)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "fp8-all-gather without --zero=3 (--fp8-all-gather): only ZeRO-3 gathers the weights "
                           "for each layer; add --zero=3 or drop it");
    if (c->fp8_all_gather && c->fp8_recipe)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "fp8-all-gather with recipe %s (--fp8-all-gather): the gathered codes carry one "
                           "scale a weight, taken when they are cast; use --fp8-recipe=tensorwise",
                           c->fp8_recipe == 1 ? "rowwise" : "delayed");
    if (c->fp8_all_gather && (c->offload & KILN_OFFLOAD_OPTIMIZER))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "fp8-all-gather with --offload=%s (--fp8-all-gather): the offloaded optimizer updates "
                           "the shard layer by layer under the forward, and the codes are cast from the whole "
                           "updated shard; drop one of the two",
                           c->offload == KILN_OFFLOAD_ALL ? "all" : "optimizer");
    if (c->precision && c->fp8_recipe != 2 && c->fp8_history != 16)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "fp8-history %d with recipe %s (--fp8-history): only delayed scaling keeps a "
                           "history; add --fp8-recipe=delayed or drop it",
                           c->fp8_history, c->fp8_recipe ? "rowwise" : "tensorwise");
    if ((c->offload & KILN_OFFLOAD_OPTIMIZER) && c->stochastic_rounding)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "offload optimizer with stochastic rounding (--offload, --stochastic-rounding): the "
            "host's AdamW rounds the bf16 weights to nearest; drop one of the two");
    return 0;
}

int kiln_config_dp(const struct kiln_config *c) {
    // the ranks of a tensor- or sequence-parallel group share sequences
    int dp = (c->world > 0 ? c->world : 1) / (c->sp > 0 ? c->sp : 1) / (c->tp > 0 ? c->tp : 1);
    return dp > 0 ? dp : 1;
}

void kiln_config_resolve(struct kiln_config *c, int world) {
    c->world = world > 0 ? world : 1;
    // ZeRO-1 moves less than DDP (a reduce-scatter of the gradients and an all-gather of the new weights against
    // an all-reduce of the gradients: 6 bytes a parameter against 8 with bf16 weights and fp32 gradients) and
    // keeps 1/N of the optimizer state; at the 1.3B shape on 2 H100s it kept 96.9% of one GPU's speed a GPU,
    // DDP 92.3% (docs/distributed.md)
    c->zero = kiln_config_zero(c);
}

int kiln_config_zero(const struct kiln_config *c) {
    return kiln_config_zero_at(c, kiln_config_dp(c));
}

int kiln_config_zero_at(const struct kiln_config *c, int dp) {
    return c->zero >= 0 ? c->zero : dp > 1 ? 1 : 0;
}

int kiln_config_micro_steps(const struct kiln_config *c) {
    int dp = kiln_config_dp(c);
    long bt = (long)c->batch_size * c->seq_len * (dp > 0 ? dp : 1);
    long n = c->total_batch_tokens ? c->total_batch_tokens / bt : 1;
    return n > 0 ? (int)n : 1;
}

enum kiln_dtype kiln_config_grad_dtype(const struct kiln_config *c, int mixed) {
    if (c->grad_dtype == KILN_GRAD_AUTO) {
        // several ranks reduce the gradients in their own dtype: fp32 unless --reduce-dtype=bf16 asks for
        // less
        if (c->world > 1 && c->reduce_dtype != KILN_GRAD_BF16)
            return KILN_F32;
        return mixed && kiln_config_micro_steps(c) == 1 ? KILN_BF16 : KILN_F32;
    }
    return c->grad_dtype == KILN_GRAD_BF16 ? KILN_BF16 : KILN_F32;
}

// ----------------------------------------------------------------------------
// output

static void opt_format(const struct opt *o, const struct kiln_config *cfg, char *buf, size_t cap) {
    const char *p = (const char *)cfg + o->offset;
    switch (o->type) {
    case OPT_INT:
        if (o->min == -1 && *(const int *)p == -1)
            snprintf(buf, cap, "auto");
        else
            snprintf(buf, cap, "%d", *(const int *)p);
        break;
    case OPT_BOOL:
        snprintf(buf, cap, "%d", *(const int *)p);
        break;
    case OPT_LONG:
        snprintf(buf, cap, "%ld", *(const long *)p);
        break;
    case OPT_FLOAT: {
        // the shortest form that reads back as the same float: 0.003, not 0.00300000003 (9 digits always do)
        float x = *(const float *)p;
        for (int digits = 6; digits <= 9; digits++) {
            snprintf(buf, cap, "%.*g", digits, (double)x);
            if (strtof(buf, NULL) == x)
                break;
        }
        break;
    }
    case OPT_DOUBLE: {
        double x = *(const double *)p;
        for (int digits = 15; digits <= 17; digits++) {
            snprintf(buf, cap, "%.*g", digits, x);
            if (strtod(buf, NULL) == x)
                break;
        }
        break;
    }
    case OPT_U64:
        snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case OPT_STR:
        snprintf(buf, cap, "%s", p);
        break;
    case OPT_ENUM:
        if (o->size != sizeof(int)) {
            snprintf(buf, cap, "%s", p);
        } else {
            int idx = *(const int *)p, k = 0;
            const char *s = o->choices;
            while (k < idx && (s = strchr(s, ' ')))
                s++, k++;
            size_t len = s ? strcspn(s, " ") : 0;
            snprintf(buf, cap, "%.*s", (int)len, s ? s : "");
        }
        break;
    }
}

size_t kiln_config_n_options(void) {
    return N_OPTS;
}

const char *kiln_config_option_name(size_t i) {
    return i < N_OPTS ? OPTS[i].name : NULL;
}

void kiln_config_option_value(const struct kiln_config *cfg, size_t i, char *buf, size_t cap) {
    if (i < N_OPTS)
        opt_format(&OPTS[i], cfg, buf, cap);
    else if (cap)
        buf[0] = 0;
}

void kiln_config_write(const struct kiln_config *cfg, FILE *f) {
    fprintf(f, "# kiln config (fully resolved); reuse with: kiln train --config=THIS_FILE\n");
    fprintf(f, "preset = %s\n", cfg->preset);
    for (size_t i = 0; i < N_OPTS; i++) {
        char buf[1100];
        opt_format(&OPTS[i], cfg, buf, sizeof(buf));
        fprintf(f, "%s = %s\n", OPTS[i].name, buf);
    }
}

// Options for tests only (fault injection): kept out of kiln info's listing and kiln help train's unless
// asked (--all), so that a user reading them meets the model and the run first.
static int opt_testing(const struct opt *o) {
    return !strncmp(o->help, "testing only", 12);
}

int kiln_config_print(const struct kiln_config *cfg, FILE *f, int all) {
    int hidden = 0;
    fprintf(f, "preset = %s\n", cfg->preset);
    for (size_t i = 0; i < N_OPTS; i++) {
        if (!all && opt_testing(&OPTS[i])) {
            hidden++;
            continue;
        }
        char buf[1100];
        opt_format(&OPTS[i], cfg, buf, sizeof(buf));
        fprintf(f, "%s = %s\n", OPTS[i].name, buf);
    }
    return hidden;
}

// One option's help line: the help text, then what it accepts and its default (kiln train's: the
// shakespeare-char preset over the built-in defaults).
static void print_opt_help(FILE *f, const struct opt *o, const struct kiln_config *def) {
    char allowed[300] = "", dflt[1100];
    char lo[32], hi[32];
    format_bound(o->min, lo, sizeof(lo));
    format_bound(o->max, hi, sizeof(hi));
    switch (o->type) {
    case OPT_ENUM: {
        char choices[256];
        snprintf(choices, sizeof(choices), "%s", o->choices);
        for (char *c = choices; *c; c++)
            if (*c == ' ')
                *c = ',';
        snprintf(allowed, sizeof(allowed), "one of %s", choices);
        break;
    }
    case OPT_BOOL:
        snprintf(allowed, sizeof(allowed), "0 or 1");
        break;
    case OPT_INT:
    case OPT_LONG:
        if (o->min == -1) // -1 is auto
            snprintf(allowed, sizeof(allowed), "integer 0 to %s, or auto", hi);
        else
            snprintf(allowed, sizeof(allowed), "integer %s to %s", lo, hi);
        break;
    case OPT_FLOAT:
    case OPT_DOUBLE:
        snprintf(allowed, sizeof(allowed), "%s to %s", lo, hi);
        break;
    case OPT_U64:
        snprintf(allowed, sizeof(allowed), "integer 0 to 2^64-1");
        break;
    case OPT_STR:
        snprintf(allowed, sizeof(allowed), "text");
        break;
    }
    opt_format(o, def, dflt, sizeof(dflt));
    fprintf(f, "  %-20s %s [%s; default %s]\n", o->name, o->help, allowed, dflt[0] ? dflt : "empty");
}

static void print_help_header(FILE *f) {
    fprintf(f, "options (--name=value on the command line, name = value in a --config file):\n");
    fprintf(f, "  %-20s %s\n", "preset", "model and training preset (default shakespeare-char); one of:");
    for (size_t i = 0; i < N_PRESETS; i++)
        fprintf(f, "  %-20s   %-18s %s\n", "", PRESETS[i].name, PRESETS[i].desc);
    fprintf(f, "  %-20s %s\n", "config", "a file of name = value lines");
}

void kiln_config_print_help(FILE *f, int all) {
    struct kiln_config def;
    KILN_ASSERT(kiln_config_init(&def, NULL, NULL) == 0);
    print_help_header(f);
    int hidden = 0;
    for (size_t i = 0; i < N_OPTS; i++) {
        if (!all && opt_testing(&OPTS[i]))
            hidden++;
        else
            print_opt_help(f, &OPTS[i], &def);
    }
    if (hidden)
        fprintf(f, "(%d fault-injection options, for tests, are not shown: kiln help train --all)\n", hidden);
}

void kiln_config_print_help_only(FILE *f, const char *const *names) {
    struct kiln_config def;
    KILN_ASSERT(kiln_config_init(&def, NULL, NULL) == 0);
    print_help_header(f);
    for (size_t i = 0; i < N_OPTS; i++)
        for (const char *const *n = names; *n; n++)
            if (!strcmp(*n, OPTS[i].name))
                print_opt_help(f, &OPTS[i], &def);
}
