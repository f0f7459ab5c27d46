// The subcommand table and `kiln help`.
#include "cmd/cmd.h"

#include <stdio.h>
#include <string.h>

#include "core/backend.h"
#include "parallel/comm/comm.h"
#include "run/knobs.h"
#include "run/options.h"
#include "util/build_info.h"
#include "util/error.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv, const struct kiln_knobs *knobs);
    const char *summary;
};

static const struct command COMMANDS[] = {
    {"train", cmd_train, "train a model (default: shakespeare-char on the embedded Tiny Shakespeare)"},
    {"sample", cmd_sample, "generate text from a trained run (--run=DIR)"},
    {"info", cmd_info, "show a preset's resolved config, parameters, FLOPs and memory; backends and GPUs"},
    {"tokenize", cmd_tokenize, "tokenize text corpora into token shards"},
    {"encode", cmd_encode, "JSONL {\"text\":...} lines -> {\"ids\":[...]} lines"},
    {"decode", cmd_decode, "JSONL {\"ids\":[...]} lines -> {\"text\":...} lines"},
    {"export", cmd_export, "export a run to a Hugging Face directory (config.json + model.safetensors)"},
    {"import", cmd_import, "import a Hugging Face directory as a kiln run"},
    {"logits", cmd_logits,
     "print a run's next-token logits for given tokens, as JSON (--run=DIR --tokens=...)"},
    {"launch", cmd_launch, "supervise kiln train: restart it from the newest checkpoint after a crash"},
    {"doctor", cmd_doctor, "explain a hang from a run's RUN/hang/ reports: which rank stalled, and where"},
    {"plot", cmd_plot, "plot runs' metrics (loss, lr, grad norm, tok/s, MFU, memory) into a PNG"},
    {"help", cmd_help, "this help, or the options of a command (kiln help train)"},
};
#define N_COMMANDS (sizeof(COMMANDS) / sizeof(COMMANDS[0]))

// The closest of cands (NULL-terminated) to word[0..n) by edit distance, adjacent swaps counting one
// (`trian` is one from `train`); NULL when none is within 2 edits, or within a third of the word for longer
// ones. For "did you mean" in the commands' usage errors.
const char *cmd_suggest(const char *word, size_t n, const char *const *cands) {
    if (n > 63)
        return NULL;
    const char *best = NULL;
    int best_d = (int)(n / 3 > 2 ? n / 3 : 2) + 1;
    for (const char *const *c = cands; *c; c++) {
        int k = (int)strlen(*c);
        if (k > 63)
            continue;
        int d[64][64];
        for (int a = 0; a <= (int)n; a++)
            d[a][0] = a;
        for (int b = 0; b <= k; b++)
            d[0][b] = b;
        for (int a = 1; a <= (int)n; a++)
            for (int b = 1; b <= k; b++) {
                int sub = d[a - 1][b - 1] + (word[a - 1] != (*c)[b - 1]);
                int del = d[a - 1][b] + 1, ins = d[a][b - 1] + 1;
                int m = sub < del ? sub : del;
                m = m < ins ? m : ins;
                if (a > 1 && b > 1 && word[a - 1] == (*c)[b - 2] && word[a - 2] == (*c)[b - 1] &&
                    d[a - 2][b - 2] + 1 < m)
                    m = d[a - 2][b - 2] + 1;
                d[a][b] = m;
            }
        if (d[n][k] < best_d) {
            best_d = d[n][k];
            best = *c;
        }
    }
    return best;
}

int cmd_unknown_option(struct kiln_error *err, const char *cmd, const char *arg, const char *const *names,
                       const char *allowed) {
    const char *name = arg + strspn(arg, "-");
    size_t n = strcspn(name, "=");
    const char *s = cmd_suggest(name, n, names);
    if (s)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "unknown option '%.*s' (kiln %s): did you mean '%s'? allowed are %s", (int)n, name,
                           cmd, s, allowed);
    return kiln_errorf(err, KILN_ERR_USAGE, "unknown option '%.*s' (kiln %s): allowed are %s", (int)n, name,
                       cmd, allowed);
}

// A command's name, or why not: one line, "did you mean" where a command is close.
static int unknown_command(const char *name, const char *where) {
    const char *names[sizeof(COMMANDS) / sizeof(COMMANDS[0]) + 1];
    size_t k = 0;
    for (; k < sizeof(COMMANDS) / sizeof(COMMANDS[0]); k++)
        names[k] = COMMANDS[k].name;
    names[k] = NULL;
    const char *s = cmd_suggest(name, strlen(name), names);
    if (s)
        fprintf(stderr,
                "error: unknown command '%s' (%s): did you mean '%s'? see kiln help for the commands\n", name,
                where, s);
    else
        fprintf(
            stderr,
            "error: unknown command '%s' (%s): there is no such command; see kiln help for the commands\n",
            name, where);
    return 2;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln <command> [--option=value ...]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "\nkiln help <command> lists a command's options; kiln --version says what this binary is.\n");
}

