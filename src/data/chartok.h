// The character-level tokenizer: one id per distinct byte of a training text, ids in byte order (so the vocab
// of "hello" is "ehlo"). No end-of-text token.
#ifndef KILN_DATA_CHARTOK_H
#define KILN_DATA_CHARTOK_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;
struct kiln_ids;
struct kiln_bytes;

struct kiln_chartok {
    int vocab_size;
    char chars[256];      // (vocab_size) id -> byte
    int16_t byte_id[256]; // byte -> id, or -1
};

// Fills t from the sorted distinct bytes of text (n may be 0: an empty vocab).
void kiln_chartok_init_text(struct kiln_chartok *t, const char *text, size_t n);
// Fills t with id i = chars[i]. Fails if a byte repeats or n is 0 or over 256.
int kiln_chartok_init_vocab(struct kiln_chartok *t, const char *chars, size_t n, struct kiln_error *err);
// A byte outside the vocab is an error naming the byte and its offset.
int kiln_chartok_encode(const struct kiln_chartok *t, const char *text, size_t n, struct kiln_ids *ids,
                        struct kiln_error *err);
int kiln_chartok_decode(const struct kiln_chartok *t, const int32_t *ids, size_t n, struct kiln_bytes *out,
                        struct kiln_error *err);

#endif
