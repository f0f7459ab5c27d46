// kiln encode / kiln decode: JSONL in, JSONL out, one line per line, for scripting and tests.
//   encode: {"text": "..."} -> {"ids":[...]}      decode: {"ids":[...]} -> {"text":"..."}
#include <errno.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "data/textread.h"
#include "data/tokenizer.h"
#include "run/knobs.h"
#include "util/error.h"

struct enc_args {
    const char *tokenizer, *vocab, *file;
    int allow_special;
};

static int parse_enc_args(const char *cmd, struct enc_args *a, int argc, char **argv,
                          struct kiln_error *err) {
    memset(a, 0, sizeof(*a));
    a->tokenizer = "gpt2";
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (strncmp(s, "--tokenizer=", 12) == 0) {
            a->tokenizer = s + 12;
            if (strcmp(a->tokenizer, "gpt2") != 0 && strcmp(a->tokenizer, "char") != 0 &&
                !kiln_tokenizer_is_file(a->tokenizer))
                return kiln_errorf(err, KILN_ERR_USAGE,
                                   "bad value for --tokenizer (\"%s\"): allowed values are "
                                   "gpt2, char, or a Hugging Face tokenizer.json",
                                   a->tokenizer);
        } else if (strncmp(s, "--vocab=", 8) == 0) {
            a->vocab = s + 8;
        } else if (strcmp(s, "--allow-special") == 0 && strcmp(cmd, "encode") == 0) {
            a->allow_special = 1;
        } else if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            printf("usage: kiln %s [--tokenizer=gpt2|char|FILE.json] [--vocab=PATH]%s [FILE]\n"
                   "  reads JSONL from FILE or stdin; gpt2: --vocab is the directory of encoder.json + "
                   "vocab.bpe\n"
                   "  (default data/gpt2); char: --vocab is the training text or a kiln tokenize "
                   "manifest.json\n",
                   cmd, strcmp(cmd, "encode") == 0 ? " [--allow-special]" : "");
            exit(0);
        } else if (strncmp(s, "--", 2) == 0 || (s[0] == '-' && s[1])) {
            int enc = strcmp(cmd, "encode") == 0;
            return cmd_unknown_option(
                err, cmd, s, (const char *const[]){"tokenizer", "vocab", enc ? "allow-special" : NULL, NULL},
                enc ? "--tokenizer=gpt2|char, --vocab=PATH, --allow-special"
                    : "--tokenizer=gpt2|char, --vocab=PATH");
        } else if (a->file) {
            return kiln_errorf(err, KILN_ERR_USAGE, "too many inputs (%s): kiln %s reads one FILE or stdin",
                               s, cmd);
        } else {
            a->file = s;
        }
    }
    if (strcmp(a->tokenizer, "char") == 0 && !a->vocab)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "missing option (--vocab): the char tokenizer needs its training "
                           "text or a kiln tokenize manifest.json");
    return 0;
}

// Writes s[0..n) as a JSON string. Control bytes, '"' and '\\' are escaped; other bytes pass through, so text
// that is not UTF-8 (possible when decoding arbitrary ids) comes out as its raw bytes.
static void put_json_string(FILE *out, const char *s, size_t n) {
    putc('"', out);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f)
            continue;
        fwrite(s + run, 1, i - run, out);
        run = i + 1;
        switch (c) {
        case '"':
            fputs("\\\"", out);
            break;
        case '\\':
            fputs("\\\\", out);
            break;
        case '\n':
            fputs("\\n", out);
            break;
        case '\r':
            fputs("\\r", out);
            break;
        case '\t':
            fputs("\\t", out);
            break;
        default:
            fprintf(out, "\\u%04x", c);
        }
    }
    fwrite(s + run, 1, n - run, out);
    putc('"', out);
}

typedef int (*line_fn)(struct kiln_tokenizer *t, const struct enc_args *a, const char *line, size_t n,
                       unsigned long long line_no, struct kiln_error *err);

