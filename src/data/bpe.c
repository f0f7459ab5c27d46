// GPT-2 byte-level BPE (see bpe.h for the algorithm). Layout of the hot path:
//   pcre2 JIT match -> piece bytes -> word cache (open addressing, hash of the bytes) -> on a miss, merge
//   loop over a small stack array of ids with their pair ranks (no malloc per piece).
#include "data/bpe.h"

#include <string.h>

#include <cjson/cJSON.h>
#include <pcre2.h>

#include "io/fsutil.h"
#include "data/tokenizer.h"
#include "util/error.h"

// GPT-2's split pattern with \s spelled out as Unicode White_Space (PCRE2's \s under UCP also matches
// U+180E; the Python and Rust engines the reference ids come from do not).
#define WS                                                                                                   \
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";
#undef WS

#define NO_RANK UINT32_MAX
#define CACHE_MAX_PIECE 255    // longer pieces are not cached
#define SHORT_PIECE 192        // pieces up to this many bytes use the array merge loop, longer ones the heap
#define CACHE_SLOTS (1u << 17) // power of two; the cache is cleared when half full
#define CACHE_KEY_ARENA (4u << 20)
#define CACHE_ID_ARENA (1u << 20)

// ---------------------------------------------------------------------------------------------------------
// shared vocabulary (immutable after load; reference-counted across handles)

struct strmap;

struct merge_slot {
    uint64_t key;   // ((a+1) << 32) | (b+1); 0 = empty
    uint32_t rank;  // line number in vocab.bpe, 0-based
    int32_t merged; // id of the concatenation
};

struct bpe_vocab {
    int refs;
    int vocab_size, eot;
    int32_t byte_id[256];  // id of each single byte
    uint32_t *tok_off;     // (vocab_size + 1) offsets into tok_bytes
    char *tok_bytes;       // concatenated raw bytes of every token
    struct merge_slot *mt; // (mt_mask + 1)
    uint64_t mt_mask;
    pcre2_code *re;
    int jit;
    // tokenizer.json with "ignore_merges" (Llama 3's, as tiktoken): a piece that is a token of the vocabulary
    // is that token, merged or not; whole maps its bytes to the id (NULL: merge every piece)
    struct strmap *whole;
};

struct cache_slot {
    uint64_t h; // 0 = empty
    uint32_t key_off, ids_off;
    uint16_t key_len, n_ids;
};

struct kiln_bpe {
    struct bpe_vocab *v;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    struct cache_slot *slots; // (CACHE_SLOTS)
    uint32_t n_cached;
    char *key_arena;
    uint32_t key_used;
    int32_t *id_arena;
    uint32_t id_used;
    // scratch for long pieces (grown as needed)
    void *heap_buf;
    size_t heap_cap;
};

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1);
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static inline const struct merge_slot *merge_find(const struct bpe_vocab *v, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    uint64_t i = mix64(key) & v->mt_mask;
    for (;;) {
        const struct merge_slot *s = &v->mt[i];
        if (s->key == key)
            return s;
        if (s->key == 0)
            return NULL;
        i = (i + 1) & v->mt_mask;
    }
}

static inline uint32_t merge_rank(const struct bpe_vocab *v, int32_t a, int32_t b) {
    const struct merge_slot *s = merge_find(v, a, b);
    return s ? s->rank : NO_RANK;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100.. in
// byte order. unicode_byte[cp] is the inverse (-1 where cp stands for no byte).
static void gpt2_unicode_to_byte(int unicode_byte[512]) {
    for (int i = 0; i < 512; i++)
        unicode_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        if (printable)
            unicode_byte[b] = b;
        else
            unicode_byte[256 + n++] = b;
    }
}

// Decodes a token string of encoder.json / vocab.bpe (UTF-8 of the stand-in code points) into raw bytes.
// Returns the byte count, or -1 if a code point stands for no byte.
static int gpt2_token_bytes(const int unicode_byte[512], const char *s, size_t n, char *out, size_t cap) {
    size_t i = 0, k = 0;
    while (i < n) {
        unsigned c = (unsigned char)s[i];
        unsigned cp;
        if (c < 0x80) {
            cp = c;
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < n) {
            cp = ((c & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; // every stand-in code point is below U+0800
        }
        if (cp >= 512 || unicode_byte[cp] < 0 || k >= cap)
            return -1;
        out[k++] = (char)unicode_byte[cp];
    }
    return (int)k;
}

// A temporary bytes -> id map used while loading merges.
struct strmap {
    uint64_t mask;
    int32_t *slot; // id or -1
};

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0x100000001b3ULL);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, p + i, n - i);
        h = (h ^ w) * 0x94d049bb133111ebULL;
        h ^= h >> 29;
    }
    h = mix64(h);
    return h ? h : 1;
}

