// The trainer's side of checkpoints. See train_ckpt.h.
#include "run/train_ckpt.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm/comm.h"
#include "io/fsutil.h"
#include "parallel/dp.h"
#include "parallel/tp.h"
#include "run/model_io.h"
#include "util/sha256.h"
#include "util/progress.h"

// ----------------------------------------------------------------------------
// state.json

// state.json holds the hashes of the other files, but nothing covers state.json itself, and a flipped digit
// in the loader position would silently change the run. So the trainer hashes its own fields: sha256 over the
// unformatted JSON of the object without the fields the checkpoint writer manages (step, format, files).
// Printing a parsed cJSON object gives back the same text, so the reader can recompute it.
static void state_hash(const cJSON *state, char hex[65]) {
    cJSON *c = cJSON_Duplicate(state, 1);
    KILN_ASSERT(c);
    static const char *const managed[] = {"step", "format", "files", "state_sha256"};
    for (size_t i = 0; i < sizeof(managed) / sizeof(managed[0]); i++)
        cJSON_DeleteItemFromObjectCaseSensitive(c, managed[i]);
    char *text = cJSON_PrintUnformatted(c);
    KILN_ASSERT(text);
    struct kiln_sha256 s;
    uint8_t d[32];
    kiln_sha256_init(&s);
    kiln_sha256_update(&s, text, strlen(text));
    kiln_sha256_final(&s, d);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    free(text);
    cJSON_Delete(c);
}

cJSON *kiln_config_to_json(const struct kiln_config *cfg) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    KILN_ASSERT(f);
    kiln_config_write(cfg, f);
    fclose(f);
    cJSON *j = cJSON_CreateObject();
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strstr(line, " = ");
        if (line[0] == '#' || !eq)
            continue;
        *eq = 0;
        cJSON_AddStringToObject(j, line, eq + 3);
    }
    free(text);
    return j;
}

cJSON *kiln_train_state_to_json(const struct kiln_train_state *s, const struct kiln_config *cfg,
                                const struct kiln_guards *g, float next_lr) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", (double)s->step);
    cJSON_AddNumberToObject(j, "opt_step", (double)s->opt_step);
    cJSON_AddNumberToObject(j, "tokens", (double)s->tokens);
    cJSON *l = cJSON_AddObjectToObject(j, "loader");
    cJSON_AddNumberToObject(l, "epoch", (double)s->loader.epoch);
    cJSON_AddNumberToObject(l, "position", (double)s->loader.position);
    // The loop draws no random numbers: data order and init derive from the seed, stochastic rounding from
    // the optimizer step. The seed is recorded so that the state is complete.
    cJSON *r = cJSON_AddObjectToObject(j, "rng");
    char seed[32];
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)cfg->seed);
    cJSON_AddStringToObject(r, "seed", seed);
    cJSON *sc = cJSON_AddObjectToObject(j, "schedule");
    cJSON_AddNumberToObject(sc, "step", (double)s->step);
    cJSON_AddNumberToObject(sc, "next_lr", (double)next_lr);
    char hash[32];
    snprintf(hash, sizeof(hash), "%016llx", (unsigned long long)kiln_model_config_hash(&cfg->model));
    cJSON_AddStringToObject(j, "model_config_hash", hash);
    cJSON *t = cJSON_AddObjectToObject(j, "tokenizer");
    cJSON_AddStringToObject(t, "name", cfg->tokenizer);
    cJSON_AddNumberToObject(t, "vocab_size", cfg->model.vocab_size);
    cJSON_AddItemToObject(j, "guards", kiln_guards_to_json(g));
    cJSON_AddItemToObject(j, "config", kiln_config_to_json(cfg));
    if (s->precision)
        cJSON_AddItemToObject(j, "precision", cJSON_Duplicate(s->precision, 1));
    char hex[65];
    state_hash(j, hex);
    cJSON_AddStringToObject(j, "state_sha256", hex);
    return j;
}

int kiln_train_state_from_json(const cJSON *j, struct kiln_train_state *s, struct kiln_error *err) {
    memset(s, 0, sizeof(*s));
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "state_sha256");
    char hex[65];
    state_hash(j, hex);
    if (!cJSON_IsString(h) || strcmp(h->valuestring, hex))
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "state.json does not match its state_sha256 (%.16s..., computed "
                           "%.16s...): the file was changed after it was written",
                           cJSON_IsString(h) ? h->valuestring : "none", hex);
    // The hash only says the trainer wrote these numbers: each count is still bounded (kiln_ckpt_state_count)
    // and checked against the others, so that a damaged state cannot silently change the run.
    uint64_t step = 0, opt = 0;
    int rc;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "loader");
    if ((rc = kiln_ckpt_state_count(j, "step", &step, err)) ||
        (rc = kiln_ckpt_state_count(j, "opt_step", &opt, err)) ||
        (rc = kiln_ckpt_state_count(j, "tokens", &s->tokens, err)))
        return rc;
    if (!cJSON_IsObject(l))
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "state.json has no loader state: not a kiln training checkpoint");
    if ((rc = kiln_ckpt_state_count(l, "loader.epoch", &s->loader.epoch, err)) ||
        (rc = kiln_ckpt_state_count(l, "loader.position", &s->loader.position, err)))
        return rc;
    if (opt > step)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "state.json field 'opt_step' is %llu: more than step %llu (AdamW updates are at most "
            "the steps); the checkpoint is damaged",
            (unsigned long long)opt, (unsigned long long)step);
    // The guards' counters are read (and checked among themselves) by kiln_guards_from_json, which does not
    // know the step: every skipped step is a step.
    struct kiln_guards g;
    kiln_guards_init(&g, 0.0f, 2, 1);
    rc = kiln_guards_from_json(&g, cJSON_GetObjectItemCaseSensitive(j, "guards"), err);
    int64_t skipped = g.skipped_total;
    kiln_guards_free(&g);
    if (rc)
        return rc;
    if ((uint64_t)skipped > step)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "state.json field 'guards.skipped_total' is %lld: more than step %llu (skipped steps are "
            "steps); the checkpoint is damaged",
            (long long)skipped, (unsigned long long)step);
    s->step = (int64_t)step;
    s->opt_step = (int64_t)opt;
    const cJSON *prec = cJSON_GetObjectItemCaseSensitive(j, "precision");
    s->precision = cJSON_IsObject(prec) ? cJSON_Duplicate(prec, 1) : NULL;
    return 0;
}

