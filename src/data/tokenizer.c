// The tokenizer interface: a tagged union over the GPT-2 BPE and the char tokenizer, plus the growable
// arrays.
#include "data/tokenizer.h"

#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "data/bpe.h"
#include "data/chartok.h"
#include "io/fsutil.h"
#include "util/error.h"

enum { TOK_GPT2, TOK_CHAR };

struct kiln_tokenizer {
    int kind;
    int file;                // TOK_GPT2 read from a tokenizer.json
    struct kiln_bpe *bpe;    // TOK_GPT2
    struct kiln_chartok chr; // TOK_CHAR
};

// ---------------------------------------------------------------------------------------------------------
// growable arrays

void kiln_ids_reserve(struct kiln_ids *a, size_t extra) {
    if (a->n + extra <= a->cap)
        return;
    size_t cap = a->cap ? a->cap : 256;
    while (cap < a->n + extra)
        cap *= 2;
    int32_t *p = realloc(a->data, cap * sizeof(int32_t));
    if (!p)
        p = kiln_xmalloc(cap * sizeof(int32_t)); // aborts with a message
    a->data = p;
    a->cap = cap;
}

void kiln_ids_push(struct kiln_ids *a, int32_t id) {
    if (a->n == a->cap)
        kiln_ids_reserve(a, 1);
    a->data[a->n++] = id;
}

void kiln_ids_free(struct kiln_ids *a) {
    free(a->data);
    a->data = NULL;
    a->n = a->cap = 0;
}

void kiln_bytes_reserve(struct kiln_bytes *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        p = kiln_xmalloc(cap);
    b->data = p;
    b->cap = cap;
}

void kiln_bytes_append(struct kiln_bytes *b, const void *p, size_t n) {
    kiln_bytes_reserve(b, n);
    memcpy(b->data + b->n, p, n);
    b->n += n;
    b->data[b->n] = 0;
}

void kiln_bytes_free(struct kiln_bytes *b) {
    free(b->data);
    b->data = NULL;
    b->n = b->cap = 0;
}

// ---------------------------------------------------------------------------------------------------------

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

// A char vocab saved in a kiln tokenize manifest: "tokenizer": {"name": "char", "char_vocab": [bytes...]}.
static int char_vocab_from_manifest(struct kiln_chartok *c, const char *path, const char *text, size_t n,
                                    struct kiln_error *err) {
    cJSON *root = cJSON_ParseWithLength(text, n);
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(tok, "char_vocab");
    int rc = 0;
    if (!cJSON_IsArray(arr)) {
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "no char vocab (%s): expected a kiln tokenize manifest with "
                         "tokenizer.char_vocab; pass the training text instead",
                         path);
    } else {
        char chars[256];
        int k = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            if (k == 256 || !cJSON_IsNumber(it) || it->valueint < 0 || it->valueint > 255) {
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "bad char vocab (%s): tokenizer.char_vocab must hold at most "
                                 "256 byte values 0..255; re-run kiln tokenize",
                                 path);
                break;
            }
            chars[k++] = (char)it->valueint;
        }
        if (!rc)
            rc = kiln_chartok_init_vocab(c, chars, (size_t)k, err);
    }
    cJSON_Delete(root);
    return rc;
}

const char *kiln_gpt2_dir(const char *given, const char *source_dir, char *buf, size_t cap) {
    if (given)
        return given;
    if (is_dir("data/gpt2"))
        return "data/gpt2";
    snprintf(buf, cap, "%s/data/gpt2", source_dir && *source_dir ? source_dir : KILN_SOURCE_DIR);
    return buf;
}

int kiln_tokenizer_open(struct kiln_tokenizer **out, const char *name, const char *data_dir_or_vocab,
                        struct kiln_error *err) {
    return kiln_tokenizer_open_at(out, name, data_dir_or_vocab, NULL, err);
}

int kiln_tokenizer_open_at(struct kiln_tokenizer **out, const char *name, const char *data_dir_or_vocab,
                           const char *source_dir, struct kiln_error *err) {
    *out = NULL;
    if (name && kiln_tokenizer_is_file(name)) { // a Hugging Face tokenizer.json (Llama 3's)
        struct kiln_bpe *b;
        int rc = kiln_bpe_open_json(&b, name, err);
        if (rc)
            return rc;
        struct kiln_tokenizer *t = kiln_xcalloc(1, sizeof(*t));
        t->kind = TOK_GPT2;
        t->bpe = b;
        t->file = 1;
        *out = t;
        return 0;
    }
    if (!name || (strcmp(name, "gpt2") != 0 && strcmp(name, "char") != 0))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "unknown tokenizer (\"%s\"): allowed values are gpt2, char, or a Hugging Face "
                           "tokenizer.json",
                           name ? name : "(null)");
    if (strcmp(name, "gpt2") == 0) {
        char fallback[4096];
        const char *dir = kiln_gpt2_dir(data_dir_or_vocab, source_dir, fallback, sizeof(fallback));
        struct kiln_bpe *b;
        int rc = kiln_bpe_open(&b, dir, err);
        if (rc)
            return rc;
        struct kiln_tokenizer *t = kiln_xcalloc(1, sizeof(*t));
        t->kind = TOK_GPT2;
        t->bpe = b;
        *out = t;
        return 0;
    }
    if (!data_dir_or_vocab)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "char tokenizer needs a vocab (no file given): pass the training "
                           "text or a kiln tokenize manifest.json");
    char *text;
    size_t n;
    int rc = kiln_read_file(data_dir_or_vocab, &text, &n, err);
    if (rc)
        return rc;
    struct kiln_tokenizer *t = kiln_xcalloc(1, sizeof(*t));
    t->kind = TOK_CHAR;
    size_t pl = strlen(data_dir_or_vocab);
    if (pl >= 5 && strcmp(data_dir_or_vocab + pl - 5, ".json") == 0)
        rc = char_vocab_from_manifest(&t->chr, data_dir_or_vocab, text, n, err);
    else if (n == 0)
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "empty char vocab (%s): the file is empty; pass the training text",
                         data_dir_or_vocab);
    else
        kiln_chartok_init_text(&t->chr, text, n);
    free(text);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

