#include "run/model_io.h"

#include <sys/stat.h>

#include "io/checkpoint.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "data/tokenizer.h"
#include "io/fsutil.h"
#include "io/safetensors.h"
#include "util/sha256.h"

#include <math.h>
#include <strings.h>

// A run's model.safetensors carries the SHA-256 of its data buffer (every tensor's bytes, in file order) in
// its metadata under this key (docs/formats.md). The header cannot hold its own hash; a damaged header fails
// to parse or names other tensors, which the reader refuses anyway.
#define DATA_SHA_KEY "data_sha256"

int kiln_nonfinite_error(struct kiln_error *err, const char *file, const char *tensor, int64_t index,
                         float value) {
    return kiln_errorf(err, KILN_ERR_RUNTIME,
                       "non-finite weight %g (%s: tensor %s, element %lld): the model's outputs would be "
                       "NaN; the run diverged or the file is damaged: use an earlier checkpoint",
                       (double)value, file, tensor, (long long)index);
}

int kiln_check_finite(const float *x, size_t n, const char *file, const char *tensor,
                      struct kiln_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return kiln_nonfinite_error(err, file, tensor, (int64_t)i, x[i]);
    return 0;
}

int kiln_write_model_safetensors(const char *path, const struct kiln_param_table *pt, const float *params,
                                 const struct kiln_config *cfg, struct kiln_error *err) {
    struct kiln_st_tensor *t = kiln_xcalloc((size_t)pt->n, sizeof(*t));
    for (int i = 0; i < pt->n; i++) {
        t[i].name = pt->p[i].name;
        t[i].dtype = KILN_ST_F32;
        t[i].ndim = pt->p[i].ndim;
        t[i].shape[0] = pt->p[i].shape[0];
        t[i].shape[1] = pt->p[i].shape[1];
        t[i].data = params + pt->p[i].offset;
    }
    // the data buffer is the tensors' bytes in this order: hash them before the header that carries the hash
    struct kiln_sha256 sha;
    kiln_sha256_init(&sha);
    for (int i = 0; i < pt->n; i++)
        kiln_sha256_update(&sha, params + pt->p[i].offset, pt->p[i].count * sizeof(float));
    uint8_t digest[32];
    char hex[65];
    kiln_sha256_final(&sha, digest);
    kiln_sha256_hex(digest, hex);
    char vocab[32];
    snprintf(vocab, sizeof(vocab), "%d", cfg->model.vocab_size);
    const char *meta[] = {"format", "pt",        "producer",   "kiln", "vocab_size", vocab,
                          "preset", cfg->preset, DATA_SHA_KEY, hex,    NULL};
    int rc = kiln_safetensors_write(path, t, pt->n, meta, err);
    free(t);
    return rc;
}

int kiln_read_model_safetensors(const char *path, const struct kiln_param_table *pt, float *params,
                                struct kiln_error *err) {
    struct kiln_safetensors *f;
    int rc = kiln_safetensors_open(&f, path, err);
    if (rc)
        return rc;
    const char *want = kiln_safetensors_meta(f, DATA_SHA_KEY);
    if (want) { // files without it (older runs, hand-made) load unchecked
        size_t n;
        const void *data = kiln_safetensors_data(f, &n);
        uint8_t digest[32];
        char hex[65];
        kiln_sha256(data, n, digest);
        kiln_sha256_hex(digest, hex);
        if (strcasecmp(hex, want)) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "checksum mismatch (%s): the tensor data's sha256 is %.16s..., the file's "
                             "data_sha256 says %.16s...; the file was damaged or changed after kiln wrote it",
                             path, hex, want);
            kiln_safetensors_close(f);
            return rc;
        }
    }
    memset(params, 0, pt->total * sizeof(float));
    for (int i = 0; i < pt->n && !rc; i++) {
        const struct kiln_param *p = &pt->p[i];
        const struct kiln_st_tensor *t = kiln_safetensors_find(f, p->name);
        if (!t) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME, "tensor %s missing (%s): the file holds a different model", p->name,
                             path);
        } else if (t->dtype != KILN_ST_F32 || t->ndim != p->ndim || t->shape[0] != p->shape[0] ||
                   (p->ndim == 2 && t->shape[1] != p->shape[1])) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "tensor %s has dtype %s shape [%lld, %lld] (%s): expected F32 [%lld, %lld] for this config",
                             p->name, kiln_st_dtype_name(t->dtype), (long long)t->shape[0],
                             (long long)(t->ndim > 1 ? t->shape[1] : 0), path, (long long)p->shape[0],
                             (long long)(p->ndim > 1 ? p->shape[1] : 0));
        } else {
            memcpy(params + p->offset, t->data, p->count * sizeof(float));
            rc = kiln_check_finite(params + p->offset, p->count, path, p->name, err);
        }
    }
    if (!rc && kiln_safetensors_count(f) != pt->n)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s holds %d tensors, this config has %d: a different architecture",
                         path, kiln_safetensors_count(f), pt->n);
    kiln_safetensors_close(f);
    return rc;
}