// ----------------------------------------------------------------------------
// the resume check

// Options that define the model's shape or its tokens: changing them makes the checkpoint meaningless.
static const char *const SHAPE_OPTS[] = {
    "layers",  "heads",     "kv-heads", "dim",  "block-size", "vocab-multiple", "pos",   "rope-theta",
    "norm",    "norm-bias", "norm-eps", "bias", "mlp",        "mlp-hidden",     "block", "tie-embeddings",
    "qk-norm", "tokenizer"};
// Options that say where and how to run, not what: never reported.
static const char *const QUIET_OPTS[] = {"out", "resume", "quiet", "inject-nan", "inject-crash"};

static int in_list(const char *name, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, list[i]))
            return 1;
    return 0;
}

// "old -> new", numbers in %g so that 0.00300000003 reads 0.003
static void append_change(char **buf, size_t *len, const char *sep, const char *name, const char *a,
                          const char *b) {
    char *ea, *eb;
    double da = strtod(a, &ea), db = strtod(b, &eb);
    char line[2400];
    if (*a && *b && !*ea && !*eb)
        snprintf(line, sizeof(line), "%s%s %g -> %g", *len ? sep : "", name, da, db);
    else
        snprintf(line, sizeof(line), "%s%s '%s' -> '%s'", *len ? sep : "", name, a, b);
    size_t n = strlen(line);
    *buf = realloc(*buf, *len + n + 1);
    KILN_ASSERT(*buf);
    memcpy(*buf + *len, line, n + 1);
    *len += n;
}

// Equal as text, or both numbers equal as floats: checkpoints from before RUN/config printed floats at their
// shortest (0.00300000003) still match 0.003.
static int same_value(const char *a, const char *b) {
    if (!strcmp(a, b))
        return 1;
    char *ea, *eb;
    double da = strtod(a, &ea), db = strtod(b, &eb);
    return *a && *b && !*ea && !*eb && (float)da == (float)db;
}

int kiln_resume_check_config(const cJSON *state, const struct kiln_config *cfg, char **changes,
                             struct kiln_error *err) {
    *changes = NULL;
    const cJSON *saved = cJSON_GetObjectItemCaseSensitive(state, "config");
    if (!cJSON_IsObject(saved))
        return kiln_errorf(err, KILN_ERR_RUNTIME, "state.json has no config: not a kiln training checkpoint");
    cJSON *now = kiln_config_to_json(cfg);
    char *shape = NULL, *safe = NULL;
    size_t shape_len = 0, safe_len = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, now) {
        const cJSON *old = cJSON_GetObjectItemCaseSensitive(saved, o->string);
        if (!cJSON_IsString(old) || same_value(old->valuestring, o->valuestring) ||
            in_list(o->string, QUIET_OPTS, sizeof(QUIET_OPTS) / sizeof(QUIET_OPTS[0])))
            continue;
        if (in_list(o->string, SHAPE_OPTS, sizeof(SHAPE_OPTS) / sizeof(SHAPE_OPTS[0])))
            append_change(&shape, &shape_len, ", ", o->string, old->valuestring, o->valuestring);
        else
            append_change(&safe, &safe_len, "\n", o->string, old->valuestring, o->valuestring);
    }
    cJSON_Delete(now);
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(state, "tokenizer");
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(tok, "vocab_size");
    if (cJSON_IsNumber(vs) && vs->valueint != cfg->model.vocab_size) {
        char a[32], b[32];
        snprintf(a, sizeof(a), "%d", vs->valueint);
        snprintf(b, sizeof(b), "%d", cfg->model.vocab_size);
        append_change(&shape, &shape_len, ", ", "vocab size", a, b);
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(state, "model_config_hash");
    char hash[32];
    snprintf(hash, sizeof(hash), "%016llx", (unsigned long long)kiln_model_config_hash(&cfg->model));
    if (!shape && (!cJSON_IsString(h) || strcmp(h->valuestring, hash)))
        append_change(&shape, &shape_len, ", ", "model config hash", cJSON_IsString(h) ? h->valuestring : "?",
                      hash);
    if (shape) {
        kiln_errorf(err, KILN_ERR_USAGE,
                    "the checkpoint holds a different model (--resume): %s; train with the "
                    "checkpoint's settings, or start a new run with another --out or --resume=never",
                    shape);
        free(shape);
        free(safe);
        return KILN_ERR_USAGE;
    }
    *changes = safe ? safe : kiln_xstrdup("");
    return 0;
}

