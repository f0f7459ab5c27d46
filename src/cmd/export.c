// kiln export / kiln import: Hugging Face interop (the mapping is in interop/hf.c).
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "data/tokenizer.h"
#include "model/params.h"
#include "interop/hf.h"
#include "run/knobs.h"
#include "run/model_io.h"

// --name=value arguments into the values of the allowed names (NULL when absent).
static int parse_named(int argc, char **argv, const char *cmd, const char *const *names, const char **values,
                       int n, struct kiln_error *err) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) || !eq)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "unexpected argument '%s' (kiln %s): options are --name=value", a, cmd);
        int k = 0;
        while (k < n &&
               (strlen(names[k]) != (size_t)(eq - a - 2) || strncmp(names[k], a + 2, (size_t)(eq - a - 2))))
            k++;
        if (k == n) {
            char allowed[256] = "";
            const char *cands[9] = {NULL};
            for (int j = 0; j < n; j++) {
                snprintf(allowed + strlen(allowed), sizeof(allowed) - strlen(allowed), "%s--%s",
                         j ? ", " : "", names[j]);
                if (j < 8)
                    cands[j] = names[j];
            }
            return cmd_unknown_option(err, cmd, a, cands, allowed);
        }
        values[k] = eq + 1;
    }
    return 0;
}

// Whether a and b name one directory (also through another spelling or a symlink): both exist and share
// device and inode. Writing a run into its own source would overwrite the weights being read (both hold
// model.safetensors).
static int same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int run_export(int argc, char **argv, const struct kiln_knobs *knobs, struct kiln_error *err) {
    static const char *const names[] = {"run", "format", "out", "dtype"};
    const char *v[4] = {NULL, "hf", NULL, "f32"};
    int rc = parse_named(argc, argv, "export", names, v, 4, err);
    if (rc)
        return rc;
    if (!v[0] || !v[2])
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "missing --%s (kiln export): write kiln export --run=DIR --format=hf "
                           "--out=HF_DIR",
                           !v[0] ? "run=DIR" : "out=HF_DIR");
    if (strcmp(v[1], "hf"))
        return kiln_errorf(err, KILN_ERR_USAGE, "bad value '%s' for format (--format): allowed values are hf",
                           v[1]);
    if (strcmp(v[3], "f32") && strcmp(v[3], "bf16"))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "bad value '%s' for dtype (--dtype): allowed values are f32,bf16", v[3]);
    if (same_dir(v[0], v[2]))
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s is the run being exported (--out): its model.safetensors would be overwritten; "
            "choose another directory for the Hugging Face files",
            v[2]);
    struct kiln_config cfg;
    struct kiln_run_tokenizer tok;
    if ((rc = kiln_run_read_config(v[0], &cfg, &tok, kiln_knobs_source_dir(knobs), err)))
        return rc;
    enum kiln_hf_arch arch;
    if ((rc = kiln_hf_arch_of(&cfg.model, &arch, err)))
        return rc; // refuse before reading gigabytes of weights
    struct kiln_param_table pt;
    kiln_params_build(&pt, &cfg.model);
    float *params = kiln_xmalloc(pt.total * sizeof(float));
    char path[1200];
    struct kiln_hf_export_opts o = {.bf16 = !strcmp(v[3], "bf16")};
    rc = kiln_run_weights_path(v[0], path, sizeof(path), err);
    if (!rc)
        rc = kiln_read_model_safetensors(path, &pt, params, err);
    if (!rc)
        rc = kiln_hf_export(v[2], &cfg.model, &tok, params, &o, err);
    char why[512] = "", gdir[4096];
    if (!rc)
        rc = kiln_hf_export_tokenizer(v[2], &tok,
                                      kiln_gpt2_dir(NULL, kiln_knobs_source_dir(knobs), gdir, sizeof(gdir)),
                                      cfg.model.block_size, why, sizeof(why), err);
    if (!rc)
        printf("exported %s (%zu parameters, %s) and its %s tokenizer%s to %s\n", kiln_hf_arch_name(arch),
               pt.n_params, v[3], tok.name, why[0] ? " (config only)" : "", v[2]);
    if (!rc && why[0])
        fprintf(stderr, "kiln: no tokenizer files in %s: %s\n", v[2], why);
    free(params);
    kiln_params_free(&pt);
    return rc;
}

static int run_import(int argc, char **argv, struct kiln_error *err) {
    static const char *const names[] = {"from", "out"};
    const char *v[2] = {NULL, NULL};
    int rc = parse_named(argc, argv, "import", names, v, 2, err);
    if (rc)
        return rc;
    if (!v[0] || !v[1])
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "missing --%s (kiln import): write kiln import --from=HF_DIR --out=DIR",
                           !v[0] ? "from=HF_DIR" : "out=DIR");
    if (same_dir(v[0], v[1]))
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s is the Hugging Face model being imported (--out): its model.safetensors would be "
            "overwritten; choose another directory for the kiln run",
            v[1]);
    char path[1200];
    snprintf(path, sizeof(path), "%s/config", v[1]);
    if (access(path, F_OK) == 0)
        return kiln_errorf(err, KILN_ERR_USAGE, "%s already holds a kiln run (--out): choose a new directory",
                           v[1]);
    struct kiln_config cfg;
    struct kiln_run_tokenizer tok;
    if ((rc = kiln_config_init(&cfg, NULL, err)) || (rc = kiln_hf_import_config(v[0], &cfg, &tok, err)))
        return rc;
    snprintf(cfg.out, sizeof(cfg.out), "%s", v[1]);
    struct kiln_param_table pt;
    kiln_params_build(&pt, &cfg.model);
    float *params = kiln_xmalloc(pt.total * sizeof(float));
    rc = kiln_hf_import_weights(v[0], &cfg.model, params, err);
    if (!rc)
        rc = kiln_run_write(v[1], &cfg, &tok, params, err);
    if (!rc)
        printf("imported %zu parameters (tokenizer %s) into %s\n", pt.n_params, tok.name, v[1]);
    free(params);
    kiln_params_free(&pt);
    return rc;
}

int cmd_export(int argc, char **argv, const struct kiln_knobs *knobs) {
    if (argc == 1 && !strcmp(argv[0], "--help")) {
        printf(
            "kiln export --run=DIR --format=hf --out=HF_DIR [--dtype=f32|bf16]\n"
            "  writes config.json + model.safetensors for GPT2LMHeadModel, LlamaForCausalLM or "
            "OlmoForCausalLM,\n"
            "  and the tokenizer's files for transformers' AutoTokenizer: tokenizer.json (the `tokenizers`\n"
            "  format), tokenizer_config.json, special_tokens_map.json, and for gpt2 vocab.json + "
            "merges.txt\n");
        return 0;
    }
    struct kiln_error err = {0};
    if (run_export(argc, argv, knobs, &err))
        return kiln_error_print(&err);
    return 0;
}

int cmd_import(int argc, char **argv, const struct kiln_knobs *knobs) {
    (void)knobs; // (an import reads the Hugging Face directory alone)
    if (argc == 1 && !strcmp(argv[0], "--help")) {
        printf("kiln import --from=HF_DIR --out=DIR\n"
               "  reads a GPT2LMHeadModel, LlamaForCausalLM or OlmoForCausalLM directory into a kiln run "
               "directory\n");
        return 0;
    }
    struct kiln_error err = {0};
    if (run_import(argc, argv, &err))
        return kiln_error_print(&err);
    return 0;
}
