#include "data/chartok.h"

#include <ctype.h>
#include <string.h>

#include "data/tokenizer.h"
#include "util/error.h"

void kiln_chartok_init_text(struct kiln_chartok *t, const char *text, size_t n) {
    unsigned char seen[256] = {0};
    for (size_t i = 0; i < n; i++)
        seen[(unsigned char)text[i]] = 1;
    t->vocab_size = 0;
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = -1;
        if (seen[b]) {
            t->byte_id[b] = (int16_t)t->vocab_size;
            t->chars[t->vocab_size++] = (char)b;
        }
    }
}

int kiln_chartok_init_vocab(struct kiln_chartok *t, const char *chars, size_t n, struct kiln_error *err) {
    if (n == 0 || n > 256)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "bad char vocab (%zu chars): need 1..256 distinct bytes; save it "
                           "with kiln_tokenizer_vocab_string",
                           n);
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)chars[i];
        if (t->byte_id[c] >= 0)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "bad char vocab (position %zu): byte 0x%02x appears twice; "
                               "each id needs its own byte",
                               i, c);
        t->byte_id[c] = (int16_t)i;
        t->chars[i] = (char)c;
    }
    t->vocab_size = (int)n;
    return 0;
}

int kiln_chartok_encode(const struct kiln_chartok *t, const char *text, size_t n, struct kiln_ids *ids,
                        struct kiln_error *err) {
    kiln_ids_reserve(ids, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        int id = t->byte_id[c];
        if (id < 0) {
            char shown[8];
            if (isprint(c))
                snprintf(shown, sizeof(shown), "'%c' ", c);
            else
                shown[0] = 0;
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "character not in the char vocab (byte %s0x%02x at offset "
                               "%zu): the vocab has %d chars from the training text; use that text's "
                               "characters or --tokenizer=gpt2",
                               shown, c, i, t->vocab_size);
        }
        ids->data[ids->n++] = id;
    }
    return 0;
}

int kiln_chartok_decode(const struct kiln_chartok *t, const int32_t *ids, size_t n, struct kiln_bytes *out,
                        struct kiln_error *err) {
    kiln_bytes_reserve(out, n);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "token id %d (index %zu) out of range: the char vocab has ids "
                               "0..%d",
                               (int)ids[i], i, t->vocab_size - 1);
        out->data[out->n++] = t->chars[ids[i]];
    }
    out->data[out->n] = 0;
    return 0;
}