// ----------------------------------------------------------------------------
// loading tensors

static int copy_tensors(struct kiln_safetensors *f, const struct kiln_param_table *pt, const char *prefix,
                        float *host, struct kiln_error *err) {
    memset(host, 0, pt->total * sizeof(float));
    for (int i = 0; i < pt->n; i++) {
        const struct kiln_param *p = &pt->p[i];
        char name[128];
        snprintf(name, sizeof(name), "%s%s", prefix, p->name);
        const struct kiln_st_tensor *t = kiln_safetensors_find(f, name);
        if (!t)
            return kiln_errorf(err, KILN_ERR_RUNTIME, "tensor %s missing (%s): the checkpoint is incomplete",
                               name, kiln_safetensors_path(f));
        if (t->dtype != KILN_ST_F32 || kiln_st_tensor_numel(t) != (int64_t)p->count || t->ndim != p->ndim ||
            t->shape[0] != p->shape[0])
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "tensor %s has dtype %s and %lld elements (%s): expected F32 "
                               "with %zu",
                               name, kiln_st_dtype_name(t->dtype), (long long)kiln_st_tensor_numel(t),
                               kiln_safetensors_path(f), p->count);
        memcpy(host + p->offset, t->data, p->count * sizeof(float));
        // a NaN that reached a checkpoint would poison every step after the resume (issue 18)
        int rc = kiln_check_finite(host + p->offset, p->count, kiln_safetensors_path(f), name, err);
        if (rc)
            return rc;
    }
    return 0;
}

int kiln_ckpt_read_params(const struct kiln_ckpt *ck, const struct kiln_param_table *pt, float *params,
                          struct kiln_error *err) {
    return copy_tensors(ck->model, pt, "", params, err);
}

static int get_size(const cJSON *o, const char *name, size_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != floor(v->valuedouble))
        return 1;
    *out = (size_t)v->valuedouble;
    return 0;
}

// The moments of the files of tensor-parallel part `part` of `tp` (every file without tensor parallelism):
// files c * tp + part for c in 0..world/tp, each of data-parallel rank c's ranges of pt's buffer (the part's
// table), placed at their flat offsets.
static int read_optim_part(const struct kiln_ckpt *ck, const struct kiln_param_table *pt, size_t world,
                           size_t tp, size_t part, const size_t *bounds, int nb, float *m, float *v,
                           struct kiln_error *err) {
    int rc = 0;
    size_t cross = world / tp;
    memset(m, 0, pt->total * sizeof(float));
    memset(v, 0, pt->total * sizeof(float));
    for (size_t c = 0; c < cross && !rc; c++) {
        size_t r = c * tp + part;
        char path[1400];
        snprintf(path, sizeof(path), "%s/optim-%05zu-of-%05zu.safetensors", ck->path, r, world);
        struct kiln_safetensors *f = NULL;
        struct kiln_dp_range *ranges;
        int n = kiln_dp_ranges_for(bounds, nb, (int)cross, (int)c, &ranges);
        size_t len = n ? ranges[n - 1].state_offset + (ranges[n - 1].hi - ranges[n - 1].lo) : 0;
        if ((rc = kiln_safetensors_open(&f, path, err))) {
            free(ranges);
            break;
        }
        const struct kiln_st_tensor *tm = kiln_safetensors_find(f, "m"), *tv = kiln_safetensors_find(f, "v");
        if (!tm || !tv || tm->dtype != KILN_ST_F32 || tv->dtype != KILN_ST_F32 ||
            kiln_st_tensor_numel(tm) != (int64_t)len || kiln_st_tensor_numel(tv) != (int64_t)len)
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "%s: expected F32 tensors m and v of %zu elements (rank %zu of %zu's ranges)",
                             path, len, r, world);
        for (int i = 0; i < n && !rc; i++) {
            size_t k = ranges[i].hi - ranges[i].lo;
            memcpy(m + ranges[i].lo, (const float *)tm->data + ranges[i].state_offset, k * sizeof(float));
            memcpy(v + ranges[i].lo, (const float *)tv->data + ranges[i].state_offset, k * sizeof(float));
        }
        free(ranges);
        kiln_safetensors_close(f);
    }
    return rc;
}

struct place_runs {
    float *whole;
    const float *part;
};

static void place_run(void *user, size_t local_at, size_t whole_at, size_t n) {
    struct place_runs *c = user;
    memcpy(c->whole + whole_at, c->part + local_at, n * sizeof(float));
}

static void take_run(void *user, size_t local_at, size_t whole_at, size_t n) {
    struct place_runs *c = user; // (here `whole` is the part being filled, `part` the whole tensor)
    memcpy(c->whole + local_at, c->part + whole_at, n * sizeof(float));
}