static const char *tok_ptr(const struct bpe_vocab *v, int32_t id, size_t *len) {
    *len = v->tok_off[id + 1] - v->tok_off[id];
    return v->tok_bytes + v->tok_off[id];
}

static int32_t strmap_get(const struct strmap *m, const struct bpe_vocab *v, const char *p, size_t n) {
    for (uint64_t i = hash_bytes(p, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slot[i];
        if (id < 0)
            return -1;
        size_t len;
        const char *t = tok_ptr(v, id, &len);
        if (len == n && memcmp(t, p, n) == 0)
            return id;
    }
}

static void strmap_put(struct strmap *m, const struct bpe_vocab *v, int32_t id) {
    size_t len;
    const char *t = tok_ptr(v, id, &len);
    uint64_t i = hash_bytes(t, len) & m->mask;
    while (m->slot[i] >= 0)
        i = (i + 1) & m->mask;
    m->slot[i] = id;
}

static void vocab_free(struct bpe_vocab *v) {
    if (!v)
        return;
    if (v->whole) {
        free(v->whole->slot);
        free(v->whole);
    }
    free(v->tok_off);
    free(v->tok_bytes);
    free(v->mt);
    if (v->re)
        pcre2_code_free(v->re);
    free(v);
}

static int vocab_pack(struct bpe_vocab *v, char **strs, const int *lens, int count, const char *path,
                      struct kiln_error *err);

// Reads encoder.json into v->tok_off / tok_bytes; ids must be exactly 0..N-1.
static int load_encoder(struct bpe_vocab *v, const char *path, const int unicode_byte[512],
                        struct kiln_error *err) {
    char *text;
    size_t n;
    if (kiln_read_file(path, &text, &n, err))
        return err ? err->code : KILN_ERR_RUNTIME;
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "bad GPT-2 vocabulary (%s): not a JSON object; use OpenAI's "
                           "encoder.json (data/gpt2/)",
                           path);
    }
    int count = cJSON_GetArraySize(root);
    if (count < 256 || count > (1 << 24)) {
        cJSON_Delete(root);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "bad GPT-2 vocabulary (%s): %d entries; expected 50257",
                           path, count);
    }
    v->vocab_size = count;
    char **strs = kiln_xcalloc((size_t)count, sizeof(char *));
    int *lens = kiln_xcalloc((size_t)count, sizeof(int));
    int rc = 0;
    char buf[1024];
    for (cJSON *it = root->child; it; it = it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= count ||
            (double)(int)it->valuedouble != it->valuedouble) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "bad GPT-2 vocabulary (%s): entry \"%.40s\" has id outside "
                             "[0, %d); use OpenAI's encoder.json",
                             path, it->string, count);
            break;
        }
        int id = (int)it->valuedouble;
        int len = gpt2_token_bytes(unicode_byte, it->string, strlen(it->string), buf, sizeof(buf));
        if (len < 0 || strs[id]) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "bad GPT-2 vocabulary (%s): entry \"%.40s\" (id %d) is %s; "
                             "use OpenAI's encoder.json",
                             path, it->string, id, len < 0 ? "not a byte-level token" : "a duplicate id");
            break;
        }
        strs[id] = kiln_xmalloc((size_t)len + 1);
        memcpy(strs[id], buf, (size_t)len);
        lens[id] = len;
        if (strcmp(it->string, "<|endoftext|>") == 0)
            v->eot = id;
    }
    cJSON_Delete(root);
    if (!rc)
        rc = vocab_pack(v, strs, lens, count, path, err);
    for (int i = 0; i < count; i++)
        free(strs[i]);
    free(strs);
    free(lens);
    return rc;
}

