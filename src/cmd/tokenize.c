// kiln tokenize: text corpora -> llm.c-layout token shards + manifest.json (docs/formats.md).
//
// Pass 1 reads documents in order, cuts them into chunks at points where GPT-2's split pattern always has a
// piece boundary, encodes the chunks of a batch in parallel (one tokenizer clone per thread) and appends the
// ids in document order to a temporary uint32 stream in the output directory. So the ids, and every byte
// written, are the same for any thread count. Pass 2 knows the total, splits off validation, writes shards
// atomically (temp + rename: an interrupted run never leaves a truncated shard under a final name) and the
// manifest last.
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "data/chartok.h"
#include "data/shards.h"
#include "data/textread.h"
#include "data/tokenizer.h"
#include "run/knobs.h"
#include "io/fsutil.h"
#include "util/error.h"

#define CHUNK_BYTES (1u << 20) // target size of one parallel work item
#define BATCH_MIN_BYTES (8u << 20)

struct tok_args {
    const char *tokenizer, *vocab, *out;
    uint64_t shard_tokens, val_tokens;
    double val_fraction; // < 0: not given
    int threads, quiet;
    int n_inputs;
    char **inputs; // expanded paths
};

struct chunk {
    int doc;
    size_t begin, end;
    int first; // 1 for a document's first chunk (gets <|endoftext|> in front)
    struct kiln_ids ids;
    int rc;
    struct kiln_error err;
};

static const char USAGE[] =
    "usage: kiln tokenize --out=DIR [--tokenizer=gpt2|char|FILE.json] [--vocab=DIR] [--shard-tokens=N]\n"
    "                     [--val-tokens=N | --val-fraction=F] [--threads=N] [--quiet] FILE|GLOB...\n"
    "  inputs: .txt .txt.xz (documents end at lines \"<|endoftext|>\"), .jsonl .jsonl.xz (field \"text\")\n"
    "  writes DIR/val_NNNNNN.bin, DIR/train_NNNNNN.bin (llm.c layout) and DIR/manifest.json\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_u64(const char *flag, const char *v, uint64_t *out, struct kiln_error *err) {
    char *end;
    errno = 0;
    double d = strtod(v, &end); // accepts 1e8 as well as 100000000
    if (errno || end == v || *end || d < 0 || d > 1.8e19 || d != floor(d))
        return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for %s (%s): expected a non-negative integer",
                           v, flag + 2, flag);
    *out = (uint64_t)d;
    return 0;
}

static int add_inputs(struct tok_args *a, const char *pattern, struct kiln_error *err) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0) {
        if (rc != GLOB_NOMATCH)
            globfree(&g);
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "no input files match (%s): expected .txt or .jsonl files, optionally .xz; fix the "
            "path or quote the glob",
            pattern);
    }
    a->inputs = realloc(a->inputs, sizeof(char *) * ((size_t)a->n_inputs + g.gl_pathc));
    KILN_ASSERT(a->inputs);
    for (size_t i = 0; i < g.gl_pathc; i++)
        a->inputs[a->n_inputs++] = kiln_xstrdup(g.gl_pathv[i]);
    globfree(&g);
    return 0;
}

