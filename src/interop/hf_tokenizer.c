// The tokenizer files of a Hugging Face directory, so that AutoTokenizer.from_pretrained(DIR) loads what the
// model was trained with. See hf.h.
//
// gpt2: the slow tokenizer's files are kiln's own, under the names transformers reads (encoder.json ->
// vocab.json, vocab.bpe -> merges.txt, byte for byte), and tokenizer.json is the `tokenizers` library's
// serialization of the same byte-level BPE: its vocab and merges, GPT-2's pre-tokenizer (ByteLevel with its
// regex, no prefix space) and decoder, and <|endoftext|> as the one special token.
// A tokenizer.json the run was trained with (--tokenizer=PATH, Llama 3's): copied as it is.
// char: one token per character, as a BPE model without merges over no pre-tokenizer (every character of the
// input is a token of the vocabulary), decoded by concatenation (the Fuse decoder). A char vocabulary holding
// a byte that is not a whole UTF-8 character (a byte >= 0x80) has no such form: no tokenizer files, and the
// caller is told why.
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop/hf.h"
#include "io/fsutil.h"

static int write_text(const char *dir, const char *name, const char *data, size_t n, struct kiln_error *err) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return kiln_write_file_atomic(path, data, n, err);
}

static int write_json_file(const char *dir, const char *name, cJSON *j, struct kiln_error *err) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    KILN_ASSERT(text);
    size_t n = strlen(text);
    text[n] = '\n'; // (cJSON_Print's terminator becomes the final newline)
    int rc = write_text(dir, name, text, n + 1, err);
    free(text);
    return rc;
}

static cJSON *byte_level(int add_prefix_space, int trim_offsets) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", "ByteLevel");
    cJSON_AddBoolToObject(j, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(j, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(j, "use_regex", 1);
    return j;
}

static cJSON *added_token(int id, const char *content) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "content", content);
    cJSON_AddBoolToObject(t, "single_word", 0);
    cJSON_AddBoolToObject(t, "lstrip", 0);
    cJSON_AddBoolToObject(t, "rstrip", 0);
    cJSON_AddBoolToObject(t, "normalized", 1);
    cJSON_AddBoolToObject(t, "special", 1);
    return t;
}

// The top of a tokenizer.json: its fields in the `tokenizers` library's order, the model last.
static cJSON *tokenizer_json(cJSON *added, cJSON *pre, cJSON *post, cJSON *decoder, cJSON *model) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", "1.0");
    cJSON_AddNullToObject(j, "truncation");
    cJSON_AddNullToObject(j, "padding");
    cJSON_AddItemToObject(j, "added_tokens", added);
    cJSON_AddNullToObject(j, "normalizer");
    cJSON_AddItemToObject(j, "pre_tokenizer", pre ? pre : cJSON_CreateNull());
    cJSON_AddItemToObject(j, "post_processor", post ? post : cJSON_CreateNull());
    cJSON_AddItemToObject(j, "decoder", decoder);
    cJSON_AddItemToObject(j, "model", model);
    return j;
}

static cJSON *bpe_model(cJSON *vocab, cJSON *merges, const char *unk) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    if (unk)
        cJSON_AddStringToObject(m, "unk_token", unk);
    else
        cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddStringToObject(m, "continuing_subword_prefix", "");
    cJSON_AddStringToObject(m, "end_of_word_suffix", "");
    cJSON_AddBoolToObject(m, "fuse_unk", 0);
    cJSON_AddBoolToObject(m, "byte_fallback", 0);
    cJSON_AddItemToObject(m, "vocab", vocab);
    cJSON_AddItemToObject(m, "merges", merges);
    return m;
}

// tokenizer_config.json and special_tokens_map.json: the class transformers builds, and the special tokens
// (NULL: none)
static void add_specials(cJSON *j, const char *bos, const char *eos, const char *unk) {
    if (bos)
        cJSON_AddStringToObject(j, "bos_token", bos);
    if (eos)
        cJSON_AddStringToObject(j, "eos_token", eos);
    if (unk)
        cJSON_AddStringToObject(j, "unk_token", unk);
}

static int write_configs(const char *dir, const char *cls, const char *bos, const char *eos, const char *unk,
                         int max_len, struct kiln_error *err) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "tokenizer_class", cls);
    cJSON_AddNumberToObject(c, "model_max_length", max_len);
    cJSON_AddBoolToObject(c, "add_prefix_space", 0);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", 0);
    add_specials(c, bos, eos, unk);
    int rc = write_json_file(dir, "tokenizer_config.json", c, err);
    cJSON *s = cJSON_CreateObject();
    add_specials(s, bos, eos, unk);
    return rc ? (cJSON_Delete(s), rc) : write_json_file(dir, "special_tokens_map.json", s, err);
}

