// The training loop. See trainer.h.
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "io/fsutil.h"
#include "model/gpt.h"
#include "train/model_io.h"
#include "train/embedded.h"
#include "train/guards.h"
#include "train/schedule.h"
#include "train/train_ckpt.h"
#include "util/progress.h"
#include "util/rng.h"

struct run_data {
    struct kiln_tokenizer *tok;
    struct kiln_loader *train, *val;
    struct kiln_ids ids; // in-memory tokens (embedded text); the loaders borrow from here
};

static void run_data_free(struct run_data *d) {
    if (d->train)
        kiln_loader_close(d->train);
    if (d->val)
        kiln_loader_close(d->val);
    if (d->tok)
        kiln_tokenizer_free(d->tok);
    kiln_ids_free(&d->ids);
}

// The tokenizer, and loaders over shards (--data) or the embedded Tiny Shakespeare split 90/10.
static int open_data(struct kiln_config *cfg, struct run_data *d, struct kiln_error *err) {
    memset(d, 0, sizeof(*d));
    int rc;
    size_t n_text = 0;
    const char *text = NULL;
    if (strcmp(cfg->tokenizer, "char") == 0) {
        if (cfg->data[0] && strcmp(cfg->data, "random"))
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "tokenizer char (--tokenizer) trains on the embedded text only; "
                               "shards given with --data need --tokenizer=gpt2");
        text = kiln_embedded_shakespeare(&n_text);
        d->tok = kiln_chartok_from_text(text, n_text);
    } else if ((rc = kiln_tokenizer_open(&d->tok, cfg->tokenizer, NULL, err))) {
        return rc;
    }
    cfg->model.vocab_size = kiln_tokenizer_vocab_size(d->tok);

    struct kiln_loader_opts lo = {.B = cfg->batch_size,
                                  .T = cfg->seq_len,
                                  .seed = cfg->seed,
                                  .rank = 0,
                                  .world = 1,
                                  .shuffle = 1,
                                  .prefetch = 1,
                                  .vocab_size = cfg->model.vocab_size};
    struct kiln_loader_opts vo = lo;
    vo.shuffle = 0;
    vo.prefetch = 0;
    if (strcmp(cfg->data, "random") == 0) {
        // uniformly random tokens, as the PyTorch baseline trains on: for throughput benchmarks
        size_t n = (size_t)cfg->batch_size * cfg->seq_len * 64 + 1;
        struct kiln_rng r;
        kiln_rng_seed(&r, cfg->seed);
        for (size_t i = 0; i < n; i++)
            kiln_ids_push(&d->ids, (int32_t)(kiln_rng_u64(&r) % (uint64_t)cfg->model.vocab_size));
        return kiln_loader_open_memory(&d->train, d->ids.data, n, &lo, err);
    }
    if (cfg->data[0]) {
        if ((rc = kiln_loader_open_files(&d->train, cfg->data, &lo, err)))
            return rc;
        if (cfg->val_data[0] && (rc = kiln_loader_open_files(&d->val, cfg->val_data, &vo, err)))
            return rc;
        return 0;
    }
    if (!text)
        text = kiln_embedded_shakespeare(&n_text);
    if ((rc = kiln_tokenizer_encode(d->tok, text, n_text, &d->ids, err)))
        return rc;
    size_t n_val = (size_t)(d->ids.n * cfg->val_fraction), n_train = d->ids.n - n_val;
    size_t need = (size_t)cfg->seq_len + 1;
    if (n_val < need || n_train < need)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "seq %d is longer than the data (--seq): the embedded text has %zu "
                           "training and %zu validation tokens",
                           cfg->seq_len, n_train, n_val);
    if ((rc = kiln_loader_open_memory(&d->train, d->ids.data, n_train, &lo, err)))
        return rc;
    return kiln_loader_open_memory(&d->val, d->ids.data + n_train, n_val, &vo, err);
}

// ----------------------------------------------------------------------------
// run directory

static int write_config(const struct kiln_config *cfg, struct kiln_error *err) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/config", cfg->out);
    FILE *f = fopen(path, "w");
    if (!f)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: %s", path, strerror(errno));
    kiln_config_write(cfg, f);
    return fclose(f) ? kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: %s", path, strerror(errno)) : 0;
}