static int parse_args(struct tok_args *a, int argc, char **argv, struct kiln_error *err) {
    memset(a, 0, sizeof(*a));
    a->tokenizer = "gpt2";
    a->shard_tokens = 100000000;
    a->val_fraction = -1;
    a->threads = omp_get_max_threads();
    int have_val_tokens = 0;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        const char *eq = strchr(s, '=');
        int rc = 0;
        if (strncmp(s, "--", 2) != 0) {
            rc = add_inputs(a, s, err);
        } else if (strcmp(s, "--quiet") == 0) {
            a->quiet = 1;
        } else if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            fputs(USAGE, stdout);
            exit(0);
        } else if (!eq) {
            rc = cmd_unknown_option(err, "tokenize", s,
                                    (const char *const[]){"out", "tokenizer", "vocab", "shard-tokens",
                                                          "val-tokens", "val-fraction", "threads", "quiet",
                                                          NULL},
                                    "--out, --tokenizer, --vocab, --shard-tokens, --val-tokens, "
                                    "--val-fraction, --threads, --quiet");
        } else if (strncmp(s, "--tokenizer=", 12) == 0) {
            a->tokenizer = eq + 1;
            if (strcmp(a->tokenizer, "gpt2") != 0 && strcmp(a->tokenizer, "char") != 0 &&
                !kiln_tokenizer_is_file(a->tokenizer))
                rc = kiln_errorf(
                    err, KILN_ERR_USAGE,
                    "bad value '%s' for tokenizer (--tokenizer): allowed values are gpt2,char, or a "
                    "Hugging Face tokenizer.json",
                    a->tokenizer);
        } else if (strncmp(s, "--vocab=", 8) == 0) {
            a->vocab = eq + 1;
        } else if (strncmp(s, "--out=", 6) == 0) {
            a->out = eq + 1;
        } else if (strncmp(s, "--shard-tokens=", 15) == 0) {
            rc = parse_u64("--shard-tokens", eq + 1, &a->shard_tokens, err);
            if (!rc && (a->shard_tokens < 1 || a->shard_tokens > INT32_MAX))
                rc =
                    kiln_errorf(err, KILN_ERR_USAGE,
                                "bad value '%s' for shard-tokens (--shard-tokens): allowed range is 1 to %d; "
                                "the shard header holds an int32 count",
                                eq + 1, INT32_MAX);
        } else if (strncmp(s, "--val-tokens=", 13) == 0) {
            rc = parse_u64("--val-tokens", eq + 1, &a->val_tokens, err);
            have_val_tokens = 1;
        } else if (strncmp(s, "--val-fraction=", 15) == 0) {
            char *end;
            a->val_fraction = strtod(eq + 1, &end);
            if (end == eq + 1 || *end || !(a->val_fraction >= 0 && a->val_fraction < 1))
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "bad value '%s' for val-fraction (--val-fraction): allowed range is 0 to 1, "
                                 "1 excluded",
                                 eq + 1);
        } else if (strncmp(s, "--threads=", 10) == 0) {
            uint64_t t = 0;
            rc = parse_u64("--threads", eq + 1, &t, err);
            if (!rc && (t < 1 || t > 1024))
                rc =
                    kiln_errorf(err, KILN_ERR_USAGE,
                                "bad value '%s' for threads (--threads): allowed range is 1 to 1024", eq + 1);
            a->threads = (int)t;
        } else {
            rc = cmd_unknown_option(err, "tokenize", s,
                                    (const char *const[]){"out", "tokenizer", "vocab", "shard-tokens",
                                                          "val-tokens", "val-fraction", "threads", "quiet",
                                                          NULL},
                                    "--out, --tokenizer, --vocab, --shard-tokens, --val-tokens, "
                                    "--val-fraction, --threads, --quiet");
        }
        if (rc)
            return rc;
    }
    if (have_val_tokens && a->val_fraction >= 0)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "both --val-tokens and --val-fraction (kiln tokenize): they set the same split; give "
            "one");
    if (!a->out)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "missing --out=DIR (kiln tokenize): give the output directory, e.g. "
                           "--out=data/gutenberg");
    if (a->n_inputs == 0)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "no inputs (kiln tokenize): nothing to tokenize; give .txt/.jsonl files "
                           "(optionally .xz) or globs");
    return 0;
}

// Ends of chunks for a document: cut points p with text[p-1] == '\n', text[p-2] printable ASCII (not space)
// and text[p] an ASCII letter. There GPT-2's pattern always ends a piece "\n" and starts a new one, whether
// it scans the whole text or the two parts, so chunked encoding equals whole-document encoding. (char: any
// p.)
static size_t next_cut(const char *s, size_t n, size_t from, int any) {
    if (n - from <= CHUNK_BYTES)
        return n;
    size_t p = from + CHUNK_BYTES;
    if (any)
        return p;
    for (; p < n; p++) {
        unsigned char a = (unsigned char)s[p - 2], c = (unsigned char)s[p];
        if (s[p - 1] == '\n' && a > 0x20 && a < 0x7f && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))
            return p;
    }
    return n;
}

// On a terminal a bar redrawn in place every 0.25 s; in a log (stderr not a terminal) a plain line every 10
// s, so that a long run says how far it is wherever its output goes. Neither with --quiet.
struct progress {
    int on, tty;
    double t0, last;
    uint64_t total_in; // file bytes of all inputs
};

