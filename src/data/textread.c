// Corpus readers: a byte stream (plain or liblzma), a line splitter on top, documents on top of that.
#include "data/textread.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <lzma.h>

#include "data/tokenizer.h"
#include "util/error.h"

#define IN_BUF (1u << 20)
#define OUT_BUF (4u << 20)

static const char EOT_LINE[] = "<|endoftext|>";

enum { FMT_TXT, FMT_JSONL };

struct kiln_textreader {
    char *path;
    FILE *f;
    int xz, fmt, at_eof;
    lzma_stream lz;
    uint64_t size, consumed; // file bytes
    unsigned char *in;       // (IN_BUF) compressed input for xz
    char *buf;               // (OUT_BUF) decoded bytes
    size_t buf_pos, buf_len;
    struct kiln_bytes line;
    uint64_t line_no;
};

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int kiln_textreader_open(struct kiln_textreader **out, const char *path, struct kiln_error *err) {
    *out = NULL;
    // a directory opens and then fails to read (EISDIR), which would read as a failing disk
    struct stat ds;
    if (stat(path, &ds) == 0 && S_ISDIR(ds.st_mode)) {
        int n = (int)strlen(path);
        while (n > 1 && path[n - 1] == '/')
            n--;
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "input is a directory (%s): kiln tokenize reads .txt and .jsonl files, optionally "
                           ".xz; give the files in it, quoted, e.g. '%.*s/*.txt'",
                           path, n, path);
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open input (%s): %s; check the path", path,
                           strerror(errno));
    struct kiln_textreader *r = kiln_xcalloc(1, sizeof(*r));
    r->path = kiln_xstrdup(path);
    r->f = f;
    struct stat st;
    r->size = fstat(fileno(f), &st) == 0 ? (uint64_t)st.st_size : 0;
    r->xz = ends_with(path, ".xz");
    r->fmt = ends_with(path, ".jsonl") || ends_with(path, ".jsonl.xz") ? FMT_JSONL : FMT_TXT;
    r->buf = kiln_xmalloc(OUT_BUF);
    if (r->xz) {
        r->in = kiln_xmalloc(IN_BUF);
        lzma_stream init = LZMA_STREAM_INIT;
        r->lz = init;
        if (lzma_stream_decoder(&r->lz, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK) {
            kiln_textreader_close(r);
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "cannot start xz decoder (%s): liblzma failed; out of "
                               "memory?",
                               path);
        }
    }
    *out = r;
    return 0;
}

// Refills r->buf. Leaves buf_len = 0 at the end of the stream.
static int fill(struct kiln_textreader *r, struct kiln_error *err) {
    r->buf_pos = r->buf_len = 0;
    if (r->at_eof)
        return 0;
    if (!r->xz) {
        size_t got = fread(r->buf, 1, OUT_BUF, r->f);
        if (got == 0) {
            if (ferror(r->f))
                return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read input (%s): I/O error; check the disk",
                                   r->path);
            r->at_eof = 1;
        }
        r->consumed += got;
        r->buf_len = got;
        return 0;
    }
    r->lz.next_out = (uint8_t *)r->buf;
    r->lz.avail_out = OUT_BUF;
    while (r->lz.avail_out == OUT_BUF) {
        lzma_action action = LZMA_RUN;
        if (r->lz.avail_in == 0) {
            size_t got = fread(r->in, 1, IN_BUF, r->f);
            if (ferror(r->f))
                return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read input (%s): I/O error; check the disk",
                                   r->path);
            r->consumed += got;
            r->lz.next_in = r->in;
            r->lz.avail_in = got;
            if (got == 0)
                action = LZMA_FINISH;
        }
        lzma_ret ret = lzma_code(&r->lz, action);
        if (ret == LZMA_STREAM_END) {
            r->at_eof = 1;
            break;
        }
        if (ret != LZMA_OK)
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "corrupt xz input (%s, near compressed byte %llu): liblzma "
                               "error %d; re-download or re-compress the file",
                               r->path, (unsigned long long)r->consumed, (int)ret);
    }
    r->buf_len = OUT_BUF - r->lz.avail_out;
    return 0;
}

// Replaces r->line with the next line including its '\n' (the last line may lack one). *eof when none is
// left.
static int next_line(struct kiln_textreader *r, int *eof, struct kiln_error *err) {
    r->line.n = 0;
    *eof = 0;
    for (;;) {
        if (r->buf_pos == r->buf_len) {
            int rc = fill(r, err);
            if (rc)
                return rc;
            if (r->buf_len == 0) {
                *eof = r->line.n == 0;
                if (!*eof)
                    r->line_no++;
                return 0;
            }
        }
        const char *s = r->buf + r->buf_pos;
        size_t avail = r->buf_len - r->buf_pos;
        const char *nl = memchr(s, '\n', avail);
        size_t take = nl ? (size_t)(nl - s) + 1 : avail;
        kiln_bytes_append(&r->line, s, take);
        r->buf_pos += take;
        if (nl) {
            r->line_no++;
            return 0;
        }
    }
}

int kiln_jsonl_text(const char *line, size_t n, struct kiln_bytes *text) {
    cJSON *o = cJSON_ParseWithLength(line, n); // validates; the bytes come from kiln_json_string_field
    int rc = !o ? -1 : !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "text")) ? 1 : 0;
    cJSON_Delete(o);
    if (rc == 0)
        rc = kiln_json_string_field(line, n, "text", text);
    return rc;
}

