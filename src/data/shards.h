// Token files on disk, in llm.c's shard layout or as .npy arrays, memory-mapped for reading.
//
// .bin shard (llm.c): a header of 256 little-endian int32, then the tokens.
//   header[0] = magic, header[1] = version, header[2] = token count, the rest 0.
//   magic 20240520, version 1: uint16 tokens (vocabularies up to 65,535 ids, e.g. GPT-2)
//   magic 20240801, version 7: uint32 tokens (larger vocabularies)
//   The file is exactly 1024 + count * (2 or 4) bytes.
// .npy (OLMo): a 1-D little-endian uint16 ('<u2') or uint32 ('<u4') array with a NumPy header, or a raw
//   headerless array as OLMo's np.memmap writes it (dtype then follows the vocab: uint32 above 65,536 ids).
#ifndef KILN_DATA_SHARDS_H
#define KILN_DATA_SHARDS_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;

#define KILN_SHARD_HEADER_INTS 256
#define KILN_SHARD_MAGIC_U16 20240520
#define KILN_SHARD_VERSION_U16 1
#define KILN_SHARD_MAGIC_U32 20240801
#define KILN_SHARD_VERSION_U32 7

// 2 (uint16 layout) when every id of a vocab_size vocabulary fits below 65,536 ids, else 4.
int kiln_shard_elem_bytes(int vocab_size);

// Writes tokens[0..n) as a .bin shard of elem_bytes (2 or 4) per token, atomically (temp file + rename, so an
// interrupted write never leaves a truncated file under path). sha256_hex (may be NULL) gets the file's hash.
// An id that does not fit elem_bytes is an error naming it and its offset.
int kiln_shard_write(const char *path, const int32_t *tokens, size_t n, int elem_bytes, char sha256_hex[65],
                     struct kiln_error *err);

// A memory-mapped token file.
struct kiln_token_file {
    char *path;
    int elem_bytes; // 2 or 4
    uint64_t n_tokens;
    const void *tokens; // (n_tokens) uint16 or uint32
    void *map;
    size_t map_bytes;
};

// A path that names a directory, where a token file was expected, is a usage error naming it (with a glob
// of the shards in it as the hint); 0 for anything else (a file, or nothing: opening it says what is wrong).
int kiln_token_path_check(const char *path, struct kiln_error *err);

// Opens and validates path (.npy by extension, else .bin): magic, version, size == header + count * elem.
// With vocab_size > 0 every token is checked to be < vocab_size, the first bad one reported with its offset.
int kiln_token_file_open(struct kiln_token_file *f, const char *path, int vocab_size, struct kiln_error *err);
void kiln_token_file_close(struct kiln_token_file *f);

static inline uint32_t kiln_token_at(const struct kiln_token_file *f, uint64_t i) {
    return f->elem_bytes == 2 ? ((const uint16_t *)f->tokens)[i] : ((const uint32_t *)f->tokens)[i];
}

// Index of the first token >= vocab_size in tokens[0..n) of elem_bytes each, or UINT64_MAX if none.
uint64_t kiln_tokens_first_bad(const void *tokens, int elem_bytes, uint64_t n, int vocab_size);

#endif