static int export_gpt2(const char *dir, const char *gpt2_dir, int max_len, struct kiln_error *err) {
    char path[4200];
    char *enc = NULL, *merges = NULL;
    size_t enc_n = 0, merges_n = 0;
    snprintf(path, sizeof(path), "%s/encoder.json", gpt2_dir);
    int rc = kiln_read_file(path, &enc, &enc_n, err);
    snprintf(path, sizeof(path), "%s/vocab.bpe", gpt2_dir);
    if (!rc)
        rc = kiln_read_file(path, &merges, &merges_n, err);
    if (!rc)
        rc = write_text(dir, "vocab.json", enc, enc_n, err);
    if (!rc)
        rc = write_text(dir, "merges.txt", merges, merges_n, err);
    cJSON *vocab = rc ? NULL : cJSON_ParseWithLength(enc, enc_n);
    if (!rc && !cJSON_IsObject(vocab))
        rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                         "%s/encoder.json is not a JSON object (kiln export): the GPT-2 "
                         "vocabulary kiln trained with is damaged",
                         gpt2_dir);
    const cJSON *eot = rc ? NULL : cJSON_GetObjectItemCaseSensitive(vocab, "<|endoftext|>");
    if (!rc && !cJSON_IsNumber(eot))
        rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                         "%s/encoder.json has no <|endoftext|> (kiln export): not "
                         "GPT-2's vocabulary",
                         gpt2_dir);
    if (!rc) {
        // merges: the lines after "#version", each "a b", in rank order
        cJSON *m = cJSON_CreateArray();
        int lineno = 0;
        for (char *save = NULL, *l = strtok_r(merges, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
            lineno++;
            size_t len = strlen(l);
            if (len && l[len - 1] == '\r')
                l[--len] = 0;
            if (!len || (lineno == 1 && !strncmp(l, "#version", 8)))
                continue;
            cJSON_AddItemToArray(m, cJSON_CreateString(l));
        }
        cJSON *added = cJSON_CreateArray();
        cJSON_AddItemToArray(added, added_token(eot->valueint, "<|endoftext|>"));
        cJSON *j = tokenizer_json(added, byte_level(0, 1), byte_level(1, 0), byte_level(1, 1),
                                  bpe_model(vocab, m, NULL));
        vocab = NULL; // (owned by j now)
        rc = write_json_file(dir, "tokenizer.json", j, err);
    }
    cJSON_Delete(vocab);
    free(enc);
    free(merges);
    const char *e = "<|endoftext|>"; // GPT-2's one special token is all three
    return rc ? rc : write_configs(dir, "GPT2Tokenizer", e, e, e, max_len, err);
}

static int export_char(const char *dir, const struct kiln_run_tokenizer *tok, int max_len, char *why,
                       size_t why_cap, struct kiln_error *err) {
    for (int i = 0; i < tok->n_chars; i++)
        if ((unsigned char)tok->chars[i] >= 0x80 || tok->chars[i] == 0) {
            snprintf(why, why_cap,
                     "the char vocabulary holds byte 0x%02x, which is no whole UTF-8 character, so a "
                     "`tokenizers` vocabulary cannot name it; kiln.json keeps the vocabulary for kiln import",
                     (unsigned char)tok->chars[i]);
            return 0;
        }
    cJSON *vocab = cJSON_CreateObject();
    for (int i = 0; i < tok->n_chars; i++) {
        char c[2] = {tok->chars[i], 0};
        cJSON_AddNumberToObject(vocab, c, i);
    }
    cJSON *dec = cJSON_CreateObject();
    cJSON_AddStringToObject(dec, "type", "Fuse");
    cJSON *j =
        tokenizer_json(cJSON_CreateArray(), NULL, NULL, dec, bpe_model(vocab, cJSON_CreateArray(), NULL));
    int rc = write_json_file(dir, "tokenizer.json", j, err);
    if (rc)
        return rc;
    // no slow tokenizer class reads a character vocabulary: transformers' generic fast one loads
    // tokenizer.json
    return write_configs(dir, "PreTrainedTokenizerFast", NULL, NULL, NULL, max_len, err);
}

// A run trained with a Hugging Face tokenizer.json (--tokenizer=PATH): that file, as it is, and the configs
// naming its end-of-text token (Llama 3's <|end_of_text|>, else <|endoftext|>) as eos.
static int export_file(const char *dir, const char *path, int max_len, struct kiln_error *err) {
    char *text = NULL;
    size_t n = 0;
    int rc = kiln_read_file(path, &text, &n, err);
    if (rc)
        return rc;
    rc = write_text(dir, "tokenizer.json", text, n, err);
    cJSON *root = rc ? NULL : cJSON_ParseWithLength(text, n);
    free(text);
    const char *eos = NULL, *bos = NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(c))
            continue;
        if (!strcmp(c->valuestring, "<|end_of_text|>") || (!eos && !strcmp(c->valuestring, "<|endoftext|>")))
            eos = c->valuestring;
        if (!strcmp(c->valuestring, "<|begin_of_text|>"))
            bos = c->valuestring;
    }
    if (!rc) // GPT-2's one special token stands for all three; Llama 3 has a begin and no unknown
        rc = write_configs(dir, "PreTrainedTokenizerFast", bos ? bos : eos, eos, bos ? NULL : eos, max_len,
                           err);
    cJSON_Delete(root);
    return rc;
}

int kiln_hf_export_tokenizer(const char *dir, const struct kiln_run_tokenizer *tok, const char *gpt2_dir,
                             int max_len, char *why, size_t why_cap, struct kiln_error *err) {
    if (why_cap)
        why[0] = 0;
    size_t nl = strlen(tok->name);
    if (nl >= 5 && !strcmp(tok->name + nl - 5, ".json"))
        return export_file(dir, tok->name, max_len, err);
    if (!strcmp(tok->name, "gpt2"))
        return export_gpt2(dir, gpt2_dir, max_len, err);
    if (!strcmp(tok->name, "char"))
        return export_char(dir, tok, max_len, why, why_cap, err);
    snprintf(why, why_cap, "kiln has no Hugging Face form for tokenizer '%s'", tok->name);
    return 0;
}