// The moments from every rank's shard file, placed at their flat offsets of pt (the whole model's table). A
// tensor-parallel run's files (optim_layout.tp > 1) hold its parts' tables' ranges: each part is read, then
// placed in the whole tensors (m, the model's config, says how they were split).
static int read_optim_shards(const struct kiln_ckpt *ck, const struct kiln_param_table *pt,
                             const struct kiln_model_config *model, float *m, float *v, struct kiln_error *err) {
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(ck->state, "optim_layout");
    const cJSON *jb = cJSON_GetObjectItemCaseSensitive(lay, "bucket_bounds");
    size_t world = 0, tp = 1;
    int nb = cJSON_IsArray(jb) ? cJSON_GetArraySize(jb) - 1 : -1;
    if (!cJSON_IsObject(lay) || get_size(lay, "world", &world) || world < 1 || world > 1000000 || nb < 1)
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "state.json (%s): no optim.safetensors and no valid optim_layout: not a complete "
                           "kiln training checkpoint",
                           ck->path);
    if (cJSON_GetObjectItemCaseSensitive(lay, "tp") &&
        (get_size(lay, "tp", &tp) || tp < 1 || world % tp || (tp > 1 && !model)))
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "state.json (%s): optim_layout.tp is not a divisor of its world of %zu ranks",
                           ck->path, world);
    // the table each file's ranges are of: the whole model's, or a tensor-parallel part's
    struct kiln_model_split split = kiln_split_tensor_parallel((int)tp, 0); // (the tables know no rows)
    struct kiln_param_table part_table;
    const struct kiln_param_table *ft = pt;
    if (tp > 1) {
        struct kiln_error e = {0};
        if (kiln_model_split_check(model, &split, &e))
            return kiln_errorf(err, KILN_ERR_RUNTIME, "state.json (%s): optim_layout.tp %zu: %s", ck->path,
                               tp, e.msg);
        kiln_params_build_split(&part_table, model, &split);
        ft = &part_table;
    }
    size_t *bounds = kiln_xcalloc((size_t)nb + 1, sizeof(size_t));
    int rc = 0;
    for (int i = 0; i <= nb && !rc; i++) {
        const cJSON *x = cJSON_GetArrayItem(jb, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble) ||
            (size_t)x->valuedouble > ft->total || (i > 0 && (size_t)x->valuedouble > bounds[i - 1]))
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "state.json (%s): optim_layout.bucket_bounds[%d] is not an offset in 0..%zu, "
                             "descending",
                             ck->path, i, ft->total);
        else
            bounds[i] = (size_t)x->valuedouble;
    }
    if (!rc && (bounds[0] != ft->total || bounds[nb] != 0))
        rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                         "state.json (%s): optim_layout covers [%zu, %zu), the model has %zu elements",
                         ck->path, bounds[nb], bounds[0], ft->total);
    if (tp == 1 && !rc) {
        rc = read_optim_part(ck, pt, world, 1, 0, bounds, nb, m, v, err);
    } else if (!rc) {
        memset(m, 0, pt->total * sizeof(float));
        memset(v, 0, pt->total * sizeof(float));
        float *pm = kiln_xmalloc(ft->total * sizeof(float)), *pv = kiln_xmalloc(ft->total * sizeof(float));
        for (size_t r = 0; r < tp && !rc; r++) {
            if ((rc = read_optim_part(ck, ft, world, tp, r, bounds, nb, pm, pv, err)))
                break;
            for (int i = 0; i < ft->n; i++) {
                size_t at = pt->p[kiln_params_find(pt, ft->p[i].name)].offset;
                struct place_runs cm = {m + at, pm + ft->p[i].offset}, cv = {v + at, pv + ft->p[i].offset};
                kiln_params_split_runs(model, &split, (int)r, ft, i, place_run, &cm);
                kiln_params_split_runs(model, &split, (int)r, ft, i, place_run, &cv);
            }
        }
        free(pm);
        free(pv);
    }
    if (tp > 1)
        kiln_params_free(&part_table);
    free(bounds);
    // the padding between tensors is never trained: keep it zero whatever the files held
    if (!rc) {
        float *zm = kiln_xcalloc(pt->total, sizeof(float)), *zv = kiln_xcalloc(pt->total, sizeof(float));
        for (int i = 0; i < pt->n; i++) {
            memcpy(zm + pt->p[i].offset, m + pt->p[i].offset, pt->p[i].count * sizeof(float));
            memcpy(zv + pt->p[i].offset, v + pt->p[i].offset, pt->p[i].count * sizeof(float));
        }
        memcpy(m, zm, pt->total * sizeof(float));
        memcpy(v, zv, pt->total * sizeof(float));
        free(zm);
        free(zv);
    }
    return rc;
}

int kiln_ckpt_read_optim(const struct kiln_ckpt *ck, const struct kiln_param_table *pt,
                         const struct kiln_model_config *model, float *m, float *v, struct kiln_error *err) {
    if (!ck->optim)
        return read_optim_shards(ck, pt, model, m, v, err);
    int rc = copy_tensors(ck->optim, pt, "m.", m, err);
    return rc ? rc : copy_tensors(ck->optim, pt, "v.", v, err);
}