// The tokens' bytes (strs[i] of lens[i] bytes for id i, every id present) into v->tok_off / tok_bytes.
static int vocab_pack(struct bpe_vocab *v, char **strs, const int *lens, int count, const char *path,
                      struct kiln_error *err) {
    size_t total = 0;
    int rc = 0;
    for (int i = 0; i < count; i++)
        total += strs[i] ? (size_t)lens[i] : 0;
    {
        v->tok_off = kiln_xmalloc(sizeof(uint32_t) * ((size_t)count + 1));
        v->tok_bytes = kiln_xmalloc(total + 1);
        size_t off = 0;
        for (int i = 0; i < count; i++) {
            if (!strs[i]) { // cannot happen with count distinct ids in [0, count), kept as a guard
                rc = kiln_errorf(err, KILN_ERR_RUNTIME, "bad BPE vocabulary (%s): id %d missing", path, i);
                break;
            }
            v->tok_off[i] = (uint32_t)off;
            memcpy(v->tok_bytes + off, strs[i], (size_t)lens[i]);
            off += (size_t)lens[i];
        }
        v->tok_off[count] = (uint32_t)off;
    }
    return rc;
}

// The merge table's start: a bytes -> id map of the tokens that are not special (skip: NULL or a flag per
// id), every byte's token, and a table for n_merges merges. m is freed by the caller.
static int merges_begin(struct bpe_vocab *v, struct strmap *m, const unsigned char *skip, size_t n_merges,
                        const char *path, struct kiln_error *err) {
    m->mask = 1;
    while (m->mask + 1 < (uint64_t)v->vocab_size * 2)
        m->mask = m->mask * 2 + 1;
    m->slot = kiln_xmalloc(sizeof(int32_t) * (m->mask + 1));
    for (uint64_t i = 0; i <= m->mask; i++)
        m->slot[i] = -1;
    for (int id = 0; id < v->vocab_size; id++)
        if (skip ? !skip[id] : id != v->eot)
            strmap_put(m, v, id);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        v->byte_id[b] = strmap_get(m, v, &c, 1);
        if (v->byte_id[b] < 0)
            return kiln_errorf(
                err, KILN_ERR_RUNTIME,
                "bad byte-level vocabulary (%s): byte 0x%02x has no token; every byte needs one", path, b);
    }
    v->mt_mask = 1;
    while (v->mt_mask + 1 < (n_merges + 1) * 2)
        v->mt_mask = v->mt_mask * 2 + 1;
    v->mt = kiln_xcalloc(v->mt_mask + 1, sizeof(struct merge_slot));
    return 0;
}

// One merge "a b" (each in the byte-level stand-in code points) of the given rank; 0, or -1 when a, b or
// their concatenation is no token.
static int merge_add(struct bpe_vocab *v, const struct strmap *m, const int unicode_byte[512], const char *sa,
                     size_t na, const char *sb, size_t nb, uint32_t rank) {
    char a[512], b[512], ab[1024];
    int la = gpt2_token_bytes(unicode_byte, sa, na, a, sizeof(a));
    int lb = gpt2_token_bytes(unicode_byte, sb, nb, b, sizeof(b));
    int32_t ia = la > 0 ? strmap_get(m, v, a, (size_t)la) : -1;
    int32_t ib = lb > 0 ? strmap_get(m, v, b, (size_t)lb) : -1;
    int32_t iab = -1;
    if (ia >= 0 && ib >= 0) {
        memcpy(ab, a, (size_t)la);
        memcpy(ab + la, b, (size_t)lb);
        iab = strmap_get(m, v, ab, (size_t)(la + lb));
    }
    if (iab < 0)
        return -1;
    uint64_t key = pair_key(ia, ib);
    uint64_t i = mix64(key) & v->mt_mask;
    while (v->mt[i].key && v->mt[i].key != key)
        i = (i + 1) & v->mt_mask;
    if (!v->mt[i].key) { // a repeated pair (none in GPT-2's file) keeps its first rank
        v->mt[i].key = key;
        v->mt[i].rank = rank;
        v->mt[i].merged = iab;
    }
    return 0;
}

