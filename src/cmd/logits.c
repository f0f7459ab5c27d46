// kiln logits: the model's next-token logits at every position of a token sequence, as JSON. For checking
// exports against other implementations (tests/interop/check_hf.py) and for debugging.
//   {"device": "cpu", "vocab_size": V, "tokens": [...], "logits": [[V floats] per position]}
// A non-finite logit is written as null, so stdout is always valid JSON, and the exit status is then 1.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "cmd/cmd.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "run/knobs.h"
#include "run/tuning.h"
#include "run/model_io.h"

struct logits_opts {
    const char *run, *tokens, *text, *device;
};

static int parse_opts(int argc, char **argv, struct logits_opts *o, struct kiln_error *err) {
    *o = (struct logits_opts){.device = "cpu"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) || !eq)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "unexpected argument '%s' (kiln logits): options are --name=value", a);
        size_t n = (size_t)(eq - a - 2);
        const char *v = eq + 1;
        if (n == 3 && !strncmp(a + 2, "run", n))
            o->run = v;
        else if (n == 6 && !strncmp(a + 2, "tokens", n))
            o->tokens = v;
        else if (n == 4 && !strncmp(a + 2, "text", n))
            o->text = v;
        else if (n == 6 && !strncmp(a + 2, "device", n))
            o->device = v;
        else
            return cmd_unknown_option(err, "logits", a,
                                      (const char *const[]){"run", "tokens", "text", "device", NULL},
                                      "--run, --tokens, --text, --device");
    }
    if (!o->run)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "missing --run=DIR (kiln logits): the run directory of kiln train or "
                           "kiln import");
    if (!o->tokens == !o->text)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "give exactly one of --tokens=ID,ID,... and --text=TEXT (kiln logits)");
    return 0;
}

// "1,2,3" -> ids, each in [0, V)
static int parse_tokens(const char *s, int V, struct kiln_ids *ids, struct kiln_error *err) {
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x >= V || (*end && *end != ','))
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "bad token list '%s' (--tokens): expected ids from 0 to %d "
                               "separated by commas",
                               s, V - 1);
        kiln_ids_push(ids, (int32_t)x);
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int run_logits(const struct logits_opts *o, const struct kiln_knobs *knobs, struct kiln_error *err) {
    struct kiln_config cfg;
    struct kiln_run_tokenizer rt;
    int rc = kiln_run_read_config(o->run, &cfg, &rt, kiln_knobs_source_dir(knobs), err);
    if (rc)
        return rc;
    int V = cfg.model.vocab_size;
    struct kiln_ids ids = {0};
    if (o->tokens) {
        rc = parse_tokens(o->tokens, V, &ids, err);
    } else {
        struct kiln_tokenizer *tok = NULL;
        if (!strcmp(rt.name, "char"))
            tok = kiln_chartok_from_vocab(rt.chars, (size_t)rt.n_chars);
        else
            rc = kiln_tokenizer_open_at(&tok, rt.name, NULL, kiln_knobs_source_dir(knobs), err);
        if (!rc)
            rc = kiln_tokenizer_encode(tok, o->text, strlen(o->text), &ids, err);
        kiln_tokenizer_free(tok);
    }
    if (!rc && (ids.n == 0 || (int)ids.n > cfg.model.block_size))
        rc = kiln_errorf(err, KILN_ERR_USAGE, "%zu tokens (--tokens/--text): expected 1 to block-size = %d",
                         ids.n, cfg.model.block_size);
    if (rc) {
        kiln_ids_free(&ids);
        return rc;
    }
    struct kiln_backend be;
    struct kiln_backend_opts bo = {0};
    struct kiln_model *g = NULL;
    float *params = NULL, *logits = NULL;
    kiln_knobs_backend_opts(knobs, &bo);
    if ((rc = kiln_backend_open(o->device, &bo, &be, err)))
        goto out_ids;
    struct kiln_model_opts go = {.B = 1, .T = 1, .recompute = KILN_RECOMPUTE_NONE, .training = 0};
    kiln_model_tuning(&go, knobs);
    if ((rc = kiln_model_create(&g, &cfg.model, &be, &go, err)))
        goto out_be;
    const struct kiln_param_table *pt = kiln_model_params(g);
    params = kiln_xmalloc(pt->total * sizeof(float));
    char path[1200];
    if ((rc = kiln_run_weights_path(o->run, path, sizeof(path), err)))
        goto out;
    if ((rc = kiln_read_model_safetensors(path, pt, params, err)))
        goto out;
    kiln_model_set_params(g, params);
    if ((rc = kiln_model_decode_begin(g, 1, (int)ids.n, err)))
        goto out;
    logits = kiln_xmalloc((size_t)V * sizeof(float));
    printf("{\"device\": \"%s\", \"vocab_size\": %d, \"tokens\": [", be.name, V);
    for (size_t i = 0; i < ids.n; i++)
        printf("%s%d", i ? ", " : "", ids.data[i]);
    printf("],\n \"logits\": [");
    // the KV-cache path, one position at a time: logits at position t see tokens 0..t. JSON has no NaN or
    // Infinity: a non-finite logit prints as null (the output stays valid JSON) and the exit status is 1,
    // with an error naming the first one.
    for (size_t t = 0; t < ids.n; t++) {
        kiln_model_decode_step(g, &ids.data[t], (int)t, logits);
        printf("%s[", t ? ",\n  " : "");
        for (int k = 0; k < V; k++) {
            if (isfinite(logits[k])) {
                printf("%s%.9g", k ? "," : "", (double)logits[k]);
                continue;
            }
            printf("%snull", k ? "," : "");
            if (!rc)
                rc =
                    kiln_errorf(err, KILN_ERR_RUNTIME,
                                "non-finite logit %g (kiln logits: position %zu, token %d): printed as null; "
                                "the model overflows, check the run's weights",
                                (double)logits[k], t, k);
        }
        printf("]");
    }
    printf("]}\n");
out:
    free(params);
    free(logits);
    kiln_model_free(g);
out_be:
    kiln_backend_close(&be);
out_ids:
    kiln_ids_free(&ids);
    return rc;
}

int cmd_logits(int argc, char **argv, const struct kiln_knobs *knobs) {
    if (argc == 1 && !strcmp(argv[0], "--help")) {
        printf("kiln logits --run=DIR (--tokens=ID,ID,... | --text=TEXT) [--device=cpu|cuda|auto]\n"
               "  prints {\"vocab_size\", \"tokens\", \"logits\": [[V floats] per position]} as JSON;\n"
               "  a non-finite logit prints as null and kiln exits 1\n");
        return 0;
    }
    struct logits_opts o;
    struct kiln_error err = {0};
    if (parse_opts(argc, argv, &o, &err) || run_logits(&o, knobs, &err))
        return kiln_error_print(&err);
    return 0;
}