static void progress_show(struct progress *p, uint64_t done_in, uint64_t text_bytes, uint64_t tokens,
                          int final) {
    if (!p->on)
        return;
    double t = now_s();
    if (!final && t - (p->last ? p->last : p->tty ? 0 : p->t0) < (p->tty ? 0.25 : 10))
        return;
    if (final && !p->tty)
        return; // the summary line follows
    p->last = t;
    double el = t - p->t0 > 1e-6 ? t - p->t0 : 1e-6;
    double frac = p->total_in ? (double)done_in / (double)p->total_in : 0;
    double eta = frac > 0.001 ? el * (1 - frac) / frac : 0;
    int w = 30, k = (int)(frac * w + 0.5);
    char bar[64];
    for (int i = 0; i < w; i++)
        bar[i] = i < k ? '#' : '.';
    bar[w] = 0;
    if (!p->tty) {
        fprintf(stderr, "tokenize: %.1f%% of the input, %llu tokens, %.1f MB/s, ETA %d:%02d\n", 100 * frac,
                (unsigned long long)tokens, (double)text_bytes / el / 1e6, (int)(eta / 60), (int)eta % 60);
        return;
    }
    fprintf(stderr, "\rtokenize [%s] %5.1f%% %7.1f MB/s %12llu tokens  ETA %d:%02d ", bar, 100 * frac,
            (double)text_bytes / el / 1e6, (unsigned long long)tokens, (int)(eta / 60), (int)eta % 60);
    if (final)
        fputc('\n', stderr);
}

// Encodes a batch of documents and appends the ids to the stream. For char, ids are the raw bytes (mapped to
// vocab ids in pass 2, once every byte of the corpus has been seen).
static int encode_batch(struct kiln_tokenizer **toks, int threads, int is_char, int eot,
                        struct kiln_bytes *docs, int n_docs, FILE *stream, uint64_t *n_tokens,
                        unsigned char seen[256], struct kiln_error *err) {
    struct chunk *ch = NULL;
    size_t nch = 0, cap = 0;
    for (int d = 0; d < n_docs; d++)
        for (size_t b = 0; b < docs[d].n;) {
            size_t e = next_cut(docs[d].data, docs[d].n, b, is_char);
            if (nch == cap) {
                cap = cap ? cap * 2 : 64;
                ch = realloc(ch, cap * sizeof(*ch));
                KILN_ASSERT(ch);
            }
            memset(&ch[nch], 0, sizeof(*ch));
            ch[nch].doc = d;
            ch[nch].begin = b;
            ch[nch].end = e;
            ch[nch].first = b == 0;
            nch++;
            b = e;
        }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t i = 0; i < nch; i++) {
        struct chunk *c = &ch[i];
        const char *s = docs[c->doc].data + c->begin;
        size_t n = c->end - c->begin;
        if (is_char) {
            kiln_ids_reserve(&c->ids, n);
            for (size_t k = 0; k < n; k++)
                c->ids.data[k] = (unsigned char)s[k];
            c->ids.n = n;
        } else {
            c->rc = kiln_tokenizer_encode(toks[omp_get_thread_num()], s, n, &c->ids, &c->err);
        }
    }
    int rc = 0;
    for (size_t i = 0; i < nch; i++) {
        struct chunk *c = &ch[i];
        if (!rc && c->rc) {
            *err = c->err;
            rc = c->rc;
        }
        if (!rc && c->first && eot >= 0) {
            uint32_t e = (uint32_t)eot;
            if (fwrite(&e, 4, 1, stream) != 1)
                rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                 "cannot write token stream (temp file): %s; check free "
                                 "disk space",
                                 strerror(errno));
            (*n_tokens)++;
        }
        if (!rc && c->ids.n && fwrite(c->ids.data, 4, c->ids.n, stream) != c->ids.n)
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "cannot write token stream (temp file): %s; check free disk "
                             "space",
                             strerror(errno));
        if (is_char)
            for (size_t k = 0; k < c->ids.n; k++)
                seen[c->ids.data[k]] = 1;
        *n_tokens += c->ids.n;
        kiln_ids_free(&c->ids);
    }
    free(ch);
    return rc;
}