static int load_merges(struct bpe_vocab *v, const char *path, const int unicode_byte[512],
                       struct kiln_error *err) {
    char *text;
    size_t n;
    if (kiln_read_file(path, &text, &n, err))
        return err ? err->code : KILN_ERR_RUNTIME;
    size_t n_lines = 0;
    for (size_t i = 0; i < n; i++)
        n_lines += text[i] == '\n';
    struct strmap m = {0};
    int rc = merges_begin(v, &m, NULL, n_lines, path, err);
    uint32_t rank = 0;
    size_t line_no = 0;
    for (size_t pos = 0; pos < n && !rc;) {
        size_t end = pos;
        while (end < n && text[end] != '\n')
            end++;
        line_no++;
        const char *line = text + pos;
        size_t len = end - pos;
        pos = end + 1;
        if (len && line[len - 1] == '\r')
            len--;
        if (len == 0 || (line_no == 1 && len >= 8 && memcmp(line, "#version", 8) == 0))
            continue;
        const char *sp = memchr(line, ' ', len);
        if (!sp || merge_add(v, &m, unicode_byte, line, (size_t)(sp - line), sp + 1,
                             len - (size_t)(sp - line) - 1, rank)) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "bad GPT-2 merges (%s:%zu): \"%.*s\" is not a merge of two "
                             "tokens of encoder.json into a third; use OpenAI's vocab.bpe",
                             path, line_no, (int)(len > 60 ? 60 : len), line);
            break;
        }
        rank++;
    }
    free(text);
    free(m.slot);
    return rc;
}

// Compiles the split pattern into v (what: where it came from, for the message).
static int compile_pattern(struct bpe_vocab *v, const char *pattern, const char *what,
                           struct kiln_error *err) {
    int ec;
    PCRE2_SIZE eo;
    v->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!v->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "%s split pattern (offset %zu): PCRE2 says %s; PCRE2 10.34+ "
                           "with Unicode support is required",
                           what, (size_t)eo, (char *)msg);
    }
    v->jit = pcre2_jit_compile(v->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static struct kiln_bpe *handle_of(struct bpe_vocab *v) {
    struct kiln_bpe *b = kiln_bpe_clone(NULL);
    b->v = v;
    b->md = pcre2_match_data_create_from_pattern(v->re, NULL);
    return b;
}

int kiln_bpe_open(struct kiln_bpe **out, const char *dir, struct kiln_error *err) {
    *out = NULL;
    int unicode_byte[512];
    gpt2_unicode_to_byte(unicode_byte);
    struct bpe_vocab *v = kiln_xcalloc(1, sizeof(*v));
    v->refs = 1;
    v->eot = -1;
    size_t dl = strlen(dir);
    char *path = kiln_xmalloc(dl + 32);
    snprintf(path, dl + 32, "%s/encoder.json", dir);
    int rc = load_encoder(v, path, unicode_byte, err);
    if (!rc) {
        snprintf(path, dl + 32, "%s/vocab.bpe", dir);
        rc = load_merges(v, path, unicode_byte, err);
    }
    free(path);
    if (!rc)
        rc = compile_pattern(v, GPT2_PATTERN, "GPT-2", err);
    if (rc) {
        vocab_free(v);
        return rc;
    }
    *out = handle_of(v);
    return 0;
}

// ---------------------------------------------------------------------------------------------------------
// a Hugging Face tokenizer.json (the `tokenizers` library's format), byte-level BPE only

// The split pattern of a pre-tokenizer: a Split's regex, or a ByteLevel's own (GPT-2's) when it splits;
// *byte_level set when a ByteLevel is there. Refuses what kiln cannot run the same way, naming it.
static int json_pre(const cJSON *p, const char *path, const char **pattern, int *byte_level,
                    struct kiln_error *err) {
    if (cJSON_IsNull(p) || !p)
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) {
            int rc = json_pre(it, path, pattern, byte_level, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!strcmp(t, "ByteLevel")) {
        *byte_level = 1;
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
        if (cJSON_IsTrue(ps))
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "pre_tokenizer ByteLevel with add_prefix_space (%s): kiln encodes text as it is; "
                "a tokenizer that adds a space first is not supported",
                path);
        if (!cJSON_IsFalse(re)) { // (default true) GPT-2's pattern
            if (*pattern)
                return kiln_errorf(
                    err, KILN_ERR_USAGE,
                    "pre_tokenizer (%s): two split patterns (a Split and a ByteLevel that splits); "
                    "kiln runs one",
                    path);
            *pattern = GPT2_PATTERN;
        }
        return 0;
    }
    if (!strcmp(t, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        const cJSON *inv = cJSON_GetObjectItemCaseSensitive(p, "invert");
        if (!cJSON_IsString(re) || !cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") ||
            cJSON_IsTrue(inv) || *pattern)
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "pre_tokenizer Split (%s): kiln runs one Split by a Regex, behavior Isolated, not "
                "inverted (Llama 3's and GPT-4's form)",
                path);
        *pattern = re->valuestring;
        return 0;
    }
    return kiln_errorf(err, KILN_ERR_USAGE,
                       "pre_tokenizer %s (%s): kiln reads byte-level BPE tokenizers, pre-tokenized by a "
                       "Split regex and ByteLevel (Llama 3's, GPT-2's)",
                       t[0] ? t : "(no type)", path);
}

