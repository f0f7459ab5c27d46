// kiln sample: generate text from a trained run with a KV cache (each new token costs O(T), not O(T^2)).
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "cmd/cmd.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "run/knobs.h"
#include "run/tuning.h"
#include "run/model_io.h"
#include "run/sampler.h"
#include "util/rng.h"

struct sample_opts {
    const char *run;
    const char *prompt;
    int max_tokens;
    float temperature;
    int top_k;
    uint64_t seed;
    const char *device;
};

static int parse_int(const char *v, const char *name, long lo, long hi, long *out, struct kiln_error *err) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for %s (--%s): expected an integer from %ld to %ld", v,
                           name, name, lo, hi);
    *out = x;
    return 0;
}

static int parse_opts(int argc, char **argv, struct sample_opts *o, struct kiln_error *err) {
    *o = (struct sample_opts){.run = NULL, .prompt = "", .max_tokens = 200, .temperature = 0.8f, .top_k = 40,
                              .seed = 1337, .device = "auto"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) || !eq)
            return kiln_errorf(err, KILN_ERR_USAGE, "unexpected argument '%s' (kiln sample): options are --name=value",
                               a);
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)(eq - a - 2), a + 2);
        const char *v = eq + 1;
        long x = 0;
        int rc = 0;
        if (!strcmp(name, "run"))
            o->run = v;
        else if (!strcmp(name, "prompt"))
            o->prompt = v;
        else if (!strcmp(name, "device"))
            o->device = v;
        else if (!strcmp(name, "max-tokens")) {
            if (!(rc = parse_int(v, name, 1, 1 << 24, &x, err)))
                o->max_tokens = (int)x;
        } else if (!strcmp(name, "top-k")) {
            if (!(rc = parse_int(v, name, 0, 1 << 24, &x, err)))
                o->top_k = (int)x;
        } else if (!strcmp(name, "seed")) {
            if (!(rc = parse_int(v, name, 0, 0x7fffffffffffffffL, &x, err)))
                o->seed = (uint64_t)x;
        } else if (!strcmp(name, "temperature")) {
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end || !(t >= 0 && t <= 100))
                return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for temperature (--temperature): expected a "
                                   "number from 0 (greedy) to 100", v);
            o->temperature = (float)t;
        } else
            return cmd_unknown_option(
                err, "sample", name,
                (const char *const[]){"run", "prompt", "max-tokens", "temperature", "top-k", "seed", "device",
                                      NULL},
                "--run, --prompt, --max-tokens, --temperature, --top-k, --seed, --device");
        if (rc)
            return rc;
    }
    if (!o->run)
        return kiln_errorf(err, KILN_ERR_USAGE, "missing --run=DIR (kiln sample): the run directory of kiln train --out");
    return 0;
}