// Writes the shards of one split; appends {"file","tokens","sha256"} objects to arr.
static int write_split(const char *dir, const char *split, const int32_t *tok, uint64_t n,
                       uint64_t shard_tokens, int elem_bytes, cJSON *arr, int *n_written,
                       struct kiln_error *err) {
    *n_written = 0;
    for (uint64_t off = 0; off < n; off += shard_tokens) {
        uint64_t m = n - off < shard_tokens ? n - off : shard_tokens;
        char name[64], path[4200], sha[65];
        snprintf(name, sizeof(name), "%s_%06d.bin", split, *n_written);
        int rc = kiln_path_join(path, sizeof(path), dir, name, err);
        if (!rc)
            rc = kiln_shard_write(path, tok + off, (size_t)m, elem_bytes, sha, err);
        if (rc)
            return rc;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "file", name);
        cJSON_AddNumberToObject(o, "tokens", (double)m);
        cJSON_AddStringToObject(o, "sha256", sha);
        cJSON_AddItemToArray(arr, o);
        (*n_written)++;
    }
    return 0;
}

// Removes SPLIT_NNNNNN.bin files numbered >= keep left by an earlier run (the loader globs the directory).
static int remove_stale(const char *dir, const char *split, int keep) {
    char pat[4200];
    snprintf(pat, sizeof(pat), "%s/%s_[0-9][0-9][0-9][0-9][0-9][0-9].bin", dir, split);
    glob_t g;
    int removed = 0;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char *base = strrchr(g.gl_pathv[i], '/');
            base = base ? base + 1 : g.gl_pathv[i];
            int num = atoi(base + strlen(split) + 1);
            if (num >= keep && unlink(g.gl_pathv[i]) == 0)
                removed++;
        }
        globfree(&g);
    }
    return removed;
}