static int is_eot_line(const char *s, size_t n) {
    size_t k = sizeof(EOT_LINE) - 1;
    if (n && s[n - 1] == '\n')
        n--;
    if (n && s[n - 1] == '\r')
        n--;
    return n == k && memcmp(s, EOT_LINE, k) == 0;
}

int kiln_textreader_next(struct kiln_textreader *r, struct kiln_bytes *doc, int *eof,
                         struct kiln_error *err) {
    doc->n = 0;
    *eof = 0;
    for (;;) {
        int line_eof, rc = next_line(r, &line_eof, err);
        if (rc)
            return rc;
        if (line_eof) {
            if (doc->n == 0)
                *eof = 1;
            break;
        }
        if (r->fmt == FMT_TXT) {
            if (is_eot_line(r->line.data, r->line.n)) {
                if (doc->n)
                    break;
                continue;
            }
            kiln_bytes_append(doc, r->line.data, r->line.n);
            continue;
        }
        // JSONL: skip blank lines; everything else must be an object with a string "text"
        size_t k = 0;
        while (k < r->line.n && (r->line.data[k] == ' ' || r->line.data[k] == '\t' ||
                                 r->line.data[k] == '\r' || r->line.data[k] == '\n'))
            k++;
        if (k == r->line.n)
            continue;
        int rc2 = kiln_jsonl_text(r->line.data, r->line.n, doc);
        if (rc2)
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "bad JSONL record (%s:%llu): %s; each line must be an "
                               "object like {\"text\": \"...\"}",
                               r->path, (unsigned long long)r->line_no,
                               rc2 < 0 ? "not valid JSON" : "no string field \"text\"");
        if (doc->n)
            break;
    }
    kiln_bytes_reserve(doc, 1);
    doc->data[doc->n] = 0;
    return 0;
}

// ---------------------------------------------------------------------------------------------------------
// JSON string fields with their exact bytes (cJSON's strings end at an escaped \u0000)

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

static int hex4(const char *s, size_t n, size_t i, unsigned *out) {
    if (i + 4 > n)
        return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[i + k];
        v = v * 16 + (unsigned)(c >= '0' && c <= '9'   ? c - '0'
                                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                       : 99);
        if (v > 0xFFFF)
            return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(struct kiln_bytes *out, unsigned cp) {
    char b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) { // lone surrogates come out as their 3-byte form (WTF-8)
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        b[0] = (char)(0xF0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    kiln_bytes_append(out, b, k);
}

// Decodes the JSON string starting at s[i] == '"' into out (may be NULL to skip). Returns the index after the
// closing quote, or 0 on malformed input.
static size_t json_string(const char *s, size_t n, size_t i, struct kiln_bytes *out) {
    i++;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != '"' && s[j] != '\\')
            j++;
        if (out)
            kiln_bytes_append(out, s + i, j - i);
        if (j >= n)
            return 0;
        if (s[j] == '"')
            return j + 1;
        if (j + 1 >= n)
            return 0;
        char c = s[j + 1];
        i = j + 2;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *hit = c ? strchr(from, c) : NULL;
        if (hit) {
            if (out)
                kiln_bytes_append(out, to + (hit - from), 1);
            continue;
        }
        unsigned cp, lo;
        if (c != 'u' || hex4(s, n, i, &cp))
            return 0;
        i += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u' &&
            !hex4(s, n, i + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
        }
        if (out)
            put_utf8(out, cp);
    }
    return 0;
}

// Skips one JSON value starting at s[i]; returns the index after it, or 0 on malformed input.
static size_t json_skip(const char *s, size_t n, size_t i) {
    if (i < n && s[i] == '"')
        return json_string(s, n, i, NULL);
    int depth = 0;
    while (i < n) {
        char c = s[i];
        if (c == '"') {
            i = json_string(s, n, i, NULL);
            if (!i)
                return 0;
            continue;
        }
        if (c == '{' || c == '[')
            depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0)
                return i;
            if (--depth == 0)
                return i + 1;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n'))
            return i;
        i++;
    }
    return depth == 0 ? i : 0;
}

int kiln_json_string_field(const char *s, size_t n, const char *key, struct kiln_bytes *out) {
    size_t i = skip_ws(s, n, 0), kl = strlen(key);
    if (i >= n || s[i] != '{')
        return -1;
    i = skip_ws(s, n, i + 1);
    struct kiln_bytes k = {0};
    int rc = 1;
    while (i < n && s[i] == '"') {
        k.n = 0;
        i = json_string(s, n, i, &k);
        if (!i) {
            rc = -1;
            break;
        }
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != ':') {
            rc = -1;
            break;
        }
        i = skip_ws(s, n, i + 1);
        if (k.n == kl && memcmp(k.data, key, kl) == 0 && i < n && s[i] == '"') {
            out->n = 0;
            rc = json_string(s, n, i, out) ? 0 : -1;
            break;
        }
        i = json_skip(s, n, i);
        if (!i) {
            rc = -1;
            break;
        }
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ',')
            i = skip_ws(s, n, i + 1);
    }
    kiln_bytes_free(&k);
    kiln_bytes_reserve(out, 1);
    out->data[out->n] = 0;
    return rc;
}

uint64_t kiln_textreader_pos(const struct kiln_textreader *r) {
    return r->consumed;
}

uint64_t kiln_textreader_size(const struct kiln_textreader *r) {
    return r->size;
}

void kiln_textreader_close(struct kiln_textreader *r) {
    if (!r)
        return;
    if (r->xz)
        lzma_end(&r->lz);
    if (r->f)
        fclose(r->f);
    free(r->path);
    free(r->in);
    free(r->buf);
    kiln_bytes_free(&r->line);
    free(r);
}
