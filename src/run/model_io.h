// Model weights <-> safetensors files (fp32, Hugging Face-style names from the parameter table).
#ifndef KILN_RUN_MODEL_IO_H
#define KILN_RUN_MODEL_IO_H

#include "run/options.h"
#include "model/params.h"

// Writes every tensor of the table from params (pt->total floats) to path, atomically.
int kiln_write_model_safetensors(const char *path, const struct kiln_param_table *pt, const float *params,
                                 const struct kiln_config *cfg, struct kiln_error *err);
// Reads path into params (pt->total floats, padding zeroed). Every tensor of the table must be present, F32,
// with the same shape; extra tensors are an error too (they mean a different architecture). A file with a
// data_sha256 in its metadata (every model.safetensors that kiln_write_model_safetensors wrote) must match
// it; one without (older runs, hand-made files) loads unchecked. Every weight must be finite. The writer
// stores that data_sha256: the SHA-256 of the data buffer (docs/formats.md).
int kiln_read_model_safetensors(const char *path, const struct kiln_param_table *pt, float *params,
                                struct kiln_error *err);

// The first non-finite element of x (n floats) as an error naming the file, the tensor and the element's
// index; 0 when all are finite. kiln_nonfinite_error words the same error for a caller that converts as it
// goes (import from BF16/F16).
int kiln_check_finite(const float *x, size_t n, const char *file, const char *tensor, struct kiln_error *err);
int kiln_nonfinite_error(struct kiln_error *err, const char *file, const char *tensor, int64_t index,
                         float value);

// ---- run directories (kiln train --out): config, model.safetensors, vocab.char --------------------

// The tokenizer a run was trained with: "gpt2", or "char" with its vocabulary (id i is byte chars[i]).
struct kiln_run_tokenizer {
    char name[1024]; // as --tokenizer: char, gpt2, or a tokenizer.json's path
    char chars[256];
    int n_chars;
};

// Reads DIR/config (and DIR/vocab.char for a char model) and sets cfg->model.vocab_size from the tokenizer
// (gpt2's vocabulary from data/gpt2, else source_dir/data/gpt2: the KILN_SOURCE_DIR knob; NULL: the build's
// source tree).
int kiln_run_read_config(const char *dir, struct kiln_config *cfg, struct kiln_run_tokenizer *tok,
                         const char *source_dir, struct kiln_error *err);
// The weights file of a run directory: RUN/model.safetensors, written when a run finishes, or, for a run that
// was stopped or is still going, the newest complete checkpoint's model.safetensors (one process's or a group's:
// both hold the whole f32 weights). path gets it; an error when the run has neither.
int kiln_run_weights_path(const char *dir, char *path, size_t cap, struct kiln_error *err);

// Writes a run directory that kiln sample, kiln logits and kiln export read: DIR/config, DIR/vocab.char (char
// tokenizer) and DIR/model.safetensors (params laid out by kiln_params_build(&cfg->model)).
int kiln_run_write(const char *dir, const struct kiln_config *cfg, const struct kiln_run_tokenizer *tok,
                   const float *params, struct kiln_error *err);

#endif