int kiln_ckpt_apply(const struct kiln_ckpt *ck, const struct kiln_param_table *pt,
                    const struct kiln_model_config *model, struct kiln_optim_state *st, struct kiln_error *err) {
    float *p = kiln_xmalloc(pt->total * sizeof(float)), *m = kiln_xmalloc(pt->total * sizeof(float)),
          *v = kiln_xmalloc(pt->total * sizeof(float));
    int rc = copy_tensors(ck->model, pt, "", p, err);
    if (!rc) // optim.safetensors, or the shards of a run of several ranks
        rc = kiln_ckpt_read_optim(ck, pt, model, m, v, err);
    if (!rc) {
        kiln_optim_state_set_master(st, p); // (and the model's compute copy)
        kiln_optim_state_set_moments(st, m, v);
    }
    free(p);
    free(m);
    free(v);
    return rc;
}

// This part's elements (local's tables) of the whole model's (whole's)
static float *take_part(const struct kiln_ckpt_part_of *s, const struct kiln_param_table *local, const float *all) {
    float *out = kiln_xcalloc(local->total, sizeof(float));
    for (int i = 0; i < local->n; i++) {
        struct place_runs c = {out + local->p[i].offset,
                               all + s->whole->p[kiln_params_find(s->whole, local->p[i].name)].offset};
        kiln_params_split_runs(s->model, &s->split, s->rank, local, i, take_run, &c);
    }
    return out;
}

int kiln_ckpt_apply_dp(const struct kiln_ckpt *ck, const struct kiln_param_table *pt, struct kiln_dp *dp,
                       struct kiln_optim_state *st, const struct kiln_ckpt_part_of *part, const struct kiln_model_config *model,
                       struct kiln_error *err) {
    const struct kiln_param_table *wt = part ? part->whole : pt; // what the files hold: the whole model
    float *p = kiln_xmalloc(wt->total * sizeof(float)), *m = kiln_xmalloc(wt->total * sizeof(float)),
          *v = kiln_xmalloc(wt->total * sizeof(float));
    int rc = copy_tensors(ck->model, wt, "", p, err);
    if (!rc)
        rc = kiln_ckpt_read_optim(ck, wt, model, m, v, err);
    if (!rc && part) { // a tensor-parallel rank keeps its part
        float *x[3] = {p, m, v};
        for (int k = 0; k < 3; k++) {
            float *t = take_part(part, pt, x[k]);
            free(x[k]);
            x[k] = t;
        }
        p = x[0], m = x[1], v = x[2];
    }
    if (!rc) {
        kiln_dp_set_master(dp, p);
        if (kiln_dp_zero(dp)) { // this rank's ranges only, compact, as it holds them
            int n;
            const struct kiln_dp_range *r = kiln_dp_ranges(dp, &n);
            float *cm = kiln_xcalloc(kiln_dp_optim_elems(dp), sizeof(float));
            float *cv = kiln_xcalloc(kiln_dp_optim_elems(dp), sizeof(float));
            for (int i = 0; i < n; i++) {
                size_t k = r[i].hi - r[i].lo;
                memcpy(cm + r[i].state_offset, m + r[i].lo, k * sizeof(float));
                memcpy(cv + r[i].state_offset, v + r[i].lo, k * sizeof(float));
            }
            kiln_optim_state_set_moments(st, cm, cv);
            free(cm);
            free(cv);
        } else {
            kiln_optim_state_set_moments(st, m, v);
        }
    }
    free(p);
    free(m);
    free(v);
    return rc;
}

// ----------------------------------------------------------------------------
// the asynchronous writer

struct kiln_ckpt_writer {
    char run_dir[1024];
    const struct kiln_param_table *pt;
    struct kiln_ckpt_policy policy;
    float *params, *m, *v;   // host snapshot, (total) each
    struct kiln_backend *be; // its host_alloc gave the snapshot (page-locked on CUDA)
    int pinned;              // 1: from be->ops->host_alloc, 0: malloc
    pthread_t prefault;      // touches the snapshot pages once, off the step loop
    int prefaulting;
    struct kiln_st_tensor *model, *optim; // (n), (2n) pointing into the snapshot
    char (*optim_names)[128];             // (2n) "m.NAME", "v.NAME"
    // a group's writer (kiln_ckpt_writer_create_group): this rank's ranges of the moments, compact
    struct kiln_dp *dp;
    struct kiln_comm *comm;
    struct kiln_ckpt_group grp;
    size_t shard_elems;
    char shard_name[64];
    struct kiln_st_tensor shard[2];
    // a tensor-parallel group writer (kiln_ckpt_writer_set_tp): the whole model, gathered on rank 0 into
    // whole_params, is what model.safetensors holds (model then points into it)
    struct kiln_tp *tp;
    const struct kiln_param_table *whole;
    float *whole_params;
    pthread_t thread;
    int running;
    // the write in flight
    int64_t step;
    cJSON *state;
    int rc;
    struct kiln_error err;
    double write_ms;
    // a group's write: begun (collectives on the caller's thread), files written on the thread (files_done
    // once they are), finished by kiln_ckpt_writer_commit (collectives on the caller's thread again)
    struct kiln_ckpt_part part;
    int awaiting; // begun, not yet finished
    _Atomic int files_done;
    double began_s;
    int delay_ms; // KILN_CKPT_DELAY_MS (tests): rank r's files wait (r + 1) x this before they are written
    // rank 0: the step whose install's pruning is still to do (-1: none). A commit at a step boundary leaves
    // it to the next write's thread (deleting old checkpoints can take long), join does it at once.
    int64_t prune_step;
};