// The char tokenizer's vocabulary, one byte per id, so `kiln sample` decodes exactly as training encoded.
static int write_vocab(const struct kiln_config *cfg, struct kiln_tokenizer *tok, struct kiln_error *err) {
    const char *chars;
    size_t n;
    if (kiln_tokenizer_vocab_string(tok, &chars, &n))
        return 0; // not a char tokenizer
    char path[1200];
    snprintf(path, sizeof(path), "%s/vocab.char", cfg->out);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(chars, 1, n, f) != n || fclose(f))
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

// ----------------------------------------------------------------------------
// evaluation

static double evaluate(struct kiln_gpt *g, struct kiln_loader *val, const struct kiln_config *cfg,
                       int32_t *in, int32_t *tgt) {
    kiln_loader_reset(val);
    uint64_t windows = kiln_loader_num_windows(val);
    int batches = cfg->eval_steps;
    if ((uint64_t)batches * cfg->batch_size > windows)
        batches = (int)(windows / cfg->batch_size);
    if (batches < 1)
        batches = 1;
    double sum = 0;
    for (int i = 0; i < batches; i++) {
        kiln_loader_next(val, in, tgt);
        sum += kiln_gpt_forward(g, in, tgt, 0.0f, 0.0f);
    }
    return sum / batches;
}

// ----------------------------------------------------------------------------
// signals, fault injection

static volatile sig_atomic_t stop_requested = 0;

void kiln_train_request_stop(int signo) {
    stop_requested = signo;
}

// --inject-nan=STEP,STEP,...: sorted 1-based step numbers; 0-terminated
static int parse_step_list(const char *s, int64_t **out, struct kiln_error *err) {
    size_t cap = 8, n = 0;
    int64_t *v = kiln_xmalloc(cap * sizeof(*v));
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 1 || (*end && *end != ',')) {
            free(v);
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "bad value '%s' for inject-nan (--inject-nan): expected step "
                               "numbers >= 1 separated by commas",
                               s);
        }
        if (n + 2 > cap)
            v = realloc(v, (cap *= 2) * sizeof(*v));
        KILN_ASSERT(v);
        v[n++] = x;
        p = *end ? end + 1 : end;
    }
    v[n] = 0;
    *out = v;
    return 0;
}

static int in_step_list(const int64_t *list, int64_t step) {
    for (; list && *list; list++)
        if (*list == step)
            return 1;
    return 0;
}

// ----------------------------------------------------------------------------
// resume

static void report_skip(const char *path, const char *why) {
    fprintf(stderr, "kiln: checkpoint %s is unusable (%s): falling back to the previous one\n", path, why);
}

