// Tokenizers behind one interface, chosen by name: "gpt2" (OpenAI's byte-level BPE, bpe.h) or "char"
// (one id per distinct byte of a text, chartok.h). Encoding appends to a growable id array; decoding appends
// bytes. decode(encode(x)) == x for any byte string the tokenizer accepts (gpt2: every byte string).
#ifndef KILN_DATA_TOKENIZER_H
#define KILN_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;
struct kiln_tokenizer; // opaque

// A growable array of token ids. Zero-initialise; free with kiln_ids_free.
struct kiln_ids {
    int32_t *data; // (n)
    size_t n, cap;
};
// A growable byte buffer (kept NUL-terminated past n for convenience). Zero-initialise; free with
// kiln_bytes_free.
struct kiln_bytes {
    char *data; // (n + 1)
    size_t n, cap;
};

void kiln_ids_reserve(struct kiln_ids *a, size_t extra);
void kiln_ids_push(struct kiln_ids *a, int32_t id);
void kiln_ids_free(struct kiln_ids *a);
void kiln_bytes_reserve(struct kiln_bytes *b, size_t extra);
void kiln_bytes_append(struct kiln_bytes *b, const void *p, size_t n);
void kiln_bytes_free(struct kiln_bytes *b);

// name a path ending in .json: a Hugging Face tokenizer.json holding a byte-level BPE (Llama 3's; bpe.h).
// name "gpt2": data_dir_or_vocab is a directory holding encoder.json and vocab.bpe (NULL: data/gpt2, then
// data/gpt2 in the source tree this kiln was built from). name "char": data_dir_or_vocab is a file; if it is
// a kiln tokenize manifest (*.json) its saved char vocab is used, otherwise the sorted distinct bytes of the
// file's contents.
int kiln_tokenizer_open(struct kiln_tokenizer **out, const char *name, const char *data_dir_or_vocab,
                        struct kiln_error *err);
// The same, with gpt2's fallback directory under source_dir (source_dir/data/gpt2; NULL or "": the build's
// source tree). cmd/ and run/ pass the KILN_SOURCE_DIR knob (run/knobs.h): data/ reads no environment.
int kiln_tokenizer_open_at(struct kiln_tokenizer **out, const char *name, const char *data_dir_or_vocab,
                           const char *source_dir, struct kiln_error *err);
// The directory gpt2's files (encoder.json, vocab.bpe) are read from: given, else data/gpt2 when it exists,
// else source_dir/data/gpt2 (NULL or "": the build's source tree), written into buf.
const char *kiln_gpt2_dir(const char *given, const char *source_dir, char *buf, size_t cap);
// char tokenizer whose vocab is the sorted distinct bytes of text.
struct kiln_tokenizer *kiln_chartok_from_text(const char *text, size_t n);
// char tokenizer with id i = chars[i] (the inverse of kiln_tokenizer_vocab_string). NULL if chars repeats a
// byte or n == 0.
struct kiln_tokenizer *kiln_chartok_from_vocab(const char *chars, size_t n);
// A second handle sharing the (immutable) vocabulary with its own word cache, for another thread. Free it
// with kiln_tokenizer_free; the shared data goes away with the last handle. Clone and free from one thread.
struct kiln_tokenizer *kiln_tokenizer_clone(const struct kiln_tokenizer *t);

const char *kiln_tokenizer_name(const struct kiln_tokenizer *t); // "gpt2", "char" or "tokenizer.json"
// Whether a tokenizer name is a file, a Hugging Face tokenizer.json (a path ending in .json), rather than
// "gpt2" or "char".
int kiln_tokenizer_is_file(const char *name);
int kiln_tokenizer_vocab_size(const struct kiln_tokenizer *t);   // 50257 for gpt2, n chars for char
int kiln_tokenizer_eot(const struct kiln_tokenizer *t);          // <|endoftext|> id (50256), or -1

// Appends the ids of text[0..n) to ids. gpt2 never produces <|endoftext|> here (OpenAI's encode_ordinary);
// char: a byte not in the vocab is an error naming the byte and its offset. Not thread-safe per handle (the
// word cache): use one clone per thread.
int kiln_tokenizer_encode(struct kiln_tokenizer *t, const char *text, size_t n, struct kiln_ids *ids,
                          struct kiln_error *err);
// Like encode, but the literal text "<|endoftext|>" becomes the eot id (gpt2 only; char: same as encode).
int kiln_tokenizer_encode_special(struct kiln_tokenizer *t, const char *text, size_t n, struct kiln_ids *ids,
                                  struct kiln_error *err);
// Appends the bytes of ids to out. An id outside [0, vocab size) is an error naming it and its index.
int kiln_tokenizer_decode(const struct kiln_tokenizer *t, const int32_t *ids, size_t n,
                          struct kiln_bytes *out, struct kiln_error *err);
void kiln_tokenizer_free(struct kiln_tokenizer *t);

// (char only) the vocab as a string of its chars in id order, for saving with a run. Returns 0, or
// KILN_ERR_USAGE (and leaves *chars NULL) for other tokenizers.
int kiln_tokenizer_vocab_string(const struct kiln_tokenizer *t, const char **chars, size_t *n);

#endif