static int run_sample(const struct sample_opts *o, const struct kiln_knobs *knobs, struct kiln_error *err) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/config", o->run);
    if (access(path, R_OK) != 0)
        return kiln_errorf(err, KILN_ERR_USAGE, "no kiln run in '%s' (--run): %s is missing; pass the --out directory "
                           "of kiln train", o->run, path);
    snprintf(path, sizeof(path), "--config=%s/config", o->run);
    struct kiln_config cfg;
    char *args[] = {path};
    int rc = kiln_config_parse(&cfg, 1, args, err);
    if (rc)
        return rc;

    struct kiln_tokenizer *tok = NULL;
    if (!strcmp(cfg.tokenizer, "char")) {
        snprintf(path, sizeof(path), "%s/vocab.char", o->run);
        FILE *f = fopen(path, "rb");
        char chars[256];
        size_t n = f ? fread(chars, 1, sizeof(chars), f) : 0;
        if (f)
            fclose(f);
        if (!n || !(tok = kiln_chartok_from_vocab(chars, n)))
            return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read the char vocabulary (%s): is this a kiln run "
                               "directory?", path);
    } else if ((rc = kiln_tokenizer_open_at(&tok, cfg.tokenizer, NULL, kiln_knobs_source_dir(knobs), err))) {
        return rc;
    }
    cfg.model.vocab_size = kiln_tokenizer_vocab_size(tok);

    struct kiln_backend be;
    struct kiln_backend_opts bo = {0};
    struct kiln_model *g = NULL;
    float *params = NULL, *logits = NULL;
    struct kiln_ids ids = {0};
    struct kiln_bytes text = {0};
    kiln_knobs_backend_opts(knobs, &bo);
    if ((rc = kiln_backend_open(o->device, &bo, &be, err)))
        goto out_tok;
    struct kiln_model_opts go = {.B = 1, .T = 1, .recompute = KILN_RECOMPUTE_NONE, .training = 0};
    kiln_model_tuning(&go, knobs);
    if ((rc = kiln_model_create(&g, &cfg.model, &be, &go, err)))
        goto out_be;
    const struct kiln_param_table *pt = kiln_model_params(g);
    params = kiln_xmalloc(pt->total * sizeof(float));
    if ((rc = kiln_run_weights_path(o->run, path, sizeof(path), err)))
        goto out;
    if ((rc = kiln_read_model_safetensors(path, pt, params, err)))
        goto out;
    kiln_model_set_params(g, params);
    int maxT = cfg.model.block_size;
    if ((rc = kiln_model_decode_begin(g, 1, maxT, err)))
        goto out;

    if (o->prompt[0]) {
        if ((rc = kiln_tokenizer_encode(tok, o->prompt, strlen(o->prompt), &ids, err)))
            goto out;
    } else {
        // no prompt: start from <|endoftext|>, or a newline for the char model
        int eot = kiln_tokenizer_eot(tok);
        if (eot < 0 && kiln_tokenizer_encode(tok, "\n", 1, &ids, err))
            kiln_ids_push(&ids, 0);
        else if (eot >= 0)
            kiln_ids_push(&ids, eot);
    }
    if ((int)ids.n >= maxT) {
        rc = kiln_errorf(err, KILN_ERR_USAGE, "prompt is %zu tokens (--prompt): the model's context is %d", ids.n,
                         maxT);
        goto out;
    }
    fputs(o->prompt, stdout);
    int V = cfg.model.vocab_size;
    logits = kiln_xmalloc((size_t)V * sizeof(float));
    struct kiln_rng rng;
    kiln_rng_seed(&rng, o->seed);
    int pos = 0;
    for (; pos < (int)ids.n; pos++)
        kiln_model_decode_step(g, &ids.data[pos], pos, logits);
    for (int i = 0; i < o->max_tokens; i++) {
        // finite weights can still overflow to inf; a sampler fed NaN would print garbage and exit 0
        for (int k = 0; k < V; k++)
            if (!isfinite(logits[k])) {
                rc =
                    kiln_errorf(err, KILN_ERR_RUNTIME,
                                "non-finite logit %g (kiln sample: token %d of the vocabulary, position %d): "
                                "the model overflows; check the run's weights",
                                (double)logits[k], k, pos);
                fputc('\n', stdout);
                goto out;
            }
        int32_t next = kiln_sample_token(logits, V, o->temperature, o->top_k, &rng);
        kiln_ids_push(&ids, next);
        text.n = 0;
        if ((rc = kiln_tokenizer_decode(tok, &next, 1, &text, err)))
            goto out;
        fwrite(text.data, 1, text.n, stdout);
        fflush(stdout);
        if (pos == maxT) {
            // The context is full: keep the newest half and rebuild the KV cache from it (positions restart at
            // 0), so generation goes on with maxT/2 tokens of context, refilled every maxT/2 tokens.
            int keep = maxT / 2;
            const int32_t *tail = ids.data + ids.n - keep;
            for (pos = 0; pos < keep - 1; pos++)
                kiln_model_decode_step(g, &tail[pos], pos, logits);
        }
        kiln_model_decode_step(g, &next, pos++, logits);
    }
    fputc('\n', stdout);
out:
    free(params);
    free(logits);
    kiln_ids_free(&ids);
    kiln_bytes_free(&text);
    kiln_model_free(g);
out_be:
    kiln_backend_close(&be);
out_tok:
    kiln_tokenizer_free(tok);
    return rc;
}

int cmd_sample(int argc, char **argv, const struct kiln_knobs *knobs) {
    if (argc == 1 && !strcmp(argv[0], "--help")) {
        printf("kiln sample --run=DIR [--prompt=TEXT] [--max-tokens=200] [--temperature=0.8] [--top-k=40] "
               "[--seed=1337] [--device=auto|cpu|cuda]\n");
        return 0;
    }
    struct sample_opts o;
    struct kiln_error err = {0};
    if (parse_opts(argc, argv, &o, &err) || run_sample(&o, knobs, &err))
        return kiln_error_print(&err);
    return 0;
}