static int run_tokenize(struct tok_args *a, const struct kiln_knobs *knobs, struct kiln_error *err) {
    int is_char = strcmp(a->tokenizer, "char") == 0;
    struct kiln_tokenizer **toks = kiln_xcalloc((size_t)a->threads, sizeof(*toks));
    int rc = 0, eot = -1, vocab_size = 256;
    if (!is_char) {
        rc = kiln_tokenizer_open_at(&toks[0], kiln_tokenizer_is_file(a->tokenizer) ? a->tokenizer : "gpt2",
                                    a->vocab, kiln_knobs_source_dir(knobs), err);
        if (rc) {
            free(toks);
            return rc;
        }
        for (int i = 1; i < a->threads; i++)
            toks[i] = kiln_tokenizer_clone(toks[0]);
        eot = kiln_tokenizer_eot(toks[0]);
        vocab_size = kiln_tokenizer_vocab_size(toks[0]);
    }
    rc = kiln_mkdir_p(a->out, err);
    char tmp_path[4200] = {0};
    FILE *stream = NULL;
    if (!rc) {
        snprintf(tmp_path, sizeof(tmp_path), "%s/.tokens-%016llx.tmp", a->out,
                 (unsigned long long)kiln_nonce());
        stream = fopen(tmp_path, "w+b");
        if (!stream)
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "cannot create temp file (%s): %s; check the output directory", tmp_path,
                             strerror(errno));
    }

    struct progress pr = {.on = !a->quiet, .tty = isatty(2), .t0 = now_s()};
    for (int i = 0; i < a->n_inputs; i++) {
        struct stat st;
        if (stat(a->inputs[i], &st) == 0)
            pr.total_in += (uint64_t)st.st_size;
    }
    // what it is about to do, before the first batch, where that takes seconds (a batch is 8 MB or more; a
    // smaller input ends in a moment with its summary line, or an error as its only line)
    if (pr.on && !rc && pr.total_in > BATCH_MIN_BYTES)
        fprintf(stderr, "tokenize: %d input file%s, %.1f MB%s, %s tokenizer, %d thread%s -> %s\n",
                a->n_inputs, a->n_inputs == 1 ? "" : "s", (double)pr.total_in / 1e6,
                a->n_inputs && strstr(a->inputs[0], ".xz") ? " compressed" : "", a->tokenizer, a->threads,
                a->threads == 1 ? "" : "s", a->out);
    uint64_t n_tokens = 0, n_docs = 0, text_bytes = 0, done_in = 0;
    unsigned char seen[256] = {0};
    int cap_docs = 64;
    struct kiln_bytes *docs = kiln_xcalloc((size_t)cap_docs, sizeof(*docs));
    size_t batch_bytes = (size_t)a->threads * 2 * CHUNK_BYTES;
    if (batch_bytes < BATCH_MIN_BYTES)
        batch_bytes = BATCH_MIN_BYTES;
    cJSON *sources = cJSON_CreateArray();
    for (int i = 0; i < a->n_inputs && !rc; i++) {
        struct kiln_textreader *r;
        rc = kiln_textreader_open(&r, a->inputs[i], err);
        if (rc)
            break;
        uint64_t file_text = 0, file_docs = 0;
        int eof = 0;
        while (!eof && !rc) {
            int nd = 0;
            size_t bytes = 0;
            while (bytes < batch_bytes) {
                if (nd == cap_docs) {
                    docs = realloc(docs, sizeof(*docs) * (size_t)cap_docs * 2);
                    KILN_ASSERT(docs);
                    memset(docs + cap_docs, 0, sizeof(*docs) * (size_t)cap_docs);
                    cap_docs *= 2;
                }
                rc = kiln_textreader_next(r, &docs[nd], &eof, err);
                if (rc || eof)
                    break;
                bytes += docs[nd].n;
                nd++;
            }
            if (!rc && nd)
                rc = encode_batch(toks, a->threads, is_char, eot, docs, nd, stream, &n_tokens, seen, err);
            text_bytes += bytes;
            file_text += bytes;
            file_docs += (uint64_t)nd;
            progress_show(&pr, done_in + kiln_textreader_pos(r), text_bytes, n_tokens, 0);
        }
        uint64_t file_bytes = kiln_textreader_size(r);
        done_in += file_bytes;
        kiln_textreader_close(r);
        n_docs += file_docs;
        cJSON *src = cJSON_CreateObject();
        cJSON_AddStringToObject(src, "path", a->inputs[i]);
        cJSON_AddNumberToObject(src, "file_bytes", (double)file_bytes);
        cJSON_AddNumberToObject(src, "text_bytes", (double)file_text);
        cJSON_AddNumberToObject(src, "documents", (double)file_docs);
        cJSON_AddItemToArray(sources, src);
    }
    for (int i = 0; i < cap_docs; i++)
        kiln_bytes_free(&docs[i]);
    free(docs);
    for (int i = 0; i < a->threads; i++)
        kiln_tokenizer_free(toks[i]);
    free(toks);
    if (!rc)
        progress_show(&pr, pr.total_in, text_bytes, n_tokens, 1);
    if (!rc && fflush(stream) != 0)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write token stream (%s): %s; check free disk space",
                         tmp_path, strerror(errno));
    if (!rc && n_tokens == 0)
        rc = kiln_errorf(err, KILN_ERR_USAGE, "no text in the inputs (%s%s): nothing to tokenize",
                         a->inputs[0], a->n_inputs > 1 ? ", ..." : "");

    // pass 2: split and write shards
    uint64_t n_val = 0;
    if (!rc) {
        n_val = a->val_fraction >= 0 ? (uint64_t)llround(a->val_fraction * (double)n_tokens) : a->val_tokens;
        if (n_val >= n_tokens)
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "validation split too large (%llu of %llu tokens): nothing left "
                             "to train on; lower --val-tokens or --val-fraction",
                             (unsigned long long)n_val, (unsigned long long)n_tokens);
    }
    int32_t *tok = NULL;
    size_t map_bytes = (size_t)n_tokens * 4;
    if (!rc) {
        tok = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(stream), 0);
        if (tok == MAP_FAILED) {
            tok = NULL;
            rc = kiln_errorf(err, KILN_ERR_RUNTIME, "cannot map token stream (%s): %s", tmp_path,
                             strerror(errno));
        }
    }
    struct kiln_chartok ct;
    if (!rc && is_char) {
        char chars[256];
        int nc = 0;
        for (int b = 0; b < 256; b++)
            if (seen[b])
                chars[nc++] = (char)b;
        rc = kiln_chartok_init_vocab(&ct, chars, (size_t)nc, err);
        for (uint64_t i = 0; !rc && i < n_tokens; i++)
            tok[i] = ct.byte_id[tok[i]];
        vocab_size = ct.vocab_size;
    }
    int elem = kiln_shard_elem_bytes(vocab_size), n_val_shards = 0, n_train_shards = 0;
    cJSON *val_arr = cJSON_CreateArray(), *train_arr = cJSON_CreateArray();
    if (!rc)
        rc = write_split(a->out, "val", tok, n_val, a->shard_tokens, elem, val_arr, &n_val_shards, err);
    if (!rc)
        rc = write_split(a->out, "train", tok + n_val, n_tokens - n_val, a->shard_tokens, elem, train_arr,
                         &n_train_shards, err);
    if (tok)
        munmap(tok, map_bytes);
    if (stream)
        fclose(stream);
    if (tmp_path[0])
        unlink(tmp_path);

    if (!rc) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "format", "kiln-token-shards");
        cJSON_AddNumberToObject(m, "format_version", 1);
        cJSON *t = cJSON_AddObjectToObject(m, "tokenizer");
        cJSON_AddStringToObject(t, "name", a->tokenizer);
        cJSON_AddNumberToObject(t, "vocab_size", vocab_size);
        cJSON_AddNumberToObject(t, "eot", eot);
        if (is_char) {
            cJSON *cv = cJSON_AddArrayToObject(t, "char_vocab");
            for (int i = 0; i < ct.vocab_size; i++)
                cJSON_AddItemToArray(cv, cJSON_CreateNumber((unsigned char)ct.chars[i]));
        }
        cJSON *lay = cJSON_AddObjectToObject(m, "layout");
        cJSON_AddNumberToObject(lay, "magic", elem == 2 ? KILN_SHARD_MAGIC_U16 : KILN_SHARD_MAGIC_U32);
        cJSON_AddNumberToObject(lay, "version", elem == 2 ? KILN_SHARD_VERSION_U16 : KILN_SHARD_VERSION_U32);
        cJSON_AddStringToObject(lay, "dtype", elem == 2 ? "uint16" : "uint32");
        cJSON_AddNumberToObject(lay, "header_bytes", KILN_SHARD_HEADER_INTS * 4);
        cJSON_AddNumberToObject(m, "shard_tokens", (double)a->shard_tokens);
        cJSON_AddNumberToObject(m, "documents", (double)n_docs);
        cJSON_AddNumberToObject(m, "text_bytes", (double)text_bytes);
        cJSON_AddNumberToObject(m, "tokens", (double)n_tokens);
        cJSON_AddItemToObject(m, "sources", sources);
        sources = NULL;
        cJSON *splits = cJSON_AddObjectToObject(m, "splits");
        cJSON *sv = cJSON_AddObjectToObject(splits, "val");
        cJSON_AddNumberToObject(sv, "tokens", (double)n_val);
        cJSON_AddItemToObject(sv, "shards", val_arr);
        cJSON *st = cJSON_AddObjectToObject(splits, "train");
        cJSON_AddNumberToObject(st, "tokens", (double)(n_tokens - n_val));
        cJSON_AddItemToObject(st, "shards", train_arr);
        val_arr = train_arr = NULL;
        char *json = cJSON_Print(m);
        cJSON_Delete(m);
        size_t jl = strlen(json);
        json = realloc(json, jl + 2);
        KILN_ASSERT(json);
        json[jl] = '\n';
        json[jl + 1] = 0;
        char path[4200];
        rc = kiln_path_join(path, sizeof(path), a->out, "manifest.json", err);
        if (!rc)
            rc = kiln_write_file_atomic(path, json, jl + 1, err);
        free(json);
    }
    cJSON_Delete(sources);
    cJSON_Delete(val_arr);
    cJSON_Delete(train_arr);
    if (!rc) {
        int stale = remove_stale(a->out, "val", n_val_shards) + remove_stale(a->out, "train", n_train_shards);
        if (!a->quiet)
            fprintf(
                stderr,
                "tokenize: %llu documents, %.1f MB of text -> %llu tokens (%s, %s): %llu val in %d shard(s), "
                "%llu train in %d shard(s), %s/manifest.json%s\n",
                (unsigned long long)n_docs, (double)text_bytes / 1e6, (unsigned long long)n_tokens,
                a->tokenizer, elem == 2 ? "uint16" : "uint32", (unsigned long long)n_val, n_val_shards,
                (unsigned long long)(n_tokens - n_val), n_train_shards, a->out,
                stale ? " (removed stale shards of an earlier run)" : "");
    }
    return rc;
}

int cmd_tokenize(int argc, char **argv, const struct kiln_knobs *knobs) {
    struct kiln_error err = {0};
    struct tok_args a;
    int rc = parse_args(&a, argc, argv, &err);
    if (rc) {
        kiln_error_print(&err);
    } else {
        rc = run_tokenize(&a, knobs, &err);
        if (rc)
            kiln_error_print(&err);
    }
    for (int i = 0; i < a.n_inputs; i++)
        free(a.inputs[i]);
    free(a.inputs);
    return rc;
}