int kiln_bpe_open_json(struct kiln_bpe **out, const char *path, struct kiln_error *err) {
    *out = NULL;
    char *text;
    size_t n;
    int rc = kiln_read_file(path, &text, &n, err);
    if (rc)
        return rc;
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(model)) {
        cJSON_Delete(root);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "not a tokenizer.json (%s): expected the `tokenizers` library's JSON with a "
                           "\"model\"; give a Hugging Face model directory's tokenizer.json",
                           path);
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") || !cJSON_IsObject(vocab) ||
        !cJSON_IsArray(merges)) {
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "model type %.40s (%s): kiln reads BPE tokenizers (model.vocab and model.merges), "
                         "byte-level like Llama 3's and GPT-2's",
                         cJSON_IsString(type) ? type->valuestring : "(none)", path);
        cJSON_Delete(root);
        return rc;
    }
    if (norm && !cJSON_IsNull(norm)) {
        cJSON_Delete(root);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "normalizer (%s): kiln encodes text as it is; a tokenizer with a normalizer "
                           "is not supported",
                           path);
    }
    const char *pattern = NULL;
    int byte_level = 0;
    if ((rc = json_pre(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), path, &pattern, &byte_level,
                       err))) {
        cJSON_Delete(root);
        return rc;
    }
    if (!byte_level || !pattern) {
        cJSON_Delete(root);
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "pre_tokenizer (%s): %s; kiln reads byte-level BPE tokenizers (Llama 3's, GPT-2's)", path,
            !byte_level ? "no ByteLevel step" : "no split pattern");
    }
    // the vocabulary: model.vocab's byte-level tokens, and added_tokens' contents as they are
    int count = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (cJSON_IsNumber(it) && it->valuedouble + 1 > count)
            count = (int)it->valuedouble + 1;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (cJSON_IsNumber(id) && id->valuedouble + 1 > count)
            count = (int)id->valuedouble + 1;
    }
    if (count < 256 || count > (1 << 24)) {
        cJSON_Delete(root);
        return kiln_errorf(err, KILN_ERR_USAGE, "vocabulary of %d tokens (%s): expected 256 to 2^24", count,
                           path);
    }
    int unicode_byte[512];
    gpt2_unicode_to_byte(unicode_byte);
    struct bpe_vocab *v = kiln_xcalloc(1, sizeof(*v));
    v->refs = 1;
    v->eot = -1;
    v->vocab_size = count;
    char **strs = kiln_xcalloc((size_t)count, sizeof(char *));
    int *lens = kiln_xcalloc((size_t)count, sizeof(int));
    unsigned char *special = kiln_xcalloc((size_t)count, 1);
    char buf[1024];
    cJSON_ArrayForEach(it, vocab) {
        int id = cJSON_IsNumber(it) && it->valuedouble >= 0 && (double)(int)it->valuedouble == it->valuedouble
                     ? (int)it->valuedouble
                     : -1;
        int len =
            id >= 0 ? gpt2_token_bytes(unicode_byte, it->string, strlen(it->string), buf, sizeof(buf)) : -1;
        if (len < 0 || strs[id]) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "model.vocab entry \"%.40s\" (%s): %s; kiln reads byte-level BPE vocabularies",
                             it->string, path,
                             id < 0    ? "its id is not a whole number >= 0"
                             : len < 0 ? "not a byte-level token"
                                       : "a repeated id");
            break;
        }
        strs[id] = kiln_xmalloc((size_t)len + 1);
        memcpy(strs[id], buf, (size_t)len);
        lens[id] = len;
    }
    int eot_rank = 0; // <|end_of_text|> (Llama 3) before <|endoftext|> (GPT-2)
    cJSON_ArrayForEach(it, added) {
        if (rc)
            break;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || !cJSON_IsString(content)) {
            rc = kiln_errorf(err, KILN_ERR_USAGE, "added_tokens (%s): an entry without an id or content",
                             path);
            break;
        }
        int i = (int)id->valuedouble;
        special[i] = 1;
        if (!strs[i]) {
            lens[i] = (int)strlen(content->valuestring);
            strs[i] = kiln_xmalloc((size_t)lens[i] + 1);
            memcpy(strs[i], content->valuestring, (size_t)lens[i]);
        }
        int r = !strcmp(content->valuestring, "<|end_of_text|>")
                    ? 2
                    : !strcmp(content->valuestring, "<|endoftext|>");
        if (r > eot_rank) {
            eot_rank = r;
            v->eot = i;
        }
    }
    for (int i = 0; i < count && !rc; i++)
        if (!strs[i])
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "token id %d (%s): in neither model.vocab nor added_tokens; "
                             "the ids must run from 0 without a gap",
                             i, path);
    if (!rc)
        rc = vocab_pack(v, strs, lens, count, path, err);
    for (int i = 0; i < count; i++)
        free(strs[i]);
    free(strs);
    free(lens);
    // the merges, in rank order: "a b" strings or [a, b] pairs
    struct strmap *m = kiln_xcalloc(1, sizeof(*m));
    if (!rc)
        rc = merges_begin(v, m, special, (size_t)cJSON_GetArraySize(merges), path, err);
    uint32_t rank = 0;
    cJSON_ArrayForEach(it, merges) {
        if (rc)
            break;
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if (cJSON_IsString(it) && (b = strchr(it->valuestring, ' '))) {
            a = it->valuestring;
            na = (size_t)(b - a);
            b++;
            nb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            a = it->child->valuestring;
            b = it->child->next->valuestring;
            na = strlen(a);
            nb = strlen(b);
        }
        if (!a || merge_add(v, m, unicode_byte, a, na, b, nb, rank))
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "model.merges[%u] (%s): not a merge of two tokens of model.vocab into a third",
                             rank, path);
        rank++;
    }
    free(special);
    if (!rc && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges")))
        v->whole = m;
    else {
        free(m->slot);
        free(m);
    }
    if (!rc)
        rc = compile_pattern(v, pattern, "tokenizer.json", err);
    cJSON_Delete(root);
    if (rc) {
        vocab_free(v);
        return rc;
    }
    *out = handle_of(v);
    return 0;
}

