// safetensors files (the Hugging Face format): an 8-byte little-endian u64 N, N bytes of JSON header
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
// padded with spaces to a multiple of 8, then the byte buffer. Offsets are relative to the buffer start, and
// the tensors cover the buffer exactly (no gaps, no overlaps). Tensor data is little-endian.
//
// io/ does not include model/ (docs/architecture.md), so the dtype is an int holding an enum kiln_st_dtype; its first
// three values are those of enum kiln_dtype in core/ops.h (F32 = 0, BF16 = 1, I32 = 2), so a KILN_F32 can
// be stored in it directly. The test checks that the two enums agree.
#ifndef KILN_IO_SAFETENSORS_H
#define KILN_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

enum kiln_st_dtype {
    KILN_ST_F32 = 0,  // == KILN_F32
    KILN_ST_BF16 = 1, // == KILN_BF16
    KILN_ST_I32 = 2,  // == KILN_I32
    KILN_ST_F16 = 3,
    KILN_ST_I64 = 4,
    KILN_ST_NDTYPES
};
size_t kiln_st_dtype_bytes(int dtype);     // 0 for an unknown dtype
const char *kiln_st_dtype_name(int dtype); // "F32", "BF16", ...; NULL for an unknown dtype
int kiln_st_dtype_parse(const char *name); // -1 for an unknown name

#define KILN_ST_MAX_DIMS 8

struct kiln_st_tensor {
    const char *name;
    int dtype; // enum kiln_st_dtype
    int ndim;  // 0..8; 0 is a scalar (one element)
    int64_t shape[KILN_ST_MAX_DIMS];
    const void *data; // may be NULL when the tensor has no elements. Read from a file it points into the
                      // mapping; it is aligned to its dtype when every earlier tensor's size is a multiple
                      // of it (always for all-fp32 files), else use memcpy.
};
int64_t kiln_st_tensor_numel(const struct kiln_st_tensor *t);
size_t kiln_st_tensor_bytes(const struct kiln_st_tensor *t);

// Writes the file atomically (temp file + fsync + rename + fsync dir), tensors in the given order. meta_kv
// is NULL or a NULL-terminated list key0, value0, key1, value1, ..., NULL. Rejects duplicate or empty
// names, the name "__metadata__", unknown dtypes, bad ndim and negative dims.
int kiln_safetensors_write(const char *path, const struct kiln_st_tensor *tensors, int n,
                           const char *const *meta_kv, struct kiln_error *err);
// The same, also returning the sha256 (hex) of the bytes written (sha256_hex may be NULL).
int kiln_safetensors_write_sha(const char *path, const struct kiln_st_tensor *tensors, int n,
                               const char *const *meta_kv, char sha256_hex[65], struct kiln_error *err);

// A read-only, memory-mapped file. Open validates the whole header against the file size.
struct kiln_safetensors;
int kiln_safetensors_open(struct kiln_safetensors **out, const char *path, struct kiln_error *err);
int kiln_safetensors_count(const struct kiln_safetensors *f);
const struct kiln_st_tensor *kiln_safetensors_at(const struct kiln_safetensors *f, int i); // header order
const struct kiln_st_tensor *kiln_safetensors_find(const struct kiln_safetensors *f, const char *name);
const char *kiln_safetensors_meta(const struct kiln_safetensors *f, const char *key); // NULL if absent
int kiln_safetensors_meta_count(const struct kiln_safetensors *f);
const char *kiln_safetensors_path(const struct kiln_safetensors *f);
// The byte buffer after the header (every tensor's data, in offset order) and its size.
const void *kiln_safetensors_data(const struct kiln_safetensors *f, size_t *bytes);
void kiln_safetensors_close(struct kiln_safetensors *f); // NULL is fine

#endif
