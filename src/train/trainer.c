// The training loop. See trainer.h.
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "io/fsutil.h"
#include "model/gpt.h"
#include "train/model_io.h"
#include "train/embedded.h"
#include "train/schedule.h"
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
            return kiln_errorf(err, KILN_ERR_USAGE, "tokenizer char (--tokenizer) trains on the embedded text only; "
                               "shards given with --data need --tokenizer=gpt2");
        text = kiln_embedded_shakespeare(&n_text);
        d->tok = kiln_chartok_from_text(text, n_text);
    } else if ((rc = kiln_tokenizer_open(&d->tok, cfg->tokenizer, NULL, err))) {
        return rc;
    }
    cfg->model.vocab_size = kiln_tokenizer_vocab_size(d->tok);

    struct kiln_loader_opts lo = {.B = cfg->batch_size, .T = cfg->seq_len, .seed = cfg->seed, .rank = 0,
                                  .world = 1, .shuffle = 1, .prefetch = 1, .vocab_size = cfg->model.vocab_size};
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
        return kiln_errorf(err, KILN_ERR_USAGE, "seq %d is longer than the data (--seq): the embedded text has %zu "
                           "training and %zu validation tokens", cfg->seq_len, n_train, n_val);
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

static double evaluate(struct kiln_gpt *g, struct kiln_loader *val, const struct kiln_config *cfg, int32_t *in,
                       int32_t *tgt) {
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
// the loop

int kiln_train(struct kiln_config *cfg, struct kiln_train_result *res, struct kiln_error *err) {
    memset(res, 0, sizeof(*res));
    res->final_val_loss = NAN;
    struct run_data data;
    int rc = open_data(cfg, &data, err);
    if (rc) {
        run_data_free(&data);
        return rc;
    }
    if ((rc = kiln_config_validate(cfg, err))) {
        run_data_free(&data);
        return rc;
    }

    struct kiln_backend be;
    struct kiln_backend_opts bo = {.device_index = 0, .deterministic = cfg->deterministic, .threads = cfg->threads};
    if ((rc = kiln_backend_open(cfg->device, &bo, &be, err))) {
        run_data_free(&data);
        return rc;
    }
    struct kiln_gpt *g = NULL;
    struct kiln_gpt_opts go = {.B = cfg->batch_size, .T = cfg->seq_len, .recompute = cfg->recompute, .training = 1};
    if ((rc = kiln_gpt_create(&g, &cfg->model, &be, &go, err))) {
        kiln_backend_close(&be);
        run_data_free(&data);
        return rc;
    }
    kiln_gpt_init_params(g, cfg->seed);
    const struct kiln_param_table *pt = kiln_gpt_params(g);

    FILE *metrics = NULL;
    if (cfg->out[0]) {
        if ((rc = kiln_mkdir_p(cfg->out, err)) || (rc = write_config(cfg, err)) ||
            (rc = write_vocab(cfg, data.tok, err)))
            goto done;
        char path[1200];
        snprintf(path, sizeof(path), "%s/metrics.jsonl", cfg->out);
        if (!(metrics = fopen(path, "w"))) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: %s", path, strerror(errno));
            goto done;
        }
    }

    int B = cfg->batch_size, T = cfg->seq_len;
    long bt = (long)B * T;
    int accum = cfg->total_batch_tokens ? (int)(cfg->total_batch_tokens / bt) : 1;
    double tokens_per_step = (double)bt * accum;
    double peak = cfg->peak_flops > 0 ? cfg->peak_flops : be.peak_flops;
    double fpt = kiln_model_flops_per_token(&cfg->model, pt->n_params, T, 0);
    double fpt_causal = kiln_model_flops_per_token(&cfg->model, pt->n_params, T, 1);
    int32_t *in = kiln_xmalloc((size_t)bt * sizeof(int32_t)), *tgt = kiln_xmalloc((size_t)bt * sizeof(int32_t));

    if (!cfg->quiet) {
        fprintf(stderr, "kiln: %s | %.2fM params | %s (%s) | B=%d T=%d accum=%d | %d steps\n", cfg->preset,
                pt->n_params / 1e6, be.name, be.device_name, B, T, accum, cfg->max_steps);
    }
    struct kiln_progress prog;
    kiln_progress_begin(&prog, cfg->max_steps, !cfg->quiet);
    double timed_s = 0;
    long timed_tokens = 0;
    for (int step = 0; step < cfg->max_steps; step++) {
        double t0 = kiln_now_s();
        float lr = kiln_lr_at(cfg, step);
        kiln_gpt_zero_grad(g);
        double loss = 0;
        for (int micro = 0; micro < accum; micro++) {
            kiln_loader_next(data.train, in, tgt);
            loss += kiln_gpt_forward(g, in, tgt, (float)(1.0 / tokens_per_step), cfg->z_loss) / accum;
            kiln_gpt_backward(g);
        }
        double norm = kiln_gpt_grad_norm(g);
        int skipped = !isfinite(norm) || !isfinite(loss);
        if (skipped) {
            res->skipped_steps++;
        } else {
            struct kiln_adamw_hparams h = {.lr = lr, .beta1 = cfg->beta1, .beta2 = cfg->beta2, .eps = cfg->eps,
                                           .weight_decay = cfg->weight_decay, .grad_clip = cfg->grad_clip,
                                           .grad_scale = 1.0f, .step = step + 1 - res->skipped_steps};
            kiln_gpt_adamw(g, &h, norm);
        }
        be.ops->synchronize(be.ctx);
        double dt = kiln_now_s() - t0;
        if (step > 0) { // the first step pays one-time costs
            timed_s += dt;
            timed_tokens += (long)tokens_per_step;
        }
        double tok_s = tokens_per_step / dt;
        res->final_loss = loss;
        res->steps = step + 1;

        int last = step == cfg->max_steps - 1;
        double val_loss = NAN;
        if (data.val && ((cfg->eval_every && (step + 1) % cfg->eval_every == 0) || last)) {
            val_loss = evaluate(g, data.val, cfg, in, tgt);
            res->final_val_loss = val_loss;
            char line[160];
            snprintf(line, sizeof(line), "step %d: val loss %.4f", step + 1, val_loss);
            kiln_progress_note(&prog, line);
        }
        if (metrics && ((step + 1) % cfg->log_every == 0 || last || !isnan(val_loss))) {
            fprintf(metrics, "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens_per_s\":%.1f,"
                             "\"ms\":%.3f,\"peak_mem_bytes\":%zu",
                    step + 1, loss, (double)lr, norm, tok_s, dt * 1e3, kiln_gpt_mem_plan(g)->total_bytes);
            if (peak > 0)
                fprintf(metrics, ",\"mfu\":%.4f,\"mfu_causal\":%.4f", fpt * tok_s / peak, fpt_causal * tok_s / peak);
            if (!isnan(val_loss))
                fprintf(metrics, ",\"val_loss\":%.6f", val_loss);
            if (res->skipped_steps)
                fprintf(metrics, ",\"skipped_steps\":%d", res->skipped_steps);
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        char extra[96] = "";
        if (peak > 0)
            snprintf(extra, sizeof(extra), "MFU %.1f%%", 100.0 * fpt * tok_s / peak);
        kiln_progress_update(&prog, step + 1, loss, tok_s, extra[0] ? extra : NULL);
    }
    kiln_progress_end(&prog);
    res->tokens_per_s = timed_s > 0 ? timed_tokens / timed_s : 0;

    if (cfg->out[0]) {
        float *host = kiln_xmalloc(pt->total * sizeof(float));
        kiln_gpt_get_params(g, host);
        char path[1200];
        snprintf(path, sizeof(path), "%s/model.safetensors", cfg->out);
        rc = kiln_write_model_safetensors(path, pt, host, cfg, err);
        free(host);
    }
    free(in);
    free(tgt);
done:
    if (metrics)
        fclose(metrics);
    kiln_gpt_free(g);
    kiln_backend_close(&be);
    run_data_free(&data);
    return rc;
}
