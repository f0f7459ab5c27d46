// Hugging Face interop: a kiln model <-> a transformers directory (config.json + model.safetensors).
//
// Three architectures map exactly (no approximation, only renames, splits, transposes and folds):
//   GPT2LMHeadModel   --pos=learned --norm=layernorm --norm-bias=1 --bias=1 --mlp=gelu, heads == kv-heads.
//                     HF's Conv1D stores weights (in, out): kiln's nn.Linear (out, in) tensors are
//                     transposed.
//   LlamaForCausalLM  --pos=rope --norm=rmsnorm --mlp=swiglu, any kv-heads; --bias=1 maps to attention_bias
//   and
//                     mlp_bias. kiln's fused [q | k | v] and [gate | up] rows are split. kiln's RoPE rotates
//                     pairs (i, i + HS/2), which is HF's rotate_half convention, so q and k rows are not
//                     permuted.
//   OlmoForCausalLM   --pos=rope --norm=layernorm --norm-bias=0 --bias=0 --mlp=swiglu (OLMo-1). OLMo's
//   LayerNorm
//                     has no weight: kiln's norm weights are folded into the columns of the linear layers
//                     that read the norm (q/k/v, gate/up, lm_head), which is exact: W (w * n) = (W diag(w))
//                     n.
// Everything else (ALiBi, no positions, parallel blocks, qk-norm, ...) is refused with a message naming the
// option. The HF vocabulary has V rows (kiln's padding rows to Vp are dropped and restored as zeros on
// import). kiln's tokenizer travels in kiln.json next to config.json (HF ignores it).
#ifndef KILN_INTEROP_HF_H
#define KILN_INTEROP_HF_H

#include "run/options.h"
#include "run/model_io.h"
#include "util/error.h"

enum kiln_hf_arch { KILN_HF_GPT2 = 0, KILN_HF_LLAMA = 1, KILN_HF_OLMO = 2 };
const char *kiln_hf_arch_name(enum kiln_hf_arch a); // "GPT2LMHeadModel", ...

// The HF architecture of a kiln model, or a usage error naming the option that has no HF equivalent.
int kiln_hf_arch_of(const struct kiln_model_config *m, enum kiln_hf_arch *arch, struct kiln_error *err);

struct kiln_hf_export_opts {
    int bf16; // write BF16 tensors (round to nearest even) instead of F32
};

// Writes DIR/config.json, DIR/model.safetensors and DIR/kiln.json. params: laid out by kiln_params_build(m)
// (host f32). m->vocab_size must be set.
int kiln_hf_export(const char *dir, const struct kiln_model_config *m, const struct kiln_run_tokenizer *tok,
                   const float *params, const struct kiln_hf_export_opts *o, struct kiln_error *err);

// Writes the tokenizer files of DIR (hf_tokenizer.c), so that transformers' AutoTokenizer loads the
// tokenizer the model was trained with: gpt2: vocab.json and merges.txt (kiln's encoder.json and vocab.bpe
// from gpt2_dir, byte for byte), tokenizer.json (the `tokenizers` library's format: byte-level BPE),
// tokenizer_config.json and special_tokens_map.json; char: tokenizer.json (one token per character) and the
// two configs. max_len: model_max_length (the block size). A tokenizer with no such form writes nothing and
// returns 0 with why (cap why_cap) saying why; why is "" when the files were written.
int kiln_hf_export_tokenizer(const char *dir, const struct kiln_run_tokenizer *tok, const char *gpt2_dir,
                             int max_len, char *why, size_t why_cap, struct kiln_error *err);

// Reads DIR/config.json (and DIR/kiln.json when present) into cfg's model fields, tokenizer and sequence
// length. cfg should hold defaults (kiln_config_init). Refuses what kiln cannot represent, naming the key.
int kiln_hf_import_config(const char *dir, struct kiln_config *cfg, struct kiln_run_tokenizer *tok,
                          struct kiln_error *err);
// Reads DIR/model.safetensors (F32, BF16 or F16) into params laid out by kiln_params_build(m) (padding zero).
int kiln_hf_import_weights(const char *dir, const struct kiln_model_config *m, float *params,
                           struct kiln_error *err);

#endif
