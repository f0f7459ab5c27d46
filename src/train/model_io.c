#include "train/model_io.h"

#include <string.h>

#include "io/safetensors.h"

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
    char vocab[32];
    snprintf(vocab, sizeof(vocab), "%d", cfg->model.vocab_size);
    const char *meta[] = {"format", "pt", "producer", "kiln", "vocab_size", vocab, "preset", cfg->preset, NULL};
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
        }
    }
    if (!rc && kiln_safetensors_count(f) != pt->n)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s holds %d tensors, this config has %d: a different architecture",
                         path, kiln_safetensors_count(f), pt->n);
    kiln_safetensors_close(f);
    return rc;
}