// Loads one checkpoint into the model, loader, guards and state. Returns 0, an error, or -2 after a usage
// error (a different model), which must not fall back.
static int resume_from(const char *dir, struct kiln_config *cfg, struct kiln_gpt *g,
                       struct kiln_loader *train, struct kiln_guards *guards, struct kiln_train_state *st,
                       struct kiln_error *err) {
    struct kiln_ckpt ck;
    memset(&ck, 0, sizeof(ck));
    int rc = kiln_ckpt_load(dir, &ck, err);
    char *changes = NULL;
    if (!rc) // first: it checks state.json's own hash
        rc = kiln_train_state_from_json(ck.state, st, err);
    if (!rc && (rc = kiln_resume_check_config(ck.state, cfg, &changes, err)) == KILN_ERR_USAGE) {
        kiln_ckpt_close(&ck);
        return -2;
    }
    if (!rc)
        rc = kiln_guards_from_json(guards, cJSON_GetObjectItemCaseSensitive(ck.state, "guards"), err);
    if (!rc)
        rc = kiln_ckpt_apply(&ck, g, err);
    if (!rc && (rc = kiln_loader_set_state(train, &st->loader, err)))
        rc = -2; // other data or T: falling back would not help
    if (!rc)     // printed also with --quiet: where a run continues from belongs in every log
        fprintf(stderr, "kiln: resuming from %s (step %lld)\n", dir, (long long)st->step);
    if (!rc && changes[0]) {
        for (char *save = NULL, *l = strtok_r(changes, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
            fprintf(stderr, "kiln: resume: %s\n", l);
    }
    free(changes);
    kiln_ckpt_close(&ck);
    return rc;
}

// 0 = resumed, KILN_CKPT_NONE = start fresh, else an error.
static int resume(struct kiln_config *cfg, struct kiln_gpt *g, struct kiln_loader *train,
                  struct kiln_guards *guards, struct kiln_train_state *st, struct kiln_error *err) {
    if (!strcmp(cfg->resume, "auto") || !strcmp(cfg->resume, "never")) {
        if (!cfg->out[0])
            return KILN_CKPT_NONE;
        char **paths = NULL;
        int64_t *steps = NULL;
        int n = kiln_ckpt_list(cfg->out, &paths, &steps, err), rc = KILN_CKPT_NONE;
        if (n < 0)
            return KILN_ERR_RUNTIME;
        if (n > 0 && !strcmp(cfg->resume, "never"))
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "%s already holds checkpoints (--resume=never): use another --out, "
                             "or delete %s/ckpt to start over",
                             cfg->out, cfg->out);
        for (int i = 0; i < n && rc == KILN_CKPT_NONE; i++) {
            struct kiln_error e = {0};
            int r = resume_from(paths[i], cfg, g, train, guards, st, &e);
            if (r == 0 || r == -2) {
                rc = r ? e.code : 0;
                *err = e;
            } else {
                report_skip(paths[i], e.msg);
            }
        }
        if (rc == KILN_CKPT_NONE && n > 0)
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "none of the %d checkpoints in %s/ckpt is usable (--resume=auto): "
                             "kiln will not start over and prune them; move them away or use another --out",
                             n, cfg->out);
        for (int i = 0; i < n; i++)
            free(paths[i]);
        free(paths);
        free(steps);
        return rc;
    }
    if (!cfg->out[0])
        return kiln_errorf(err, KILN_ERR_USAGE, "--resume=%s needs --out, the run directory to continue in",
                           cfg->resume);
    int r = resume_from(cfg->resume, cfg, g, train, guards, st, err);
    return r == -2 ? err->code : r;
}

// ----------------------------------------------------------------------------
// the loop

struct step_log {
    int64_t step; // 1-based
    double loss, norm, tok_s, ms, val_loss, ckpt_stall_ms, prev_ckpt_write_ms;
    float lr;
    enum kiln_skip skipped;
};

static void write_metrics(FILE *f, const struct step_log *s, const struct kiln_guards *gd, size_t mem_bytes,
                          double mfu, double mfu_causal, double hfu) {
    fprintf(f,
            "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens_per_s\":%.1f,\"ms\":%.3f,"
            "\"peak_mem_bytes\":%zu",
            (long long)s->step, s->loss, (double)s->lr, s->norm, s->tok_s, s->ms, mem_bytes);
    if (mfu > 0)
        fprintf(f, ",\"mfu\":%.4f,\"mfu_causal\":%.4f", mfu, mfu_causal);
    if (hfu > 0) // with recompute: model FLOPs plus the recomputed forward work
        fprintf(f, ",\"hfu\":%.4f", hfu);
    if (!isnan(s->val_loss))
        fprintf(f, ",\"val_loss\":%.6f", s->val_loss);
    if (s->skipped)
        fprintf(f, ",\"skipped\":\"%s\"", kiln_skip_name(s->skipped));
    if (gd->skipped_total)
        fprintf(f,
                ",\"skipped_steps\":%lld,\"skipped_nan\":%lld,\"skipped_spike_loss\":%lld,"
                "\"skipped_spike_grad\":%lld",
                (long long)gd->skipped_total, (long long)gd->skipped[KILN_SKIP_NAN],
                (long long)gd->skipped[KILN_SKIP_SPIKE_LOSS], (long long)gd->skipped[KILN_SKIP_SPIKE_GRAD]);
    if (!isnan(s->ckpt_stall_ms))
        fprintf(f, ",\"ckpt_stall_ms\":%.3f", s->ckpt_stall_ms);
    if (s->prev_ckpt_write_ms > 0) // the background write of the previous checkpoint, finished by now
        fprintf(f, ",\"prev_ckpt_write_ms\":%.3f", s->prev_ckpt_write_ms);
    fprintf(f, "}\n");
    fflush(f);
}

static int open_metrics(const struct kiln_config *cfg, int64_t resumed_step, FILE **out,
                        struct kiln_error *err) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", cfg->out);
    int rc;
    // a killed run may have logged steps past its last checkpoint: those lines go, the rest is appended to
    if (resumed_step > 0 && (rc = kiln_metrics_truncate(path, resumed_step, err)))
        return rc;
    if (!(*out = fopen(path, resumed_step > 0 ? "a" : "w")))
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