// a group's files: rank 0 the weights and its shard, the others their shards
static int group_files(struct kiln_ckpt_writer *w, struct kiln_ckpt_file files[2]) {
    files[0] = (struct kiln_ckpt_file){w->shard_name, w->shard, 2};
    files[1] = (struct kiln_ckpt_file){"model.safetensors", w->model, w->whole ? w->whole->n : w->pt->n};
    return w->grp.rank == 0 ? 2 : 1;
}

static void *writer_main(void *arg) {
    struct kiln_ckpt_writer *w = arg;
    double t0 = kiln_now_s();
    if (w->dp) { // the files alone: the save's collectives stay on the training thread
        if (w->delay_ms > 0)
            usleep((useconds_t)w->delay_ms * 1000u * (useconds_t)(w->grp.rank + 1));
        int rc = 0;
        if (w->prune_step >= 0) { // the previous install's (reported with this write)
            rc = kiln_ckpt_prune(w->run_dir, w->prune_step, &w->policy, &w->err);
            w->prune_step = -1;
        }
        struct kiln_ckpt_file files[2];
        int n = group_files(w, files);
        if (rc)
            w->part.write_rc = rc;
        else
            kiln_ckpt_group_write(&w->part, files, n, &w->err);
        atomic_store(&w->files_done, 1);
        return NULL;
    }
    struct kiln_ckpt_file files[2] = {{"model.safetensors", w->model, w->pt->n},
                                      {"optim.safetensors", w->optim, 2 * w->pt->n}};
    w->rc = kiln_ckpt_save(w->run_dir, w->step, files, 2, w->state, &w->policy, &w->err);
    cJSON_Delete(w->state);
    w->state = NULL;
    w->write_ms = (kiln_now_s() - t0) * 1e3;
    return NULL;
}

static void set_tensor(struct kiln_st_tensor *t, const char *name, const struct kiln_param *p,
                       const float *base) {
    *t = (struct kiln_st_tensor){
        .name = name, .dtype = KILN_ST_F32, .ndim = p->ndim, .data = base + p->offset};
    t->shape[0] = p->shape[0];
    t->shape[1] = p->shape[1];
}

static void *prefault_main(void *arg) {
    struct kiln_ckpt_writer *w = arg;
    size_t bytes = w->pt->total * sizeof(float);
    memset(w->params, 0, bytes);
    memset(w->m, 0, bytes);
    memset(w->v, 0, bytes);
    return NULL;
}

static void prefault_join(struct kiln_ckpt_writer *w) {
    if (w->prefaulting) {
        pthread_join(w->prefault, NULL);
        w->prefaulting = 0;
    }
}

void kiln_ckpt_writer_create(struct kiln_ckpt_writer **out, const char *run_dir,
                             const struct kiln_param_table *pt, const struct kiln_ckpt_policy *policy,
                             struct kiln_backend *be) {
    struct kiln_ckpt_writer *w = kiln_xcalloc(1, sizeof(*w));
    w->prune_step = -1;
    snprintf(w->run_dir, sizeof(w->run_dir), "%s", run_dir);
    w->pt = pt;
    w->policy = *policy;
    w->be = be;
    // The snapshot lives in memory the backend downloads into fastest (page-locked on CUDA: the step loop
    // waits only for these copies), or in ordinary memory when that cannot be had.
    size_t bytes = pt->total * sizeof(float);
    if (be && be->ops->host_alloc) {
        w->params = be->ops->host_alloc(be->ctx, bytes);
        w->m = w->params ? be->ops->host_alloc(be->ctx, bytes) : NULL;
        w->v = w->m ? be->ops->host_alloc(be->ctx, bytes) : NULL;
        w->pinned = w->v != NULL;
        if (!w->pinned) {
            if (w->params)
                be->ops->host_free(be->ctx, w->params);
            if (w->m)
                be->ops->host_free(be->ctx, w->m);
        }
    }
    if (!w->pinned) {
        w->params = kiln_xmalloc(bytes);
        w->m = kiln_xmalloc(bytes);
        w->v = kiln_xmalloc(bytes);
    }
    // Fresh host memory pays a page fault per page on first touch: 1.5 GB took ~5 s on the 2-core machine,
    // which the first checkpoint would otherwise spend inside the step loop. Touch it now, in the background.
    w->prefaulting = pthread_create(&w->prefault, NULL, prefault_main, w) == 0;
    w->model = kiln_xcalloc((size_t)pt->n, sizeof(*w->model));
    w->optim = kiln_xcalloc(2 * (size_t)pt->n, sizeof(*w->optim));
    w->optim_names = kiln_xcalloc(2 * (size_t)pt->n, sizeof(*w->optim_names));
    for (int i = 0; i < pt->n; i++) {
        const struct kiln_param *p = &pt->p[i];
        snprintf(w->optim_names[2 * i], sizeof(w->optim_names[0]), "m.%s", p->name);
        snprintf(w->optim_names[2 * i + 1], sizeof(w->optim_names[0]), "v.%s", p->name);
        set_tensor(&w->model[i], p->name, p, w->params);
        set_tensor(&w->optim[2 * i], w->optim_names[2 * i], p, w->m);
        set_tensor(&w->optim[2 * i + 1], w->optim_names[2 * i + 1], p, w->v);
    }
    *out = w;
}