// With b == NULL, returns a handle without vocabulary (kiln_bpe_open fills it in).
struct kiln_bpe *kiln_bpe_clone(const struct kiln_bpe *b) {
    struct kiln_bpe *c = kiln_xcalloc(1, sizeof(*c));
    c->slots = kiln_xcalloc(CACHE_SLOTS, sizeof(struct cache_slot));
    c->key_arena = kiln_xmalloc(CACHE_KEY_ARENA);
    c->id_arena = kiln_xmalloc(sizeof(int32_t) * CACHE_ID_ARENA);
    c->mctx = pcre2_match_context_create(NULL);
    c->jstack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
    if (c->jstack)
        pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
    if (b) {
        c->v = b->v;
        c->v->refs++;
        c->md = pcre2_match_data_create_from_pattern(c->v->re, NULL);
    }
    return c;
}

void kiln_bpe_free(struct kiln_bpe *b) {
    if (!b)
        return;
    if (b->v && --b->v->refs == 0)
        vocab_free(b->v);
    if (b->md)
        pcre2_match_data_free(b->md);
    if (b->mctx)
        pcre2_match_context_free(b->mctx);
    if (b->jstack)
        pcre2_jit_stack_free(b->jstack);
    free(b->slots);
    free(b->key_arena);
    free(b->id_arena);
    free(b->heap_buf);
    free(b);
}

int kiln_bpe_vocab_size(const struct kiln_bpe *b) {
    return b->v->vocab_size;
}

int kiln_bpe_eot(const struct kiln_bpe *b) {
    return b->v->eot;
}

