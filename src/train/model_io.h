// Model weights <-> safetensors files (fp32, Hugging Face-style names from the parameter table).
#ifndef KILN_TRAIN_MODEL_IO_H
#define KILN_TRAIN_MODEL_IO_H

#include "model/config.h"
#include "model/params.h"

// Writes every tensor of the table from params (pt->total floats) to path, atomically.
int kiln_write_model_safetensors(const char *path, const struct kiln_param_table *pt, const float *params,
                                 const struct kiln_config *cfg, struct kiln_error *err);
// Reads path into params (pt->total floats, padding zeroed). Every tensor of the table must be present, F32,
// with the same shape; extra tensors are an error too (they mean a different architecture).
int kiln_read_model_safetensors(const char *path, const struct kiln_param_table *pt, float *params,
                                struct kiln_error *err);

#endif