// ----------------------------------------------------------------------------
// run directories

int kiln_run_read_config(const char *dir, struct kiln_config *cfg, struct kiln_run_tokenizer *tok,
                         const char *source_dir, struct kiln_error *err) {
    char path[1200], arg[1220];
    memset(tok, 0, sizeof(*tok));
    snprintf(path, sizeof(path), "%s/config", dir);
    if (access(path, R_OK) != 0)
        return kiln_errorf(err, KILN_ERR_USAGE, "no kiln run in '%s' (--run): %s is missing; pass the --out directory "
                           "of kiln train or kiln import", dir, path);
    snprintf(arg, sizeof(arg), "--config=%s", path);
    char *args[] = {arg};
    int rc = kiln_config_parse(cfg, 1, args, err);
    if (rc)
        return rc;
    snprintf(tok->name, sizeof(tok->name), "%s", cfg->tokenizer);
    if (!strcmp(cfg->tokenizer, "char")) {
        snprintf(path, sizeof(path), "%s/vocab.char", dir);
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(tok->chars, 1, sizeof(tok->chars), f) : 0;
        if (f)
            fclose(f);
        struct kiln_tokenizer *t = n ? kiln_chartok_from_vocab(tok->chars, n) : NULL;
        if (!t)
            return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read the char vocabulary (%s): is this a kiln run "
                               "directory?", path);
        kiln_tokenizer_free(t);
        tok->n_chars = (int)n;
        cfg->model.vocab_size = (int)n;
        return 0;
    }
    struct kiln_tokenizer *t;
    if ((rc = kiln_tokenizer_open_at(&t, cfg->tokenizer, NULL, source_dir, err)))
        return rc;
    cfg->model.vocab_size = kiln_tokenizer_vocab_size(t);
    kiln_tokenizer_free(t);
    return 0;
}

int kiln_run_write(const char *dir, const struct kiln_config *cfg, const struct kiln_run_tokenizer *tok,
                   const float *params, struct kiln_error *err) {
    int rc = kiln_mkdir_p(dir, err);
    if (rc)
        return rc;
    char path[1200];
    snprintf(path, sizeof(path), "%s/config", dir);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: out of memory", path);
    kiln_config_write(cfg, mem);
    fclose(mem);
    rc = kiln_write_file_atomic(path, text, len, err);
    free(text);
    if (!rc && !strcmp(tok->name, "char")) {
        snprintf(path, sizeof(path), "%s/vocab.char", dir);
        rc = kiln_write_file_atomic(path, tok->chars, (size_t)tok->n_chars, err);
    }
    if (rc)
        return rc;
    struct kiln_param_table pt;
    kiln_params_build(&pt, &cfg->model);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    rc = kiln_write_model_safetensors(path, &pt, params, cfg, err);
    kiln_params_free(&pt);
    return rc;
}

int kiln_run_weights_path(const char *dir, char *path, size_t cap, struct kiln_error *err) {
    struct stat st;
    snprintf(path, cap, "%s/model.safetensors", dir);
    if (stat(path, &st) == 0)
        return 0;
    char ck[1100];
    int rc = kiln_ckpt_find_latest(dir, ck, sizeof(ck), NULL, NULL, err);
    if (rc == KILN_CKPT_NONE)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "%s/model.safetensors does not exist (--run) and the run has no checkpoint: is %s the "
                           "--out of a kiln train run?",
                           dir, dir);
    if (rc)
        return rc;
    fprintf(stderr, "kiln: %s has no model.safetensors yet: using the newest checkpoint, %s\n", dir, ck);
    snprintf(path, cap, "%s/model.safetensors", ck);
    return 0;
}