static int encode_line(struct kiln_tokenizer *t, const struct enc_args *a, const char *line, size_t n,
                       unsigned long long line_no, struct kiln_error *err) {
    struct kiln_bytes text = {0};
    struct kiln_ids ids = {0};
    int rc = kiln_jsonl_text(line, n, &text);
    if (rc) {
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "bad input line (%s:%llu): %s; each line must be an object like "
                         "{\"text\": \"...\"}",
                         a->file ? a->file : "stdin", line_no,
                         rc < 0 ? "not valid JSON" : "no string field \"text\"");
    } else {
        rc = a->allow_special ? kiln_tokenizer_encode_special(t, text.data, text.n, &ids, err)
                              : kiln_tokenizer_encode(t, text.data, text.n, &ids, err);
        if (rc) {
            struct kiln_error e2 = *err; // add the line to the tokenizer's message
            kiln_errorf(err, rc, "%s (%s:%llu)", e2.msg, a->file ? a->file : "stdin", line_no);
        }
    }
    if (!rc) {
        fputs("{\"ids\":[", stdout);
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? ",%d" : "%d", (int)ids.data[i]);
        fputs("]}\n", stdout);
    }
    kiln_bytes_free(&text);
    kiln_ids_free(&ids);
    return rc;
}

static int decode_line(struct kiln_tokenizer *t, const struct enc_args *a, const char *line, size_t n,
                       unsigned long long line_no, struct kiln_error *err) {
    cJSON *o = cJSON_ParseWithLength(line, n);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "ids");
    int rc = 0;
    struct kiln_ids ids = {0};
    struct kiln_bytes text = {0};
    if (!cJSON_IsArray(arr)) {
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "bad input line (%s:%llu): %s; each line must be an object like "
                         "{\"ids\": [1, 2, 3]}",
                         a->file ? a->file : "stdin", line_no,
                         o ? "no array field \"ids\"" : "not valid JSON");
    } else {
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int32_t)it->valuedouble) {
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "bad input line (%s:%llu): \"ids\" entry %zu is not an "
                                 "integer id",
                                 a->file ? a->file : "stdin", line_no, ids.n);
                break;
            }
            kiln_ids_push(&ids, (int32_t)it->valuedouble);
        }
    }
    if (!rc) {
        rc = kiln_tokenizer_decode(t, ids.data, ids.n, &text, err);
        if (rc) {
            struct kiln_error e2 = *err;
            kiln_errorf(err, rc, "%s (%s:%llu)", e2.msg, a->file ? a->file : "stdin", line_no);
        }
    }
    if (!rc) {
        fputs("{\"text\":", stdout);
        put_json_string(stdout, text.data ? text.data : "", text.n);
        fputs("}\n", stdout);
    }
    cJSON_Delete(o);
    kiln_ids_free(&ids);
    kiln_bytes_free(&text);
    return rc;
}

static int run_lines(const char *cmd, int argc, char **argv, line_fn fn, const struct kiln_knobs *knobs) {
    struct kiln_error err = {0};
    struct enc_args a;
    int rc = parse_enc_args(cmd, &a, argc, argv, &err);
    if (rc)
        return kiln_error_print(&err);
    FILE *in = stdin;
    if (a.file && !(in = fopen(a.file, "rb"))) {
        kiln_errorf(&err, KILN_ERR_RUNTIME, "cannot open input (%s): %s; check the path", a.file,
                    strerror(errno));
        return kiln_error_print(&err);
    }
    struct kiln_tokenizer *t;
    rc = kiln_tokenizer_open_at(&t, a.tokenizer, a.vocab, kiln_knobs_source_dir(knobs), &err);
    if (rc) {
        if (in != stdin)
            fclose(in);
        return kiln_error_print(&err);
    }
    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned long long line_no = 0;
    while (!rc && (len = getline(&line, &cap, in)) >= 0) {
        line_no++;
        size_t n = (size_t)len;
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        size_t k = 0;
        while (k < n && (line[k] == ' ' || line[k] == '\t'))
            k++;
        if (k == n)
            continue; // blank lines are skipped
        rc = fn(t, &a, line, n, line_no, &err);
    }
    free(line);
    if (in != stdin)
        fclose(in);
    kiln_tokenizer_free(t);
    fflush(stdout);
    return rc ? kiln_error_print(&err) : 0;
}

int cmd_encode(int argc, char **argv, const struct kiln_knobs *knobs) {
    return run_lines("encode", argc, argv, encode_line, knobs);
}

int cmd_decode(int argc, char **argv, const struct kiln_knobs *knobs) {
    return run_lines("decode", argc, argv, decode_line, knobs);
}