int kiln_train(struct kiln_config *cfg, struct kiln_train_result *res, struct kiln_error *err) {
    memset(res, 0, sizeof(*res));
    res->final_val_loss = NAN;
    struct run_data data;
    int rc = open_data(cfg, &data, err);
    if (rc) {
        run_data_free(&data);
        return rc;
    }
    int64_t *nan_steps = NULL;
    if ((rc = kiln_config_validate(cfg, err)) || (rc = parse_step_list(cfg->inject_nan, &nan_steps, err))) {
        run_data_free(&data);
        return rc;
    }

    struct kiln_backend be;
    const char *device = kiln_backend_resolve(cfg->device);
    struct kiln_backend_opts bo = {.device_index = 0,
                                   .deterministic = cfg->deterministic,
                                   .threads = cfg->threads,
                                   .grad_dtype = kiln_config_grad_dtype(cfg, device)};
    if ((rc = kiln_backend_open(device, &bo, &be, err))) {
        run_data_free(&data);
        free(nan_steps);
        return rc;
    }
    struct kiln_gpt *g = NULL;
    struct kiln_gpt_opts go = {
        .B = cfg->batch_size, .T = cfg->seq_len, .recompute = cfg->recompute, .training = 1};
    if ((rc = kiln_gpt_create(&g, &cfg->model, &be, &go, err))) {
        kiln_backend_close(&be);
        run_data_free(&data);
        free(nan_steps);
        return rc;
    }
    kiln_gpt_init_params(g, cfg->seed);
    const struct kiln_param_table *pt = kiln_gpt_params(g);

    struct kiln_guards guards;
    kiln_guards_init(&guards, cfg->spike_z, cfg->spike_window, cfg->max_bad_steps);
    struct kiln_train_state st = {0};
    struct kiln_ckpt_writer *writer = NULL;
    FILE *metrics = NULL;
    int32_t *in = NULL, *tgt = NULL;
    stop_requested = 0;

    rc = resume(cfg, g, data.train, &guards, &st, err);
    if (rc == KILN_CKPT_NONE)
        rc = 0;
    if (rc)
        goto done;
    res->start_step = (int)st.step;
    res->steps = (int)st.step;
    res->skipped_steps = (int)guards.skipped_total;
    if (cfg->out[0]) {
        if ((rc = kiln_mkdir_p(cfg->out, err)) || (rc = write_config(cfg, err)) ||
            (rc = write_vocab(cfg, data.tok, err)) || (rc = open_metrics(cfg, st.step, &metrics, err)))
            goto done;
        struct kiln_ckpt_policy policy = {.keep_last = cfg->keep_last, .keep_every = cfg->keep_every};
        if (cfg->checkpoint)
            kiln_ckpt_writer_create(&writer, cfg->out, pt, &policy, &be);
    }

    int B = cfg->batch_size, T = cfg->seq_len;
    long bt = (long)B * T;
    int accum = kiln_config_micro_steps(cfg);
    double tokens_per_step = (double)bt * accum;
    double peak = cfg->peak_flops > 0 ? cfg->peak_flops : be.peak_flops;
    double fpt = kiln_model_flops_per_token(&cfg->model, pt->n_params, T, 0);
    double fpt_causal = kiln_model_flops_per_token(&cfg->model, pt->n_params, T, 1);
    double fpt_recompute = kiln_model_recompute_flops_per_token(&cfg->model, cfg->recompute, T);
    in = kiln_xmalloc((size_t)bt * sizeof(int32_t));
    tgt = kiln_xmalloc((size_t)bt * sizeof(int32_t));

    if (!cfg->quiet) {
        fprintf(stderr, "kiln: %s | %.2fM params | %s (%s) | B=%d T=%d accum=%d | grads %s | %d steps\n",
                cfg->preset, pt->n_params / 1e6, be.name, be.device_name, B, T, accum,
                kiln_dtype_name(be.grad_dtype), cfg->max_steps);
    }
    struct kiln_progress prog;
    kiln_progress_begin(&prog, cfg->max_steps, !cfg->quiet);
    double timed_s = 0;
    long timed_tokens = 0;
    const int64_t start = st.step;
    int64_t last_ckpt_step = start > 0 ? start : -1;
    for (int64_t step = start; step < cfg->max_steps; step++) {
        if (cfg->inject_crash && step + 1 == cfg->inject_crash && start == 0) {
            // the checkpoint in flight completes first, so that tests know where the run resumes (kills at
            // random moments, during writes too, are tested with SIGKILL)
            if (writer)
                kiln_ckpt_writer_join(writer, NULL, NULL);
            fprintf(stderr, "kiln: --inject-crash=%d: aborting before step %d (testing)\n", cfg->inject_crash,
                    cfg->inject_crash);
            abort();
        }
        double t0 = kiln_now_s();
        float lr = kiln_lr_at(cfg, (int)step);
        kiln_gpt_zero_grad(g);
        double loss = 0;
        for (int micro = 0; micro < accum; micro++) {
            kiln_loader_next(data.train, in, tgt);
            loss += kiln_gpt_forward(g, in, tgt, (float)(1.0 / tokens_per_step), cfg->z_loss) / accum;
            kiln_gpt_backward(g);
        }
        double norm = kiln_gpt_grad_norm(g);
        if (in_step_list(nan_steps, step + 1))
            loss = norm = NAN;
        enum kiln_skip why = kiln_guards_check(&guards, loss, norm);
        if (why == KILN_SKIP_NONE) {
            st.opt_step++; // AdamW's bias correction counts applied updates only
            struct kiln_adamw_hparams h = {.lr = lr,
                                           .beta1 = cfg->beta1,
                                           .beta2 = cfg->beta2,
                                           .eps = cfg->eps,
                                           .weight_decay = cfg->weight_decay,
                                           .grad_clip = cfg->grad_clip,
                                           .grad_scale = 1.0f,
                                           .step = (int)st.opt_step,
                                           .stochastic_rounding = cfg->stochastic_rounding,
                                           .seed = cfg->seed};
            kiln_gpt_adamw(g, &h, norm);
        }
        st.step = step + 1;
        st.tokens += (uint64_t)tokens_per_step;
        be.ops->synchronize(be.ctx);
        double dt = kiln_now_s() - t0;
        if (step > start) { // the first step pays one-time costs
            timed_s += dt;
            timed_tokens += (long)tokens_per_step;
        }
        struct step_log sl = {.step = st.step,
                              .loss = loss,
                              .norm = norm,
                              .tok_s = tokens_per_step / dt,
                              .ms = dt * 1e3,
                              .val_loss = NAN,
                              .ckpt_stall_ms = NAN,
                              .lr = lr,
                              .skipped = why};
        res->final_loss = loss;
        res->steps = (int)st.step;
        res->skipped_steps = (int)guards.skipped_total;
        if (why) {
            char line[256];
            if (why == KILN_SKIP_NAN)
                snprintf(line, sizeof(line),
                         "step %lld: update skipped: non-finite loss %g or grad norm %g (%d in a "
                         "row, %lld skipped in all)",
                         (long long)st.step, loss, norm, guards.consecutive, (long long)guards.skipped_total);
            else
                snprintf(line, sizeof(line),
                         "step %lld: update skipped: %s spike, z = %.1f > %g (loss %.4f, grad "
                         "norm %.4g; %d in a row, %lld skipped in all)",
                         (long long)st.step, why == KILN_SKIP_SPIKE_LOSS ? "loss" : "grad-norm",
                         guards.last_z, (double)cfg->spike_z, loss, norm, guards.consecutive,
                         (long long)guards.skipped_total);
            kiln_progress_note(&prog, line);
        }
        if (kiln_guards_exhausted(&guards)) {
            if (metrics)
                write_metrics(metrics, &sl, &guards, kiln_gpt_mem_peak(g), 0, 0, 0);
            kiln_progress_end(&prog);
            struct kiln_error we;
            if (writer && kiln_ckpt_writer_join(writer, NULL, &we))
                fprintf(stderr, "kiln: the last checkpoint write failed too: %s\n", we.msg);
            rc = kiln_errorf(
                err, KILN_ERR_RUNTIME,
                "training stopped at step %lld (--max-bad-steps=%d): %d steps in a "
                "row were skipped, the last for %s; the newest checkpoint (step %lld) holds the last good "
                "state; lower --lr, raise --spike-z or check the data, then resume",
                (long long)st.step, cfg->max_bad_steps, guards.consecutive, kiln_skip_name(why),
                (long long)(last_ckpt_step > 0 ? last_ckpt_step : 0));
            goto done;
        }

        int last = st.step == cfg->max_steps;
        if (data.val && ((cfg->eval_every && st.step % cfg->eval_every == 0) || last)) {
            sl.val_loss = evaluate(g, data.val, cfg, in, tgt);
            res->final_val_loss = sl.val_loss;
            char line[160];
            snprintf(line, sizeof(line), "step %lld: val loss %.4f", (long long)st.step, sl.val_loss);
            kiln_progress_note(&prog, line);
        }
        int stop = stop_requested;
        // A checkpoint at its cadence (not in the middle of a run of skipped steps: those are not progress,
        // and a run stopped by --max-bad-steps keeps its last good checkpoint), at the end, and on a stop
        // signal.
        int due =
            (cfg->ckpt_every && st.step % cfg->ckpt_every == 0 && guards.consecutive == 0) || last || stop;
        if (writer && due) {
            kiln_loader_get_state(data.train, &st.loader);
            cJSON *state = kiln_train_state_to_json(&st, cfg, &guards, kiln_lr_at(cfg, (int)st.step));
            if ((rc = kiln_ckpt_writer_start(writer, g, st.step, state, &sl.ckpt_stall_ms, err)))
                goto done;
            sl.prev_ckpt_write_ms = kiln_ckpt_writer_last_write_ms(writer);
            last_ckpt_step = st.step;
            res->checkpoints++;
            if (sl.ckpt_stall_ms > res->max_ckpt_stall_ms)
                res->max_ckpt_stall_ms = sl.ckpt_stall_ms;
        }
        if (metrics && (st.step % cfg->log_every == 0 || last || !isnan(sl.val_loss) || why || stop || due)) {
            double tok_s = sl.tok_s;
            write_metrics(metrics, &sl, &guards, kiln_gpt_mem_peak(g),
                          peak > 0 ? fpt * tok_s / peak : 0, peak > 0 ? fpt_causal * tok_s / peak : 0,
                          peak > 0 && fpt_recompute > 0 ? (fpt + fpt_recompute) * tok_s / peak : 0);
        }
        char extra[160] = "";
        int n = 0;
        if (peak > 0)
            n = snprintf(extra, sizeof(extra), "MFU %.1f%% (causal %.1f%%) | ", 100.0 * fpt * sl.tok_s / peak,
                         100.0 * fpt_causal * sl.tok_s / peak);
        n += snprintf(extra + n, sizeof(extra) - (size_t)n, "mem %.2f GiB",
                      (double)kiln_gpt_mem_peak(g) / (1 << 30));
        if (!isnan(sl.ckpt_stall_ms))
            snprintf(extra + n, sizeof(extra) - (size_t)n, "%sckpt stall %.1fms", n ? " | " : "",
                     sl.ckpt_stall_ms);
        kiln_progress_update(&prog, (int)st.step, loss, sl.tok_s, extra[0] ? extra : NULL);
        if (stop) {
            res->stop_signal = stop;
            break;
        }
    }
    kiln_progress_end(&prog);
    res->tokens_per_s = timed_s > 0 ? timed_tokens / timed_s : 0;
    if (writer && (rc = kiln_ckpt_writer_join(writer, NULL, err)))
        goto done;
    if (cfg->out[0] && !res->stop_signal) {
        float *host = kiln_xmalloc(pt->total * sizeof(float));
        kiln_gpt_get_params(g, host);
        char path[1200];
        snprintf(path, sizeof(path), "%s/model.safetensors", cfg->out);
        rc = kiln_write_model_safetensors(path, pt, host, cfg, err);
        free(host);
    }
done:
    if (writer) {
        struct kiln_error we;
        if (kiln_ckpt_writer_join(writer, NULL, &we) && !rc) {
            *err = we;
            rc = we.code;
        }
        kiln_ckpt_writer_free(writer);
    }
    free(in);
    free(tgt);
    free(nan_steps);
    if (metrics)
        fclose(metrics);
    kiln_guards_free(&guards);
    kiln_gpt_free(g);
    kiln_backend_close(&be);
    run_data_free(&data);
    return rc;
}