static void thread_join(struct kiln_ckpt_writer *w) {
    if (w->running) {
        pthread_join(w->thread, NULL);
        w->running = 0;
    }
}

int kiln_ckpt_writer_busy(const struct kiln_ckpt_writer *w) {
    return w->awaiting && !atomic_load(&w->files_done);
}

int kiln_ckpt_writer_awaiting(const struct kiln_ckpt_writer *w) {
    return w->awaiting;
}

int kiln_ckpt_writer_commit(struct kiln_ckpt_writer *w, struct kiln_error *err) {
    if (!w->awaiting)
        return 0;
    thread_join(w);
    w->awaiting = 0;
    int rc = kiln_ckpt_group_finish(&w->part, w->run_dir, w->state, &w->policy, &w->grp, &w->err);
    if (!rc && w->grp.rank == 0)
        w->prune_step = w->part.step;
    cJSON_Delete(w->state);
    w->state = NULL;
    w->write_ms = (kiln_now_s() - w->began_s) * 1e3;
    if (rc && err)
        *err = w->err;
    return rc;
}

void kiln_ckpt_writer_abandon(struct kiln_ckpt_writer *w) {
    thread_join(w);
    if (w->awaiting) { // never installed: the previous checkpoint stays the newest
        w->awaiting = 0;
        cJSON_Delete(w->state);
        w->state = NULL;
    }
}

// The write in flight, done: a group's committed (collective), a one-process write joined; with prune_now,
// rank 0's deferred pruning too (start leaves it to the next write's thread).
static int settle(struct kiln_ckpt_writer *w, int prune_now, struct kiln_error *err) {
    int rc = 0;
    if (w->awaiting) {
        rc = kiln_ckpt_writer_commit(w, err); // (joins the thread)
    } else if (w->running) {
        thread_join(w);
        if ((rc = w->rc) && err)
            *err = w->err;
        w->rc = 0;
    }
    if (prune_now && w->prune_step >= 0) {
        int prc = kiln_ckpt_prune(w->run_dir, w->prune_step, &w->policy, &w->err);
        w->prune_step = -1;
        if (prc && !rc) {
            rc = prc;
            if (err)
                *err = w->err;
        }
    }
    return rc;
}

int kiln_ckpt_writer_join(struct kiln_ckpt_writer *w, double *wait_ms, struct kiln_error *err) {
    double t0 = kiln_now_s();
    int rc = settle(w, 1, err);
    if (wait_ms)
        *wait_ms = (kiln_now_s() - t0) * 1e3;
    return rc;
}

int kiln_ckpt_writer_start(struct kiln_ckpt_writer *w, struct kiln_optim_state *st, int64_t step,
                           cJSON *state, double *stall_ms, struct kiln_error *err) {
    double t0 = kiln_now_s();
    int rc = settle(w, 0, err);
    if (rc) {
        cJSON_Delete(state);
        return rc;
    }
    prefault_join(w);
    if (w->dp) {
        // the weights (every rank's master copy is whole again after kiln_dp_gather_master), and this rank's
        // ranges of the moments, compact
        kiln_dp_get_master(w->dp, w->params);
        if (w->tp) // every part of the weights, whole on rank 0 (collective over the group, on this thread)
            kiln_tp_gather_whole(w->tp, w->pt, w->params, w->whole, w->whole_params);
        int n;
        const struct kiln_dp_range *r = kiln_dp_ranges(w->dp, &n);
        int zero = kiln_dp_zero(w->dp);
        for (int i = 0; i < n; i++) { // the state holds them compact under ZeRO, flat under DDP
            size_t from = zero ? r[i].state_offset : r[i].lo, k = r[i].hi - r[i].lo;
            kiln_optim_state_get_moments(st, from, k, w->m + r[i].state_offset, w->v + r[i].state_offset);
        }
        int nb;
        const size_t *bounds = kiln_dp_bucket_bounds(w->dp, &nb);
        cJSON *lay = cJSON_AddObjectToObject(state, "optim_layout");
        cJSON_AddNumberToObject(lay, "world", w->grp.size);
        cJSON_AddNumberToObject(lay, "zero", zero);
        if (w->tp) // the files hold the ranges of each part's table (read_optim_shards)
            cJSON_AddNumberToObject(lay, "tp", kiln_tp_comm(w->tp)->size);
        cJSON *jb = cJSON_AddArrayToObject(lay, "bucket_bounds");
        for (int i = 0; i <= nb; i++)
            cJSON_AddItemToArray(jb, cJSON_CreateNumber((double)bounds[i]));
        // the layout is part of what state_sha256 covers
        char hex[65];
        cJSON_DeleteItemFromObjectCaseSensitive(state, "state_sha256");
        state_hash(state, hex);
        cJSON_AddStringToObject(state, "state_sha256", hex);
    } else {
        // downloads synchronize: the snapshot is complete on return
        kiln_optim_state_get_master(st, 0, w->pt->total, w->params);
        kiln_optim_state_get_moments(st, 0, w->pt->total, w->m, w->v);
    }
    w->step = step;
    w->state = state;
    w->rc = 0;
    if (w->dp) { // the save's first collectives here, on the training thread
        struct kiln_ckpt_file files[2];
        int n = group_files(w, files);
        w->began_s = kiln_now_s();
        atomic_store(&w->files_done, 0);
        if ((rc = kiln_ckpt_group_begin(&w->part, w->run_dir, step, files, n, state, &w->grp, &w->err))) {
            *err = w->err;
            cJSON_Delete(state);
            w->state = NULL;
            return rc;
        }
        w->part.defer_prune = 1;
        w->awaiting = 1;
    }
    if (pthread_create(&w->thread, NULL, writer_main, w)) {
        writer_main(w);         // no thread to be had: write in the foreground
        rc = w->dp ? 0 : w->rc; // (a group's write reports at its commit)
        if (rc)
            *err = w->err;
    } else {
        w->running = 1;
    }
    if (stall_ms)
        *stall_ms = (kiln_now_s() - t0) * 1e3;
    return rc;
}

