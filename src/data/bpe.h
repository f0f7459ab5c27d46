// GPT-2 byte-level BPE, identical to OpenAI's encoder (and tiktoken's "gpt2" encode_ordinary).
//
// Encoding: the text is split into pieces by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// through PCRE2 (JIT, Unicode properties; \s is Unicode White_Space as in the reference regex engines); each
// piece's bytes start as byte tokens and are merged pair by pair, lowest merge rank first, leftmost first.
// Bytes that are not valid UTF-8 match no part of the pattern; each maximal run of them is a piece of its
// own, so every byte string encodes and decodes back exactly.
#ifndef KILN_DATA_BPE_H
#define KILN_DATA_BPE_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;
struct kiln_ids;
struct kiln_bytes;
struct kiln_bpe; // one handle: shared vocabulary + this handle's word cache and match scratch

// Reads <dir>/encoder.json and <dir>/vocab.bpe. Errors name the file and the offending entry.
int kiln_bpe_open(struct kiln_bpe **out, const char *dir, struct kiln_error *err);
// Reads a Hugging Face tokenizer.json (the `tokenizers` library's format) holding a byte-level BPE:
// model.vocab and model.merges (strings "a b" or pairs), added_tokens (decoded as their content, never
// produced by encoding), and the pre-tokenizer's split pattern: a Split by Regex (Llama 3's) or ByteLevel's
// own (GPT-2's). With model.ignore_merges (Llama 3), a piece that is a token of the vocabulary is that token.
// The end-of-text id is <|end_of_text|>'s, else <|endoftext|>'s. Anything else (a normalizer, a non-BPE
// model, another pre-tokenizer) is a usage error naming it.
int kiln_bpe_open_json(struct kiln_bpe **out, const char *path, struct kiln_error *err);
// A new handle on the same vocabulary with an empty cache (for another thread).
struct kiln_bpe *kiln_bpe_clone(const struct kiln_bpe *b);
void kiln_bpe_free(struct kiln_bpe *b);

int kiln_bpe_vocab_size(const struct kiln_bpe *b); // 50257 for GPT-2
int kiln_bpe_eot(const struct kiln_bpe *b);        // id of <|endoftext|> (50256), or -1 if the vocab has none

// Appends the ids of text[0..n) (never the eot id).
int kiln_bpe_encode(struct kiln_bpe *b, const char *text, size_t n, struct kiln_ids *ids,
                    struct kiln_error *err);
// Appends the bytes of ids; an id outside [0, vocab size) is an error naming the id and its index.
int kiln_bpe_decode(const struct kiln_bpe *b, const int32_t *ids, size_t n, struct kiln_bytes *out,
                    struct kiln_error *err);

#endif