struct kiln_tokenizer *kiln_chartok_from_text(const char *text, size_t n) {
    struct kiln_tokenizer *t = kiln_xcalloc(1, sizeof(*t));
    t->kind = TOK_CHAR;
    kiln_chartok_init_text(&t->chr, text, n);
    return t;
}

struct kiln_tokenizer *kiln_chartok_from_vocab(const char *chars, size_t n) {
    struct kiln_tokenizer *t = kiln_xcalloc(1, sizeof(*t));
    t->kind = TOK_CHAR;
    if (kiln_chartok_init_vocab(&t->chr, chars, n, NULL)) {
        free(t);
        return NULL;
    }
    return t;
}

struct kiln_tokenizer *kiln_tokenizer_clone(const struct kiln_tokenizer *t) {
    struct kiln_tokenizer *c = kiln_xcalloc(1, sizeof(*c));
    *c = *t;
    if (t->kind == TOK_GPT2)
        c->bpe = kiln_bpe_clone(t->bpe);
    return c;
}

const char *kiln_tokenizer_name(const struct kiln_tokenizer *t) {
    return t->kind == TOK_GPT2 ? (t->file ? "tokenizer.json" : "gpt2") : "char";
}

int kiln_tokenizer_is_file(const char *name) {
    size_t n = strlen(name);
    return n >= 5 && !strcmp(name + n - 5, ".json");
}

int kiln_tokenizer_vocab_size(const struct kiln_tokenizer *t) {
    return t->kind == TOK_GPT2 ? kiln_bpe_vocab_size(t->bpe) : t->chr.vocab_size;
}

int kiln_tokenizer_eot(const struct kiln_tokenizer *t) {
    return t->kind == TOK_GPT2 ? kiln_bpe_eot(t->bpe) : -1;
}

int kiln_tokenizer_encode(struct kiln_tokenizer *t, const char *text, size_t n, struct kiln_ids *ids,
                          struct kiln_error *err) {
    if (t->kind == TOK_GPT2)
        return kiln_bpe_encode(t->bpe, text, n, ids, err);
    return kiln_chartok_encode(&t->chr, text, n, ids, err);
}

int kiln_tokenizer_encode_special(struct kiln_tokenizer *t, const char *text, size_t n, struct kiln_ids *ids,
                                  struct kiln_error *err) {
    static const char EOT[] = "<|endoftext|>";
    const size_t k = sizeof(EOT) - 1;
    int eot = kiln_tokenizer_eot(t);
    if (eot < 0)
        return kiln_tokenizer_encode(t, text, n, ids, err);
    size_t pos = 0;
    for (;;) {
        const char *hit = memmem(text + pos, n - pos, EOT, k);
        size_t end = hit ? (size_t)(hit - text) : n;
        int rc = kiln_tokenizer_encode(t, text + pos, end - pos, ids, err);
        if (rc || !hit)
            return rc;
        kiln_ids_push(ids, eot);
        pos = end + k;
    }
}

int kiln_tokenizer_decode(const struct kiln_tokenizer *t, const int32_t *ids, size_t n,
                          struct kiln_bytes *out, struct kiln_error *err) {
    if (t->kind == TOK_GPT2)
        return kiln_bpe_decode(t->bpe, ids, n, out, err);
    return kiln_chartok_decode(&t->chr, ids, n, out, err);
}

void kiln_tokenizer_free(struct kiln_tokenizer *t) {
    if (!t)
        return;
    kiln_bpe_free(t->bpe);
    free(t);
}

int kiln_tokenizer_vocab_string(const struct kiln_tokenizer *t, const char **chars, size_t *n) {
    *chars = NULL;
    *n = 0;
    if (t->kind != TOK_CHAR)
        return KILN_ERR_USAGE;
    *chars = t->chr.chars;
    *n = (size_t)t->chr.vocab_size;
    return 0;
}