// ---------------------------------------------------------------------------------------------------------
// merging one piece

// Short pieces: ids[i] with rank[i] = rank of the pair (ids[i], ids[i+1]); merge the lowest (leftmost on
// ties), then refresh the two neighbouring ranks. Returns the number of ids left in ids.
static int merge_short(const struct bpe_vocab *v, const unsigned char *p, int n, int32_t *ids) {
    uint32_t rank[SHORT_PIECE];
    for (int i = 0; i < n; i++)
        ids[i] = v->byte_id[p[i]];
    for (int i = 0; i + 1 < n; i++)
        rank[i] = merge_rank(v, ids[i], ids[i + 1]);
    while (n > 1) {
        uint32_t best = NO_RANK;
        int bi = -1;
        for (int i = 0; i + 1 < n; i++)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (bi < 0)
            break;
        ids[bi] = merge_find(v, ids[bi], ids[bi + 1])->merged;
        for (int i = bi + 1; i + 1 < n; i++) {
            ids[i] = ids[i + 1];
            rank[i] = rank[i + 1];
        }
        n--;
        if (bi > 0)
            rank[bi - 1] = merge_rank(v, ids[bi - 1], ids[bi]);
        if (bi + 1 < n)
            rank[bi] = merge_rank(v, ids[bi], ids[bi + 1]);
    }
    return n;
}

// Long pieces (e.g. a megabyte of digits): the same order of merges via a min-heap of (rank, position) over a
// linked list, O(n log n) instead of O(n^2).
struct heap_item {
    uint32_t rank, pos;
};
struct lnode {
    int32_t id, prev, next; // prev/next = -1 at the ends
    int32_t alive;
};