double kiln_ckpt_writer_last_write_ms(const struct kiln_ckpt_writer *w) {
    return w->write_ms;
}

static int grp_agree(void *user, int rc) {
    struct kiln_comm *c = user;
    int32_t x = rc;
    kiln_comm_all_reduce_host(c, &x, 1, KILN_I32, KILN_RED_MAX);
    return x;
}

static void grp_broadcast(void *user, void *buf, size_t bytes) {
    kiln_comm_broadcast_host(user, buf, bytes, 0);
}

static void grp_all_gather(void *user, const void *mine, void *all, size_t bytes) {
    kiln_comm_all_gather_host(user, mine, all, bytes);
}

void kiln_ckpt_writer_create_group(struct kiln_ckpt_writer **out, const char *run_dir,
                                   const struct kiln_param_table *pt, const struct kiln_ckpt_policy *policy,
                                   struct kiln_backend *be, struct kiln_dp *dp, struct kiln_comm *ckpt_comm) {
    kiln_ckpt_writer_create(out, run_dir, pt, policy, be);
    struct kiln_ckpt_writer *w = *out;
    w->dp = dp;
    w->comm = ckpt_comm;
    w->grp = (struct kiln_ckpt_group){.rank = ckpt_comm->rank,
                                      .size = ckpt_comm->size,
                                      .user = ckpt_comm,
                                      .agree = grp_agree,
                                      .broadcast = grp_broadcast,
                                      .all_gather = grp_all_gather};
    int n;
    const struct kiln_dp_range *r = kiln_dp_ranges(dp, &n);
    w->shard_elems = n ? r[n - 1].state_offset + (r[n - 1].hi - r[n - 1].lo) : 0;
    snprintf(w->shard_name, sizeof(w->shard_name), "optim-%05d-of-%05d.safetensors", w->grp.rank,
             w->grp.size);
    // the moments' snapshot buffers hold total floats: the shard fits (it is at most the whole)
    w->shard[0] = (struct kiln_st_tensor){.name = "m", .dtype = KILN_ST_F32, .ndim = 1, .data = w->m};
    w->shard[0].shape[0] = (int64_t)w->shard_elems;
    w->shard[1] = (struct kiln_st_tensor){.name = "v", .dtype = KILN_ST_F32, .ndim = 1, .data = w->v};
    w->shard[1].shape[0] = (int64_t)w->shard_elems;
}

void kiln_ckpt_writer_set_tp(struct kiln_ckpt_writer *w, struct kiln_tp *tp, const struct kiln_param_table *whole) {
    w->tp = tp;
    w->whole = whole;
    w->whole_params = w->grp.rank == 0 ? kiln_xcalloc(whole->total, sizeof(float)) : NULL;
    free(w->model);
    w->model = kiln_xcalloc((size_t)whole->n, sizeof(*w->model));
    for (int i = 0; i < whole->n; i++)
        set_tensor(&w->model[i], whole->p[i].name, &whole->p[i], w->whole_params ? w->whole_params : w->params);
}

void kiln_ckpt_writer_set_delay(struct kiln_ckpt_writer *w, int delay_ms) {
    w->delay_ms = delay_ms;
}

void kiln_ckpt_writer_free(struct kiln_ckpt_writer *w) {
    if (!w)
        return;
    prefault_join(w);
    kiln_ckpt_writer_abandon(w); // (a commit is collective: the caller's join, where every rank makes it)
    float *bufs[3] = {w->params, w->m, w->v};
    for (int i = 0; i < 3; i++) {
        if (w->pinned)
            w->be->ops->host_free(w->be->ctx, bufs[i]);
        else
            free(bufs[i]);
    }
    free(w->model);
    free(w->optim);
    free(w->optim_names);
    free(w->whole_params);
    free(w);
}