// kiln --version: what a bug report needs to name the binary.
static int print_version(void) {
    printf("kiln %s\n", kiln_build_version);
    printf("commit: %s\n", kiln_build_commit);
    printf("build type: %s\n", kiln_build_type[0] ? kiln_build_type : "(none)");
    printf("backends: %s\n", kiln_backends_compiled());
    printf("cuda archs: %s\n",
           kiln_build_cuda_archs[0] ? kiln_build_cuda_archs : "none (built without CUDA)");
    printf("transports: %s\n", kiln_comm_compiled());
    return 0;
}

// Only the options info reads: kiln info also accepts every kiln train option, for the resolved config.
// clang-format off
static const char *const INFO_OPTS[] = {
    "layers", "heads", "kv-heads", "dim", "block-size", "vocab-multiple", "pos", "norm", "norm-bias", "bias",
    "mlp", "mlp-hidden", "block", "tie-embeddings", "qk-norm", "tokenizer", "batch", "seq", "total-batch",
    "recompute", "grad-dtype", "zero", "prefetch", "zero3-reshard-after-forward", "zero3-accumulate", "offload",
    "bucket-mb", "sp", "sp-mode", "sp-ulysses", NULL};
// clang-format on

int cmd_help(int argc, char **argv, const struct kiln_knobs *knobs) {
    if (argc == 0) {
        usage(stdout);
        return 0;
    }
    const char *c = argv[0];
    int all = 0;
    for (int i = 1; i < argc; i++)
        all |= !strcmp(argv[i], "--all");
    if (!strcmp(c, "train")) {
        printf("kiln train [--preset=NAME] [--config=FILE] [--option=value ...]\n"
               "  trains a model; ready configs to start from are in the configs/ directory of the source\n"
               "  tree (kiln train --config=configs/FILE.cfg), and kiln info --config=FILE shows what one\n"
               "  resolves to before it runs.\n\n");
        kiln_config_print_help(stdout, all);
        return 0;
    }
    if (!strcmp(c, "info")) {
        printf(
            "kiln info [--preset=NAME] [--config=FILE] [--option=value ...]\n"
            "  prints a model's summary (shape, parameters, FLOPs), the resolved config (--all: with the\n"
            "  fault-injection options for tests), its memory, and the backends and GPUs of this machine.\n"
            "  It accepts every kiln train option (kiln help train); these change\n"
            "  what it computes, --world=N (default 1) plans one rank of an N-rank job, --strategies adds\n"
            "  each data-parallel strategy's per-rank GPU memory under each recompute mode, and\n"
            "  --lengths=T1,T2,... each sequence length's under each recompute mode and activation "
            "offload.\n"
            "kiln info --knobs\n"
            "  lists the KILN_* knobs, environment variables for tests, comparisons and measurements\n"
            "  that kiln reads once at start-up: each one's value, whether it came from the environment\n"
            "  or is the default, the layer that reads it, what it does and the values it takes.\n\n");
        kiln_config_print_help_only(stdout, INFO_OPTS);
        return 0;
    }
    if (!strcmp(c, "help") || !strcmp(c, "--help") || !strcmp(c, "-h")) {
        printf("kiln help [COMMAND]\n  lists the commands, or the options of COMMAND\n");
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(c, COMMANDS[i].name)) {
            char *h[] = {"--help"};
            return COMMANDS[i].run(1, h, knobs);
        }
    return unknown_command(c, "kiln help");
}

int kiln_cmd_main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    // The knobs, read once for the whole process: a bad value stops every command but help before it
    // starts (help and --version work whatever the environment holds).
    struct kiln_knobs knobs;
    kiln_knobs_defaults(&knobs);
    if (!strcmp(name, "--help") || !strcmp(name, "-h"))
        return cmd_help(0, NULL, &knobs);
    if (!strcmp(name, "--version") || !strcmp(name, "-V"))
        return print_version();
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, COMMANDS[i].name)) {
            // --help or -h anywhere before a "--" (launch passes what follows to train) is the command's help
            int help = 0, all = 0;
            for (int a = 2; a < argc && strcmp(argv[a], "--"); a++) {
                help |= !strcmp(argv[a], "--help") || !strcmp(argv[a], "-h");
                all |= !strcmp(argv[a], "--all");
            }
            if (help) {
                char *h[] = {argv[1], "--all"};
                return cmd_help(1 + all, h, &knobs);
            }
            struct kiln_error err = {0};
            if (COMMANDS[i].run != cmd_help && kiln_knobs_read(&knobs, NULL, &err))
                return kiln_error_print(&err);
            return COMMANDS[i].run(argc - 2, argv + 2, &knobs);
        }
    return unknown_command(name, "kiln");
}