static inline int heap_less(struct heap_item a, struct heap_item b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_item *h, size_t *n, struct heap_item x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(x, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static struct heap_item heap_pop(struct heap_item *h, size_t *n) {
    struct heap_item top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c]))
            c++;
        if (!heap_less(h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = x;
    return top;
}

static void merge_long(struct kiln_bpe *b, const unsigned char *p, size_t n, struct kiln_ids *out) {
    const struct bpe_vocab *v = b->v;
    size_t need = n * (sizeof(struct lnode) + 2 * sizeof(struct heap_item));
    if (need > b->heap_cap) {
        free(b->heap_buf);
        b->heap_buf = kiln_xmalloc(need);
        b->heap_cap = need;
    }
    struct lnode *nd = b->heap_buf;
    struct heap_item *h = (struct heap_item *)(nd + n);
    size_t hn = 0;
    for (size_t i = 0; i < n; i++)
        nd[i] = (struct lnode){v->byte_id[p[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = merge_rank(v, nd[i].id, nd[i + 1].id);
        if (r != NO_RANK)
            heap_push(h, &hn, (struct heap_item){r, (uint32_t)i});
    }
    while (hn) {
        struct heap_item it = heap_pop(h, &hn);
        struct lnode *a = &nd[it.pos];
        if (!a->alive || a->next < 0)
            continue;
        struct lnode *c = &nd[a->next];
        const struct merge_slot *s = merge_find(v, a->id, c->id);
        if (!s || s->rank != it.rank)
            continue; // stale entry
        a->id = s->merged;
        c->alive = 0;
        a->next = c->next;
        if (c->next >= 0)
            nd[c->next].prev = (int32_t)it.pos;
        // at most two new pairs per merge, so the heap never exceeds 2n entries
        if (a->prev >= 0) {
            uint32_t r = merge_rank(v, nd[a->prev].id, a->id);
            if (r != NO_RANK)
                heap_push(h, &hn, (struct heap_item){r, (uint32_t)a->prev});
        }
        if (a->next >= 0) {
            uint32_t r = merge_rank(v, a->id, nd[a->next].id);
            if (r != NO_RANK)
                heap_push(h, &hn, (struct heap_item){r, it.pos});
        }
    }
    for (int32_t i = 0; i >= 0; i = nd[i].next)
        kiln_ids_push(out, nd[i].id);
}

static void cache_clear(struct kiln_bpe *b) {
    memset(b->slots, 0, CACHE_SLOTS * sizeof(struct cache_slot));
    b->n_cached = 0;
    b->key_used = 0;
    b->id_used = 0;
}

static void encode_piece(struct kiln_bpe *b, const unsigned char *p, size_t n, struct kiln_ids *out) {
    const struct bpe_vocab *v = b->v;
    if (n == 1) {
        kiln_ids_push(out, v->byte_id[p[0]]);
        return;
    }
    if (v->whole) { // ignore_merges: a piece that is a token is that token
        int32_t id = strmap_get(v->whole, v, (const char *)p, n);
        if (id >= 0) {
            kiln_ids_push(out, id);
            return;
        }
    }
    if (n > SHORT_PIECE) {
        merge_long(b, p, n, out);
        return;
    }
    uint64_t h = hash_bytes((const char *)p, n);
    uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
    for (;;) {
        struct cache_slot *s = &b->slots[i];
        if (s->h == 0)
            break;
        if (s->h == h && s->key_len == n && memcmp(b->key_arena + s->key_off, p, n) == 0) {
            kiln_ids_reserve(out, s->n_ids);
            memcpy(out->data + out->n, b->id_arena + s->ids_off, sizeof(int32_t) * s->n_ids);
            out->n += s->n_ids;
            return;
        }
        i = (i + 1) & (CACHE_SLOTS - 1);
    }
    int32_t ids[SHORT_PIECE];
    int k = merge_short(v, p, (int)n, ids);
    kiln_ids_reserve(out, (size_t)k);
    memcpy(out->data + out->n, ids, sizeof(int32_t) * (size_t)k);
    out->n += (size_t)k;
    if (n > CACHE_MAX_PIECE)
        return;
    if (b->n_cached * 2 >= CACHE_SLOTS || b->key_used + n > CACHE_KEY_ARENA ||
        b->id_used + k > CACHE_ID_ARENA) {
        cache_clear(b);
        i = (uint32_t)h & (CACHE_SLOTS - 1);
        while (b->slots[i].h)
            i = (i + 1) & (CACHE_SLOTS - 1);
    }
    struct cache_slot *s = &b->slots[i];
    s->h = h;
    s->key_off = b->key_used;
    s->key_len = (uint16_t)n;
    s->ids_off = b->id_used;
    s->n_ids = (uint16_t)k;
    memcpy(b->key_arena + b->key_used, p, n);
    memcpy(b->id_arena + b->id_used, ids, sizeof(int32_t) * (size_t)k);
    b->key_used += (uint32_t)n;
    b->id_used += (uint32_t)k;
    b->n_cached++;
}

int kiln_bpe_encode(struct kiln_bpe *b, const char *text, size_t n, struct kiln_ids *ids,
                    struct kiln_error *err) {
    const struct bpe_vocab *v = b->v;
    const unsigned char *s = (const unsigned char *)text;
    kiln_ids_reserve(ids, n / 4 + 16);
    size_t pos = 0;
    while (pos < n) {
        int rc = v->jit ? pcre2_jit_match(v->re, s, n, pos, 0, b->md, b->mctx)
                        : pcre2_match(v->re, s, n, pos, 0, b->md, b->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) { // only bytes that are not UTF-8 are left
            encode_piece(b, s + pos, n - pos, ids);
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "GPT-2 pre-tokenizer (byte offset %zu): PCRE2 match failed: "
                               "%s",
                               pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        size_t ms = ov[0], me = ov[1];
        KILN_ASSERT(me >= ms && ms >= pos);
        if (me == ms) { // a pattern from a tokenizer.json that matches nothing here: one character alone
            me = ms + 1;
            while (me < n && (s[me] & 0xC0) == 0x80)
                me++;
        }
        if (ms > pos) // a run of invalid UTF-8 between matches
            encode_piece(b, s + pos, ms - pos, ids);
        encode_piece(b, s + ms, me - ms, ids);
        pos = me;
    }
    return 0;
}

int kiln_bpe_decode(const struct kiln_bpe *b, const int32_t *ids, size_t n, struct kiln_bytes *out,
                    struct kiln_error *err) {
    const struct bpe_vocab *v = b->v;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->vocab_size)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "token id %d (index %zu) out of range: the GPT-2 vocabulary "
                               "has ids 0..%d",
                               (int)ids[i], i, v->vocab_size - 1);
        size_t len;
        const char *t = tok_ptr(v, ids[i], &len);
        kiln_bytes_append(out, t, len);
    }
    return 0;
}
