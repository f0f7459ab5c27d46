// The training loop. See trainer.h.
#include "run/trainer.h"

#include <errno.h>
#include <glob.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/loader.h"
#include "data/shards.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"
#include "parallel/comm/flight.h"
#include "parallel/comm/watchdog.h"
#include "data/tokenizer.h"
#include "io/fsutil.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "optim/state.h"
#include "run/model_io.h"
#include "run/sampler.h"
#include "run/embedded.h"
#include "run/agree.h"
#include "run/guards.h"
#include "run/metrics.h"
#include "run/schedule.h"
#include "parallel/dp.h"
#include "run/plan.h"
#include "parallel/sp.h"
#include "parallel/tp.h"
#include "precision/fp8.h"
#include "run/tuning.h"
#include "run/train_ckpt.h"
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

// The char vocabulary of shards: DIR/manifest.json beside the files --data matches (kiln tokenize writes it).
// A pattern that matches nothing says so; matching files without their manifest say what is missing.
static int char_shards_tokenizer(const struct kiln_config *cfg, struct kiln_tokenizer **tok,
                                 struct kiln_error *err) {
    glob_t g;
    int found = glob(cfg->data, 0, NULL, &g) == 0 && g.gl_pathc > 0;
    char manifest[1100] = "";
    int rc = found ? kiln_token_path_check(g.gl_pathv[0], err) : 0; // a directory has no manifest beside it
    if (found && !rc) {
        char *first = kiln_xstrdup(g.gl_pathv[0]);
        snprintf(manifest, sizeof(manifest), "%s/manifest.json", dirname(first));
        free(first);
    }
    globfree(&g);
    if (rc)
        return rc;
    if (!found)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "no files match '%s' (--data): check the path and quote the glob", cfg->data);
    struct stat st;
    if (stat(manifest, &st) != 0)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s is missing (--data, --tokenizer=char): char shards take their vocabulary from the "
            "manifest kiln tokenize --tokenizer=char writes beside them",
            manifest);
    return kiln_tokenizer_open(tok, "char", manifest, err);
}

// The tokenizer, and loaders over shards (--data) or the embedded Tiny Shakespeare split 90/10. source_dir:
// where gpt2's vocabulary is looked for when the working directory has no data/gpt2 (KILN_SOURCE_DIR).
static int open_data(struct kiln_config *cfg, int rank, int world, const char *source_dir, struct run_data *d,
                     struct kiln_error *err) {
    memset(d, 0, sizeof(*d));
    int rc;
    size_t n_text = 0;
    const char *text = NULL;
    if (strcmp(cfg->tokenizer, "char") == 0 && cfg->data[0] && strcmp(cfg->data, "random")) {
        // char shards (kiln tokenize --tokenizer=char): the vocabulary is the one their manifest saved
        if ((rc = char_shards_tokenizer(cfg, &d->tok, err)))
            return rc;
    } else if (strcmp(cfg->tokenizer, "char") == 0) {
        text = kiln_embedded_shakespeare(&n_text);
        d->tok = kiln_chartok_from_text(text, n_text);
    } else if ((rc = kiln_tokenizer_open_at(&d->tok, cfg->tokenizer, NULL, source_dir, err))) {
        return rc;
    }
    cfg->model.vocab_size = kiln_tokenizer_vocab_size(d->tok);

    struct kiln_loader_opts lo = {.B = cfg->batch_size,
                                  .T = cfg->seq_len,
                                  .seed = cfg->seed,
                                  .rank = rank,
                                  .world = world,
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

// A step's batch: the loader's (B, T) sequences, and under sequence parallelism this rank's columns of them,
// which are what the model reads.
struct batch {
    int32_t *in, *tgt;     // (B, T)
    int32_t *in_l, *tgt_l; // (B, T / sp); NULL without sequence parallelism
    const struct kiln_sp_layout *sp;
    int B;
};

static void next_batch(struct batch *b, struct kiln_loader *ld, const int32_t **in, const int32_t **tgt) {
    kiln_loader_next(ld, b->in, b->tgt);
    *in = b->in, *tgt = b->tgt;
    if (b->in_l) {
        kiln_sp_slice(b->sp, b->in, b->B, b->in_l);
        kiln_sp_slice(b->sp, b->tgt, b->B, b->tgt_l);
        *in = b->in_l, *tgt = b->tgt_l;
    }
}

// The mean loss over --eval-steps batches of the validation stream's start, sharded: with n data-parallel
// ranks each takes every n-th window (the loader's rank partition) for ceil(eval-steps / n) batches, and the
// ranks' means are averaged (the ranks of a sequence-parallel group each hold an equal share of its tokens).
static double evaluate(struct kiln_model *g, struct kiln_loader *val, const struct kiln_config *cfg,
                       struct batch *bt, int dp, struct kiln_comm *comm) {
    int world = comm ? comm->size : 1;
    kiln_loader_reset(val);
    uint64_t windows = kiln_loader_rank_windows(val);
    int batches = (cfg->eval_steps + dp - 1) / dp;
    if ((uint64_t)batches * cfg->batch_size > windows)
        batches = (int)(windows / cfg->batch_size);
    if (batches < 1)
        batches = 1;
    double sum = 0;
    for (int i = 0; i < batches; i++) {
        const int32_t *in, *tgt;
        next_batch(bt, val, &in, &tgt);
        sum += kiln_model_forward(g, in, tgt, 0.0f, 0.0f);
    }
    double mean = sum / batches;
    if (comm && world > 1) {
        kiln_comm_all_reduce_host(comm, &mean, 1, KILN_F64, KILN_RED_SUM);
        mean /= world;
    }
    return mean;
}

// ----------------------------------------------------------------------------
// signals, fault injection

static volatile sig_atomic_t stop_requested = 0;

// the step loop has begun: it looks at stop_requested after each step (and the run's end, which writes the
// model, finishes rather than stopping)
static volatile sig_atomic_t in_loop = 0;

int kiln_train_request_stop(int signo) {
    stop_requested = signo;
    return in_loop;
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

// --inject-stall=RANK:STEP: both numbers, STEP >= 1 and RANK a rank of this job; "" = off (*step = 0)
static int parse_stall(const char *s, int world, int *rank, int64_t *step, struct kiln_error *err) {
    *rank = -1;
    *step = 0;
    if (!s[0])
        return 0;
    char *end;
    errno = 0;
    long r = strtol(s, &end, 10);
    long long st = 0;
    int ok = end != s && *end == ':' && r >= 0 && !errno;
    if (ok) {
        const char *p = end + 1;
        st = strtoll(p, &end, 10);
        ok = end != p && !*end && st >= 1 && !errno;
    }
    if (!ok)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "bad value '%s' for inject-stall (--inject-stall): expected RANK:STEP, a rank >= 0 "
            "and a step >= 1, e.g. 1:3",
            s);
    if (r >= world)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "rank %ld does not exist (--inject-stall=%s): the job has %d rank(s); use 0..%d",
                           r, s, world, world - 1);
    *rank = (int)r;
    *step = st;
    return 0;
}

// --inject-stall: this rank stops making progress, outside any collective, as a rank stuck in I/O or a
// deadlock would. Named and exported, so that the watchdog's stack dump shows where it sleeps.
void kiln_train_injected_stall(int64_t step) {
    fprintf(stderr, "kiln: --inject-stall: sleeping before step %lld, forever (testing the hang watchdog)\n",
            (long long)step);
    for (;;)
        sleep(1000);
}

static int in_step_list(const int64_t *list, int64_t step) {
    for (; list && *list; list++)
        if (*list == step)
            return 1;
    return 0;
}

// ----------------------------------------------------------------------------
// resume

static void report_skip(const char *path, const char *why, const struct kiln_comm *comm) {
    if (comm && comm->size > 1) // (printed by the first rank that found it: see agree)
        fprintf(stderr,
                "kiln: checkpoint %s is unusable (%s, found by rank %d): falling back to the previous one\n",
                path, why, comm->rank);
    else
        fprintf(stderr, "kiln: checkpoint %s is unusable (%s): falling back to the previous one\n", path,
                why);
}

// With several ranks every step below is taken by all of them on the same checkpoint, and they agree on each
// verdict: r is this rank's (0, -2 or an error code, err filled), and the job's is returned: 0 when every
// rank got 0; else -2 when some rank got -2, else the largest error. A rank whose own r was 0 names the
// others in err; *own says whether this rank's own r failed. *reporter: the rank that says why, the same on
// every rank (the first whose own r gave the job's verdict), so that a checkpoint every rank finds unusable
// is reported once, not once per rank.
static int agree(struct kiln_comm *comm, int r, const char *dir, int *own, int *reporter,
                 struct kiln_error *err) {
    *own = r != 0;
    *reporter = 0;
    if (!comm || comm->size == 1)
        return r;
    int32_t cls = r == 0 ? 0 : r == -2 ? 2 : 1, code = r > 0 ? r : r == -2 ? err->code : 0;
    int32_t mine = cls;
    kiln_comm_all_reduce_host(comm, &cls, 1, KILN_I32, KILN_RED_MAX);
    kiln_comm_all_reduce_host(comm, &code, 1, KILN_I32, KILN_RED_MAX);
    int32_t first = cls && mine == cls ? comm->rank : comm->size;
    kiln_comm_all_reduce_host(comm, &first, 1, KILN_I32, KILN_RED_MIN);
    *reporter = first < comm->size ? first : 0;
    if (cls == 0)
        return 0;
    if (r == 0)
        kiln_errorf(err, code ? code : KILN_ERR_RUNTIME,
                    "another rank could not use the checkpoint %s (its error is above)", dir);
    return cls == 2 ? -2 : err->code;
}

// The bytes of a checkpoint directory's files (not recursive: its parts are files), for the line that says
// what a resume reads before it reads it.
static double dir_bytes(const char *dir) {
    char pat[4200];
    snprintf(pat, sizeof(pat), "%s/*", dir);
    glob_t g;
    double n = 0;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            struct stat sb;
            if (stat(g.gl_pathv[i], &sb) == 0 && S_ISREG(sb.st_mode))
                n += (double)sb.st_size;
        }
        globfree(&g);
    }
    return n;
}

// Loads one checkpoint into the optimizer's state (and with it the model's weights), loader, guards and
// state. Returns 0, an error, or -2 after a usage error (a different model), which must not fall back. With
// dp (several ranks) the moments this rank holds are taken from a checkpoint of any world size. With comm
// (several ranks, all calling this on the same dir) each rank hashes its share of the files, and nothing is
// applied unless every share verified. *reporter: the rank that reports a failure (agree).
static int resume_from(const char *dir, struct kiln_config *cfg, struct kiln_model *g,
                       struct kiln_optim_state *os, struct kiln_dp *dp, const struct kiln_ckpt_part_of *part,
                       struct kiln_loader *train,
                       struct kiln_guards *guards, struct kiln_train_state *st, struct kiln_comm *comm,
                       int verbose, int *own, int *reporter, struct kiln_error *err) {
    struct kiln_ckpt ck;
    memset(&ck, 0, sizeof(ck));
    int several = comm && comm->size > 1;
    // reading and hashing a large checkpoint takes a while (1.5 GB for GPT-2 124M): say so before it starts
    double t0 = kiln_now_s(), bytes = verbose && !cfg->quiet ? dir_bytes(dir) : 0;
    if (bytes > 64e6) {
        fprintf(stderr,
                "kiln: reading checkpoint %s (%.2f GB%s): checking every file's sha256, then loading\n", dir,
                bytes / 1e9, several ? ", shared among the ranks" : "");
        fflush(stderr);
    }
    int rc = kiln_ckpt_load_share(dir, &ck, several ? comm->rank : 0, several ? comm->size : 1, err);
    if ((rc = agree(comm, rc, dir, own, reporter, err))) {
        kiln_ckpt_close(&ck);
        return rc;
    }
    // every rank resumes from rank 0's checkpoint (run/agree.h): one given another --resume, or reading
    // another copy of the run directory, refuses as for a different model, on every rank
    if (several) {
        char *state = cJSON_PrintUnformatted(ck.state);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(ck.state, "step");
        rc = kiln_agree_checkpoint(comm, dir, state ? state : "",
                                   cJSON_IsNumber(step) ? (long long)step->valuedouble : -1, err);
        free(state);
        if (rc) { // (the same line on every rank: rank 0 reports it)
            *own = 1;
            *reporter = 0;
            kiln_ckpt_close(&ck);
            return -2;
        }
    }
    char *changes = NULL;
    // first: it checks state.json's own hash
    rc = kiln_train_state_from_json(ck.state, st, err);
    if (!rc && (rc = kiln_resume_check_config(ck.state, cfg, &changes, err)) == KILN_ERR_USAGE)
        rc = -2;
    if (!rc)
        rc = kiln_guards_from_json(guards, cJSON_GetObjectItemCaseSensitive(ck.state, "guards"), err);
    if (!rc)
        rc = dp ? kiln_ckpt_apply_dp(&ck, kiln_model_params(g), dp, os, part, &cfg->model, err)
                : kiln_ckpt_apply(&ck, kiln_model_params(g), &cfg->model, os, err);
    if (!rc && (rc = kiln_loader_set_state(train, &st->loader, err)))
        rc = -2; // other data or T: falling back would not help
    rc = agree(comm, rc, dir, own, reporter, err);
    if (!rc && verbose) // printed also with --quiet: where a run continues from belongs in every log
    {
        char took[64] = "";
        if (bytes > 64e6)
            snprintf(took, sizeof(took), ", read and verified in %.1f s", kiln_now_s() - t0);
        fprintf(stderr, "kiln: resuming from %s (step %lld%s)\n", dir, (long long)st->step, took);
    }
    if (!rc && verbose && changes[0]) {
        for (char *save = NULL, *l = strtok_r(changes, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
            fprintf(stderr, "kiln: resume: %s\n", l);
    }
    free(changes);
    kiln_ckpt_close(&ck);
    return rc;
}

// The run's checkpoints, newest first: with several ranks rank 0's listing, so that every rank walks the same
// list. Returns the count or -1 (err filled, on every rank).
static int list_checkpoints(const char *run_dir, struct kiln_comm *comm, char ***paths,
                            struct kiln_error *err) {
    int64_t *steps = NULL;
    int n = -1;
    *paths = NULL;
    if (!comm || comm->size == 1 || comm->rank == 0)
        n = kiln_ckpt_list(run_dir, paths, &steps, err);
    free(steps);
    if (!comm || comm->size == 1)
        return n;
    int32_t count = n;
    kiln_comm_broadcast_host(comm, &count, sizeof(count), 0);
    if (count < 0) {
        if (comm->rank != 0)
            kiln_errorf(err, KILN_ERR_RUNTIME, "rank 0 could not list %s/ckpt (its error is above)", run_dir);
        return -1;
    }
    if (comm->rank != 0)
        *paths = kiln_xcalloc(count ? (size_t)count : 1, sizeof(char *));
    for (int i = 0; i < count; i++) {
        char p[1100] = {0};
        if (comm->rank == 0)
            snprintf(p, sizeof(p), "%s", (*paths)[i]);
        kiln_comm_broadcast_host(comm, p, sizeof(p), 0);
        if (comm->rank != 0)
            (*paths)[i] = kiln_xstrdup(p);
    }
    return count;
}

// 0 = resumed, KILN_CKPT_NONE = start fresh, else an error. With several ranks (comm) all of them call this
// and end on the same checkpoint, or on none: each verifies its share of a checkpoint's files, and a
// checkpoint that fails any share is skipped (--resume=auto) or refused (--resume=PATH) by all. Every rank
// returns the same verdict; *reporter is the rank whose error says why (the others' only point to it).
static int resume(struct kiln_config *cfg, struct kiln_model *g, struct kiln_optim_state *os,
                  struct kiln_dp *dp, const struct kiln_ckpt_part_of *part, struct kiln_comm *comm,
                  struct kiln_loader *train,
                  struct kiln_guards *guards, struct kiln_train_state *st, int *reporter,
                  struct kiln_error *err) {
    int verbose = !comm || comm->rank == 0;
    *reporter = 0;
    if (!strcmp(cfg->resume, "auto") || !strcmp(cfg->resume, "never")) {
        if (!cfg->out[0])
            return KILN_CKPT_NONE;
        char **paths = NULL;
        int n = list_checkpoints(cfg->out, comm, &paths, err), rc = KILN_CKPT_NONE;
        if (n < 0)
            return KILN_ERR_RUNTIME;
        if (n > 0 && !strcmp(cfg->resume, "never"))
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "%s already holds checkpoints (--resume=never): use another --out, "
                             "or delete %s/ckpt to start over",
                             cfg->out, cfg->out);
        for (int i = 0; i < n && rc == KILN_CKPT_NONE; i++) {
            struct kiln_error e = {0};
            int own, first,
                r = resume_from(paths[i], cfg, g, os, dp, part, train, guards, st, comm, verbose, &own, &first,
                                &e);
            if (r == 0 || r == -2) {
                rc = r ? e.code : 0;
                *err = e;
                *reporter = first;
            } else if (own && (!comm || comm->rank == first)) { // (the first rank that found it says why)
                report_skip(paths[i], e.msg, comm);
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
        return rc;
    }
    if (!cfg->out[0])
        return kiln_errorf(err, KILN_ERR_USAGE, "--resume=%s needs --out, the run directory to continue in",
                           cfg->resume);
    int own,
        r = resume_from(cfg->resume, cfg, g, os, dp, part, train, guards, st, comm, verbose, &own, reporter,
                        err);
    return r == -2 ? err->code : r;
}

// ----------------------------------------------------------------------------
// the loop

struct step_log {
    int64_t step;   // 1-based
    int64_t tokens; // the whole job's, through this step
    double loss, norm, tok_s, ms, val_loss, ckpt_stall_ms, prev_ckpt_write_ms;
    double slowest_ms;        // several ranks: the slowest rank's step time (0 with one process)
    double offload_ms;        // --offload: the host's optimizer steps that ended in this step (0 without)
    double offload_wait_ms;   // --offload: what this step waited for them
    double offload_copy_gbps; // --offload: their copies' bandwidth (0: none ended)
    int64_t comm_ops; // several ranks: collectives issued on the job's communicator so far (0 without)
    float lr;
    enum kiln_skip skipped;
};

// The metrics line of a step (NAN and 0 leave fields out).
static void log_metrics(struct kiln_metrics *m, const struct step_log *s, const struct kiln_guards *gd,
                        size_t mem_bytes, double mfu, double mfu_causal, double hfu, double comm_wait_ms) {
    struct kiln_metrics_row row = {.step = s->step,
                                   .loss = s->loss,
                                   .lr = s->lr,
                                   .grad_norm = s->norm,
                                   .tokens_per_s = s->tok_s,
                                   .ms = s->ms,
                                   .peak_mem_bytes = mem_bytes,
                                   .mfu = mfu,
                                   .mfu_causal = mfu_causal,
                                   .hfu = hfu,
                                   .val_loss = s->val_loss,
                                   .skipped = s->skipped ? kiln_skip_name(s->skipped) : NULL,
                                   .skipped_total = gd->skipped_total,
                                   .skipped_nan = gd->skipped[KILN_SKIP_NAN],
                                   .skipped_spike_loss = gd->skipped[KILN_SKIP_SPIKE_LOSS],
                                   .skipped_spike_grad = gd->skipped[KILN_SKIP_SPIKE_GRAD],
                                   .ckpt_stall_ms = s->ckpt_stall_ms,
                                   .comm_wait_ms = comm_wait_ms,
                                   .prev_ckpt_write_ms = s->prev_ckpt_write_ms,
                                   .slowest_ms = s->slowest_ms,
                                   .offload_ms = s->offload_ms,
                                   .offload_wait_ms = s->offload_wait_ms,
                                   .offload_copy_gbps = s->offload_copy_gbps,
                                   .comm_ops = s->comm_ops,
                                   .tokens = s->tokens};
    kiln_metrics_write(m, &row);
}

// ----------------------------------------------------------------------------
// one run: setup, step, after-step, teardown

struct run {
    struct kiln_config *cfg;
    const struct kiln_knobs *knobs; // read once at start-up (run/knobs.h)
    struct kiln_train_result *res;
    struct run_data data;
    int64_t *nan_steps;
    struct kiln_backend be;
    int be_open;
    struct kiln_model *g;
    struct kiln_optim_state *os; // the master weights and AdamW's moments (data parallelism shards them)
    const struct kiln_param_table *pt;
    struct kiln_param_span *spans; // AdamW's over every tensor, without data parallelism (dp has its own)
    int n_spans;
    struct kiln_guards guards;
    struct kiln_train_state st;
    struct kiln_ckpt_writer *writer;
    struct kiln_metrics *metrics;
    struct batch bt;
    // many processes: the job's place, the step's communicator, and DDP/ZeRO. ckpt_comm is a second one over
    // the same ranks for the checkpoint's collectives and the step's end (the stop agreement): under ZeRO-1/2
    // the updated weights' gathers are still running on comm's stream then, and a control value on comm would
    // wait for them, and keep the host from issuing the next forward that they overlap
    struct kiln_dist_env env;
    struct kiln_comm *comm, *ckpt_comm;
    int stopped_together; // an error every rank found at the same point: they leave the job in step
    struct kiln_dp *dp;
    struct kiln_sp_layout sp_lo; // sequence parallelism's layout (sp 1: none)
    struct kiln_sp *sp;
    // tensor parallelism (tp 1: none): its layout, and the communicator of the world / tp ranks that share a
    // tp_rank, over which data and sequence parallelism run (world itself without tensor parallelism)
    struct kiln_tp_layout tp_lo;
    struct kiln_tp *tp;
    struct kiln_model_config sp_model; // the model as sequence parallelism sees it: this rank's heads
    struct kiln_comm *cross;
    struct kiln_param_table whole_pt; // the whole model's table (tensor parallelism: checkpoints hold it)
    struct kiln_fp8 *fp8; // --precision=fp8: the linear layers' hook (precision/fp8.h), NULL in bf16
    int rank0; // this process logs, writes the run directory's files and prints progress
    // the loop's constants
    int accum;
    double tokens_per_step, peak, fpt, fpt_causal, fpt_recompute;
    struct kiln_progress prog;
    double timed_s;
    long timed_tokens;
    int64_t start, last_ckpt_step;
    double prev_comm_ms;                 // the host's wait on reductions up to the last step
    double prev_offload_s;               // the offloaded optimizer's time up to the last step
    double prev_offload_wait_s;          // and the training thread's waits for it
    double prev_copy_s, prev_copy_bytes; // and its copies
    double first_tok_s;                  // the first step's rate: all a run of one step has
    int stall_rank;                      // --inject-stall
    int64_t stall_step;
    int lock_fd; // the run directory's lock (kiln_dir_lock), -1 when not held
};

// The start banner's name for the model: the preset's when the model is that preset's (the vocabulary is the
// tokenizer's either way), else "custom" and its shape.
static void describe_model(const struct kiln_config *cfg, char *out, size_t cap) {
    const struct kiln_model_config *m = &cfg->model;
    struct kiln_config tmp;
    struct kiln_error e;
    int same = 0;
    if (!kiln_config_init(&tmp, cfg->preset, &e)) {
        tmp.model.vocab_size = m->vocab_size;
        same = kiln_model_config_hash(&tmp.model) == kiln_model_config_hash(m);
    }
    if (same)
        snprintf(out, cap, "%s", cfg->preset);
    else
        snprintf(out, cap,
                 "custom (L=%d, heads=%d, kv heads=%d, dim=%d, mlp=%d, vocab=%d, block=%d; from %s)",
                 m->n_layer, m->n_head, kiln_model_kv_heads(m), m->n_embd, kiln_model_mlp_hidden(m),
                 m->vocab_size, m->block_size, cfg->preset);
}

// The hang watchdog (parallel/comm/watchdog.h). Dumps go to RUN/hang, or to ./kiln-hang without --out (made only
// when there is something to dump). The ranks agree on a job id (rank 0's): it tells this job's dumps from
// those of an earlier attempt in the same directory.
static int start_watchdog(struct run *r, struct kiln_error *err) {
    struct kiln_config *cfg = r->cfg;
    uint64_t job = ((uint64_t)time(NULL) << 24) ^ ((uint64_t)getpid() << 8) ^ (uint64_t)(kiln_now_s() * 1e9);
    if (r->comm)
        kiln_comm_broadcast_host(r->comm, &job, sizeof(job), 0);
    char dir[1100] = "kiln-hang";
    if (cfg->out[0])
        snprintf(dir, sizeof(dir), "%s/hang", cfg->out);
    // one process without a communicator has nobody waiting on it, and its only progress marks are steps,
    // which a big model on the CPU may take longer than the timeout over: there it only answers SIGUSR2
    struct kiln_watchdog_opts o = {.dir = dir,
                                   .rank = r->env.rank,
                                   .world = r->env.world,
                                   .timeout_s = r->comm ? cfg->hang_timeout : 0,
                                   .job = job};
    return kiln_watchdog_start(&o, err);
}

// --recompute=auto (run/plan.h): the least recompute whose plan fits this rank's GPU
// (kiln_recompute_budget) as it is once the communicators are open (NCCL's buffers are not in the plan). The
// CPU states no limit: act, the default, there. Every rank takes the most recompute any rank chose, so that
// all run the same collectives (sequence parallelism's attention is one).
// Nothing fit the budget (the run goes on with block, which may not fit either): where keeping the layer
// inputs in host memory would, say so, with the mode auto would then take.
static void auto_offload_hint(const struct run *r, const struct kiln_config *cfg,
                              const struct kiln_param_table *pt, size_t budget) {
    struct kiln_config c = *cfg;
    c.offload |= KILN_OFFLOAD_ACTIVATIONS;
    size_t planned = 0;
    enum kiln_recompute rc =
        kiln_recompute_auto(&c, r->knobs, pt, r->env.world, &r->sp_lo, r->be.act_dtype, r->be.grad_dtype,
                            r->be.weights_alias_master, budget, &planned);
    if (planned <= budget)
        fprintf(stderr,
                "kiln: --recompute=auto: no mode fits the device's budget; with --offload=activations %s "
                "plans %.2f GiB (the layer inputs in pinned host memory)\n",
                kiln_recompute_name(rc), planned / 1073741824.0);
    else
        fprintf(stderr,
                "kiln: --recompute=auto: no mode fits the device's budget, nor with --offload=activations "
                "(%s: %.2f GiB); a smaller --batch or --seq, or --sp over more ranks\n",
                kiln_recompute_name(rc), planned / 1073741824.0);
}

// FP8's delayed scaling: the step's amaxes, the largest over every rank (in place, backend memory)
static void fp8_amax_max(void *user, float *amax, size_t n) {
    struct kiln_comm *c = user;
    if (c->be) // the step's casts wrote them on the compute stream
        c->be->ops->synchronize(c->be->ctx);
    struct kiln_coll k = {.op = KILN_COLL_ALL_REDUCE,
                          .send = amax,
                          .recv = amax,
                          .count = n,
                          .dtype = KILN_F32,
                          .red = KILN_RED_MAX,
                          .device = c->be ? c->be->device_memory : 0};
    kiln_comm_wait(c, kiln_comm_submit(c, &k, NULL));
}

// The master weights' initial values, into the optimizer's state and with them the compute copy (data
// parallelism's part of them: ZeRO-3 scatters them to the shards). An offloaded DDP's whole host master is
// filled in place: a second copy of an 8B model's weights would not fit the host.
static void init_master(struct run *r, uint64_t seed) {
    float *own = kiln_optim_state_host_master(r->os);
    float *host = own ? own : kiln_xmalloc(r->pt->total * sizeof(float));
    if (r->tp) // this rank's part of the whole model's init
        kiln_params_init_split(r->pt, &r->cfg->model, &r->tp_lo.split, r->tp_lo.tp_rank, host, seed);
    else
        kiln_params_init(r->pt, &r->cfg->model, host, seed);
    if (r->dp)
        kiln_dp_set_master(r->dp, host);
    else
        kiln_optim_state_set_master(r->os, host);
    if (!own)
        free(host);
}

static void resolve_auto_recompute(struct run *r, struct kiln_config *cfg,
                                   const struct kiln_param_table *pt) {
    size_t free_now = r->be.ops->mem_free(r->be.ctx);
    size_t budget = kiln_recompute_budget(free_now, r->knobs), planned = 0;
    enum kiln_recompute rc = KILN_RECOMPUTE_ACT;
    if (budget)
        rc = kiln_recompute_auto(cfg, r->knobs, pt, r->env.world, &r->sp_lo, r->be.act_dtype,
                                 r->be.grad_dtype, r->be.weights_alias_master, budget, &planned);
    else if (cfg->offload & KILN_OFFLOAD_ACTIVATIONS)
        rc = KILN_RECOMPUTE_SELECTIVE;
    if (r->comm) { // the most recompute any rank chose: the furthest down kiln_recompute_by_memory
        int32_t k = 0;
        while (kiln_recompute_by_memory[k] != rc)
            k++;
        kiln_comm_all_reduce_host(r->comm, &k, 1, KILN_I32, KILN_RED_MAX);
        rc = kiln_recompute_by_memory[k];
    }
    cfg->recompute = rc;
    if (r->rank0) { // (printed also with --quiet, as the resume line: it decides the run's memory and speed)
        if (budget)
            fprintf(stderr,
                    "kiln: --recompute=auto: %s (planned %.2f GiB of a %.2f GiB budget on the device)\n",
                    kiln_recompute_name(rc), planned / 1073741824.0, budget / 1073741824.0);
        else
            fprintf(stderr, "kiln: --recompute=auto: %s (the %s states no memory limit)\n",
                    kiln_recompute_name(rc), r->be.name);
        if (budget && planned > budget && !(cfg->offload & KILN_OFFLOAD_ACTIVATIONS))
            auto_offload_hint(r, cfg, pt, budget);
    }
}

// Sequence parallelism's options, over the model as a rank holds it (its share of the heads under tensor
// parallelism: the same head size)
static struct kiln_sp_opts sp_opts(struct run *r, const struct kiln_config *cfg) {
    struct kiln_sp_opts o = kiln_config_sp(cfg);
    kiln_model_heads_of(&cfg->model, r->tp_lo.tp > 1 ? &r->tp_lo.split : NULL, &r->sp_model);
    o.model = &r->sp_model;
    return o;
}

// The job's place (launcher environment), the backend on this rank's device, the communicators, the data
// (this rank's part), the model, resume, and the run directory.
static int run_setup(struct run *r, struct kiln_error *err) {
    struct kiln_config *cfg = r->cfg;
    int rc = kiln_dist_env_read(&r->env, NULL, err);
    if (rc)
        return rc;
    kiln_config_resolve(cfg, r->env.world);
    r->rank0 = r->env.rank == 0;
    // the ranks of a tensor- and sequence-parallel group read the same sequences: the loader partitions over
    // groups
    int tp = cfg->tp > 0 && r->env.world % cfg->tp == 0 ? cfg->tp : 1;
    int sp = cfg->sp > 0 && (r->env.world / tp) % cfg->sp == 0 ? cfg->sp : 1;
    if ((rc = open_data(cfg, r->env.rank / (sp * tp), r->env.world / (sp * tp), kiln_knobs_source_dir(r->knobs),
                        &r->data, err)))
        return rc;
    if ((rc = kiln_config_validate(cfg, err)) ||
        (rc = kiln_tp_plan(cfg->tp, cfg->tp_sp, r->env.world, r->env.rank, &cfg->model, &r->tp_lo, err)) ||
        (rc = kiln_sp_plan(sp_opts(r, cfg), r->tp_lo.cross, r->tp_lo.cross_rank,
                           r->env.local_world / r->tp_lo.tp > 0 ? r->env.local_world / r->tp_lo.tp : 1,
                           &r->sp_lo, err)) ||
        (rc = parse_step_list(cfg->inject_nan, &r->nan_steps, err)) ||
        (rc = parse_stall(cfg->inject_stall, r->env.world, &r->stall_rank, &r->stall_step, err)))
        return rc;
    kiln_tp_plan_overlap(&r->tp_lo, (enum kiln_tp_overlap)cfg->tp_overlap, cfg->tp_keep_gathered);
    r->tp_lo.copy_engine = r->knobs && r->knobs->tp_copy_engine;

    const char *device = kiln_backend_resolve(cfg->device);
    int gpu = !strcmp(device, "cuda");
    enum kiln_comm_kind kind;
    if ((rc = kiln_comm_choose(cfg->comm, &r->env, gpu, &kind, err)))
        return rc;
    int device_index = 0;
    if (gpu && r->env.world > 1) { // each rank takes GPU LOCAL_RANK; several share one only over MPI
        int n = kiln_backend_device_count(device);
        if (kind == KILN_COMM_NCCL && r->env.local_world > n)
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "LOCAL_WORLD_SIZE=%d (environment): %d ranks on this node but %d GPU(s) visible, and "
                "NCCL needs a GPU per rank (LOCAL_RANK %d has none); start %d ranks per node, or "
                "share GPUs with --comm=mpi (tests only)",
                r->env.local_world, r->env.local_world, n, r->env.local_rank, n);
        device_index = n > 0 ? r->env.local_rank % n : 0;
    }
    struct kiln_backend_opts bo = {.device_index = device_index,
                                   .deterministic = cfg->deterministic,
                                   .threads = cfg->threads,
                                   .grad_dtype = kiln_config_grad_dtype(cfg, gpu)};
    kiln_knobs_backend_opts(r->knobs, &bo);
    if ((rc = kiln_backend_open(device, &bo, &r->be, err)))
        return rc;
    r->be_open = 1;
    // several ranks, or one whose --comm names a transport (the data-parallel path at world size 1: what it
    // costs against no comm layer, and the NCCL path on one GPU), or --zero/--offload at world size 1
    // (ZeRO-3's gathers and the offloaded optimizer run through the same code)
    if (r->env.world > 1 || kind != KILN_COMM_SINGLE || cfg->zero ||
        (cfg->offload & KILN_OFFLOAD_OPTIMIZER)) {
        struct kiln_comm_open_opts co = {.kind = kind, .device_is_gpu = gpu, .be = &r->be, .timeout_s = 300};
        kiln_knobs_comm_opts(r->knobs, &co);
        if ((rc = kiln_comm_open_world(&r->env, &co, &r->comm, err)) ||
            (rc = kiln_comm_dup(r->comm, &r->ckpt_comm, err)))
            return rc;
        // before any collective that the config shapes: every rank runs the same job, or all stop together
        if ((rc = kiln_agree_config(r->comm, cfg, err))) {
            r->stopped_together = 1;
            return rc;
        }
        if ((rc = kiln_tp_create(&r->tp, &r->tp_lo, r->comm, &r->be, &cfg->model, cfg->batch_size,
                                 r->sp_lo.T_local, &r->cross, err)))
            return rc;
    }
    struct kiln_param_table pt;
    kiln_params_build_split(&pt, &cfg->model, r->tp ? &r->tp_lo.split : NULL);
    if (cfg->recompute == KILN_RECOMPUTE_AUTO)
        resolve_auto_recompute(r, cfg, &pt);
    struct kiln_model_opts go = {.B = cfg->batch_size,
                               .T = r->sp_lo.T_local,
                               .recompute = cfg->recompute,
                               .training = 1,
                               .offload_activations = (cfg->offload & KILN_OFFLOAD_ACTIVATIONS) != 0,
                               .split = r->tp_lo.split};
    kiln_model_tuning(&go, r->knobs);
    struct kiln_optim_state_opts so = {.total = pt.total}; // without data parallelism: every element, flat
    if (r->comm) {
        struct kiln_dp_opts dpo = {.zero = cfg->zero,
                                   .bucket_mb = cfg->bucket_mb,
                                   .prefetch = cfg->prefetch,
                                   .keep_gathered = !cfg->zero3_reshard,
                                   .accumulate_whole = cfg->zero3_accumulate == KILN_ACCUMULATE_WHOLE,
                                   .offload = (cfg->offload & KILN_OFFLOAD_OPTIMIZER) != 0,
                                   .host_threads = cfg->threads};
        int *groups = NULL; // --fp8-all-gather: the weights ZeRO-3 gathers as codes
        if (cfg->precision && cfg->fp8_all_gather) {
            groups = kiln_xcalloc((size_t)pt.n, sizeof(int));
            kiln_model_linear_groups(&cfg->model, &pt, groups);
            dpo.fp8_groups = groups;
        }
        kiln_dp_tuning(&dpo, r->knobs);
        kiln_dp_create(&r->dp, r->cross, &r->be, &pt, &dpo);
        free(groups);
        if (r->tp) { // the gradient norm over the group's parts, each copy counted once
            int nw, ns;
            struct kiln_norm_weight *w = kiln_tp_norm_weights(&r->tp_lo, &cfg->model, &pt, &nw);
            struct kiln_norm_weight *sums = kiln_tp_sum_ranges(&r->tp_lo, &cfg->model, &pt, &ns);
            kiln_dp_set_norm(r->dp, kiln_tp_comm(r->tp), w, nw, sums, ns);
            free(w);
            free(sums);
        }
        kiln_dp_model_opts(r->dp, &go); // what the model holds: ZeRO-2/3 no gradients, ZeRO-3 no weights
        kiln_dp_optim_opts(r->dp, &so); // and the optimizer's state: ZeRO shards it, offload moves it
    }
    struct kiln_optim_plan op; // quoted beside the model's own plan when memory runs out
    kiln_optim_state_plan(&so, r->be.act_dtype, r->be.weights_alias_master, &op);
    kiln_plan_add_optim(&go.beside, &op);
    rc = kiln_model_create(&r->g, &cfg->model, &r->be, &go, err);
    kiln_params_free(&pt);
    if (rc)
        return rc;
    r->pt = kiln_model_params(r->g);
    // precision first: a strategy that splits the linear layers installs its hook after FP8's, and runs its
    // local GEMMs through it
    if (cfg->precision) {
        struct kiln_fp8_opts fo = {.recipe = (enum kiln_fp8_recipe)cfg->fp8_recipe,
                                   .grad_fmt = cfg->fp8_grad ? KILN_FP8_E4M3 : KILN_FP8_E5M2,
                                   .include_head = cfg->fp8_head,
                                   .history = cfg->fp8_history};
        if ((rc = kiln_fp8_apply(&r->fp8, r->g, &r->be, &fo, cfg->model.n_layer, err)))
            return rc;
        if (r->comm && r->comm->size > 1) // delayed scaling: every rank's amaxes, the largest
            kiln_fp8_set_amax_reduce(r->fp8, fp8_amax_max, r->comm);
        if (r->dp && cfg->fp8_all_gather) // the layers' weights come gathered as codes
            kiln_fp8_set_weight_source(r->fp8, kiln_dp_fp8_weight, r->dp);
    }
    struct kiln_model_buffers mb;
    kiln_model_buffers(r->g, &mb);
    so.weights = mb.weights; // a flat master updates the model's compute copy (on the CPU, is it)
    so.beside_bytes = kiln_model_mem_plan(r->g)->total_bytes;
    if ((rc = kiln_optim_state_create(&r->os, &r->be, &so, err)))
        return rc;
    if (r->dp) // planned on a table built from the same config: the model's is the same layout
        kiln_dp_attach(r->dp, r->g, r->os);
    else
        r->spans = kiln_adamw_table_spans(r->pt, &r->n_spans);
    kiln_tp_attach(r->tp, r->g);
    if (r->sp_lo.sp > 1 &&
        (rc = kiln_sp_create(&r->sp, &r->sp_lo, r->cross, &r->be, r->g, &r->sp_model, cfg->batch_size, err)))
        return rc;
    init_master(r, cfg->seed); // after attaching: ZeRO-3 scatters the weights to the shards

    kiln_guards_init(&r->guards, cfg->spike_z, cfg->spike_window, cfg->max_bad_steps);
    // One job owns the run directory (rank 0 for the group), before anything in it is read or cleaned up: a
    // second job on the same --out would resume from the first's live checkpoint, remove its temporary
    // directories and rewrite its metrics.
    if (cfg->out[0] && r->rank0 &&
        ((rc = kiln_mkdir_p(cfg->out, err)) || (rc = kiln_dir_lock(cfg->out, "--out", &r->lock_fd, err))))
        return rc;
    int reporter;
    // a tensor-parallel rank reads its part of the whole model's tensors
    if (r->tp)
        kiln_params_build(&r->whole_pt, &cfg->model);
    struct kiln_ckpt_part_of part = {
        .model = &cfg->model, .split = r->tp_lo.split, .rank = r->tp_lo.tp_rank, .whole = &r->whole_pt};
    rc = resume(cfg, r->g, r->os, r->dp, r->tp ? &part : NULL, r->comm, r->data.train, &r->guards, &r->st,
                &reporter, err);
    if (rc == KILN_CKPT_NONE)
        rc = 0;
    if (rc && r->comm) { // every rank has the verdict: one reports it, all leave together
        r->stopped_together = 1;
        r->res->quiet_error = r->env.rank != reporter;
    }
    if (rc)
        return rc;
    if (r->st.precision) { // the recipe's state from the checkpoint (delayed scaling's amax histories)
        rc = kiln_fp8_state_from_json(r->fp8, r->st.precision, err);
        cJSON_Delete(r->st.precision);
        r->st.precision = NULL;
        if (rc)
            return rc;
    }
    r->res->start_step = (int)r->st.step;
    r->res->steps = (int)r->st.step;
    r->res->skipped_steps = (int)r->guards.skipped_total;
    if (cfg->out[0]) {
        if (r->rank0 && ((rc = write_config(cfg, err)) || (rc = write_vocab(cfg, r->data.tok, err)) ||
                         (rc = kiln_metrics_open(cfg, r->st.step, &r->metrics, err))))
            return rc;
        struct kiln_ckpt_policy policy = {.keep_last = cfg->keep_last, .keep_every = cfg->keep_every};
        if (cfg->checkpoint && r->dp)
            kiln_ckpt_writer_create_group(&r->writer, cfg->out, r->pt, &policy, &r->be, r->dp, r->ckpt_comm);
        else if (cfg->checkpoint)
            kiln_ckpt_writer_create(&r->writer, cfg->out, r->pt, &policy, &r->be);
        if (r->writer && r->tp) // model.safetensors holds the whole model, gathered from every part
            kiln_ckpt_writer_set_tp(r->writer, r->tp, &r->whole_pt);
        if (r->writer && r->knobs)
            kiln_ckpt_writer_set_delay(r->writer, r->knobs->ckpt_delay_ms);
    }

    int B = cfg->batch_size, T = cfg->seq_len;
    r->accum = kiln_config_micro_steps(cfg);
    r->tokens_per_step = (double)B * T * r->accum * r->sp_lo.dp; // the whole job's
    r->peak = cfg->peak_flops > 0 ? cfg->peak_flops : r->be.peak_flops;
    // the whole model's parameters (a tensor-parallel rank holds a part): MFU counts the job's FLOPs
    size_t n_params = r->tp ? r->whole_pt.n_params : r->pt->n_params;
    r->fpt = kiln_model_flops_per_token(&cfg->model, n_params, T, 0);
    r->fpt_causal = kiln_model_flops_per_token(&cfg->model, n_params, T, 1);
    r->fpt_recompute = kiln_model_recompute_flops_per_token(&cfg->model, cfg->recompute, T);
    r->bt = (struct batch){.in = kiln_xmalloc((size_t)B * T * sizeof(int32_t)),
                           .tgt = kiln_xmalloc((size_t)B * T * sizeof(int32_t)),
                           .sp = &r->sp_lo,
                           .B = B};
    if (r->sp) {
        r->bt.in_l = kiln_xmalloc((size_t)B * r->sp_lo.T_local * sizeof(int32_t));
        r->bt.tgt_l = kiln_xmalloc((size_t)B * r->sp_lo.T_local * sizeof(int32_t));
    }
    if (!cfg->quiet && r->rank0) {
        char model[256];
        describe_model(cfg, model, sizeof(model));
        fprintf(stderr, "kiln: %s | %.2fM params | %s (%s) | B=%d T=%d accum=%d | grads %s | %d steps\n",
                model, n_params / 1e6, r->be.name, r->be.device_name, B, T, r->accum,
                kiln_dtype_name(r->be.grad_dtype), cfg->max_steps);
        int hs = kiln_model_head_size(&cfg->model);
        if (r->be.attention_fast && !r->be.attention_fast(hs))
            fprintf(
                stderr,
                "kiln: note: head size %d (--dim / --heads) takes %s's reference attention kernels, tens of "
                "times slower than its tiled ones (head sizes 32, 48, 64, 80, 96, 128)\n",
                hs, r->be.name);
        if (r->comm) {
            char where[256];
            kiln_dist_env_describe(&r->env, where, sizeof(where));
            char spd[128] = "";
            if (r->sp)
                snprintf(spd, sizeof(spd), ", sp %d (%d Ulysses x %d ring, %d tokens a rank) x dp %d",
                         r->sp_lo.sp, r->sp_lo.ulysses, r->sp_lo.ring, r->sp_lo.T_local, r->sp_lo.dp);
            fprintf(stderr, "kiln: %d ranks over %s (%s), zero %d%s, %.0f tokens per step\n", r->env.world,
                    kiln_comm_kind_name(r->comm->kind), where, cfg->zero, spd, r->tokens_per_step);
        }
    }
    return start_watchdog(r, err);
}

// One optimizer step: the micro-steps' forward and backward (the last one's gradients reduced across ranks as
// they complete), the loss and norm every rank agrees on, the guards, and AdamW.
static void run_step(struct run *r, int64_t step, struct step_log *sl) {
    struct kiln_config *cfg = r->cfg;
    float lr = kiln_lr_at(cfg, (int)step);
    double loss = 0;
    for (int micro = 0; micro < r->accum; micro++) {
        const int32_t *in, *tgt;
        next_batch(&r->bt, r->data.train, &in, &tgt);
        if (r->dp)
            kiln_dp_micro_step(r->dp, micro, r->accum);
        if (micro == 0 ||
            (r->dp && kiln_dp_external_grads(r->dp))) // ZeRO-2: fresh gradients every micro-step
            kiln_model_zero_grad(r->g);
        loss += kiln_model_forward(r->g, in, tgt, (float)(1.0 / r->tokens_per_step), cfg->z_loss) / r->accum;
        kiln_model_backward(r->g);
        if (r->dp)
            kiln_dp_after_backward(r->dp);
    }
    double norm;
    if (r->dp) {
        // the guards must see the same numbers on every rank, so that every rank skips the same steps: the
        // ranks' losses are summed in the norm's reduction
        norm = kiln_dp_grad_norm(r->dp, &loss);
        loss /= r->cross->size; // (a tensor-parallel group's ranks have the same loss)
    } else {
        struct kiln_model_buffers b;
        kiln_model_buffers(r->g, &b);
        norm = kiln_adamw_grad_norm(&r->be, b.grads, r->pt->total);
    }
    if (in_step_list(r->nan_steps, step + 1))
        loss = norm = NAN;
    enum kiln_skip why = kiln_guards_check(&r->guards, loss, norm);
    if (why == KILN_SKIP_NONE) {
        r->st.opt_step++; // AdamW's bias correction counts applied updates only
        struct kiln_adamw_hparams h = {.lr = lr,
                                       .beta1 = cfg->beta1,
                                       .beta2 = cfg->beta2,
                                       .eps = cfg->eps,
                                       .weight_decay = cfg->weight_decay,
                                       .grad_clip = cfg->grad_clip,
                                       .grad_scale = 1.0f,
                                       .step = (int)r->st.opt_step,
                                       .stochastic_rounding = cfg->stochastic_rounding,
                                       .seed = cfg->seed};
        if (r->dp) {
            kiln_dp_adamw(r->dp, &h, norm);
        } else {
            struct kiln_model_buffers b;
            kiln_model_buffers(r->g, &b);
            struct kiln_adamw_buffers ab;
            kiln_optim_state_buffers(r->os, &ab);
            ab.grads = b.grads;
            kiln_adamw_step(&r->be, &ab, r->spans, r->n_spans, &h, norm);
        }
    }
    r->st.step = step + 1;
    r->st.tokens += (uint64_t)r->tokens_per_step;
    *sl = (struct step_log){.step = r->st.step,
                            .loss = loss,
                            .norm = norm,
                            .val_loss = NAN,
                            .ckpt_stall_ms = NAN,
                            .lr = lr,
                            .skipped = why};
}

static void note_skip(struct run *r, const struct step_log *sl) {
    char line[256];
    const struct kiln_guards *gd = &r->guards;
    if (sl->skipped == KILN_SKIP_NAN)
        snprintf(line, sizeof(line),
                 "step %lld: update skipped: non-finite loss %g or grad norm %g (%d in a "
                 "row, %lld skipped in all)",
                 (long long)sl->step, sl->loss, sl->norm, gd->consecutive, (long long)gd->skipped_total);
    else
        snprintf(line, sizeof(line),
                 "step %lld: update skipped: %s spike, z = %.1f > %g (loss %.4f, grad "
                 "norm %.4g; %d in a row, %lld skipped in all)",
                 (long long)sl->step, sl->skipped == KILN_SKIP_SPIKE_LOSS ? "loss" : "grad-norm", gd->last_z,
                 (double)r->cfg->spike_z, sl->loss, sl->norm, gd->consecutive, (long long)gd->skipped_total);
    kiln_progress_note(&r->prog, line);
}

// --sample-every: a short sample from the model as it trains (rank 0, with the training weights; the KV
// caches are made for it each time), printed as a progress note on one line.
static void sample_note(struct run *r) {
    const struct kiln_config *cfg = r->cfg;
    if (!r->rank0 || !cfg->sample_every || r->st.step % cfg->sample_every)
        return;
    if (r->dp)
        kiln_dp_settle(r->dp); // an offloaded step still running: decoding reads every weight, without hooks
    int maxT = cfg->model.block_size < 256 ? cfg->model.block_size : 256, n = maxT < 64 ? maxT : 64,
        V = cfg->model.vocab_size;
    struct kiln_error err;
    if (kiln_model_decode_begin(r->g, 1, maxT, &err)) {
        kiln_progress_note(&r->prog, "sample skipped: no memory for the KV cache");
        return;
    }
    float *logits = kiln_xmalloc((size_t)V * sizeof(float));
    struct kiln_bytes text = {0};
    struct kiln_rng rng;
    kiln_rng_seed(&rng, cfg->seed ^ (uint64_t)r->st.step);
    int eot = kiln_tokenizer_eot(r->data.tok);
    int32_t tok = eot >= 0 ? eot : 0;
    for (int pos = 0; pos < n; pos++) {
        kiln_model_decode_step(r->g, &tok, pos, logits);
        tok = kiln_sample_token(logits, V, 0.8f, 40, &rng);
        if (kiln_tokenizer_decode(r->data.tok, &tok, 1, &text, &err))
            break;
    }
    char line[400];
    int k = snprintf(line, sizeof(line), "step %lld sample: ", (long long)r->st.step);
    for (size_t i = 0; i < text.n && k < (int)sizeof(line) - 1; i++) // one line: control bytes as spaces
        line[k++] = (unsigned char)text.data[i] < 32 ? ' ' : text.data[i];
    line[k] = 0;
    kiln_progress_note(&r->prog, line);
    kiln_bytes_free(&text);
    free(logits);
}

// After a step: the guards' verdict, evaluation, a checkpoint when due, metrics and progress. Returns 0 or an
// error; *stop is set when a signal (that every rank agreed on) ends the run here.
static int run_after_step(struct run *r, struct step_log *sl, double dt, int *stop_out,
                          struct kiln_error *err) {
    struct kiln_config *cfg = r->cfg;
    struct kiln_train_result *res = r->res;
    kiln_fp8_after_step(r->fp8); // delayed scaling: the step's amaxes join the histories
    sl->tok_s = r->tokens_per_step / dt;
    sl->ms = dt * 1e3;
    sl->tokens = (int64_t)r->st.tokens;
    sl->slowest_ms = 0;
    if (r->dp) { // this step's share of the offloaded optimizer's time (0 without offload)
        sl->comm_ops = (int64_t)r->comm->seq;
        double off = kiln_dp_offload_s(r->dp), wait = kiln_dp_offload_wait_s(r->dp);
        sl->offload_ms = (off - r->prev_offload_s) * 1e3;
        sl->offload_wait_ms = (wait - r->prev_offload_wait_s) * 1e3;
        r->prev_offload_s = off;
        r->prev_offload_wait_s = wait;
        double cs, cb = kiln_dp_offload_copies(r->dp, &cs);
        sl->offload_copy_gbps =
            cs > r->prev_copy_s ? (cb - r->prev_copy_bytes) / (cs - r->prev_copy_s) / 1e9 : 0;
        r->prev_copy_s = cs;
        r->prev_copy_bytes = cb;
    }
    res->final_loss = sl->loss;
    res->steps = (int)r->st.step;
    res->skipped_steps = (int)r->guards.skipped_total;
    if (sl->skipped)
        note_skip(r, sl);
    if (kiln_guards_exhausted(&r->guards)) {
        if (r->metrics)
            log_metrics(r->metrics, sl, &r->guards, kiln_model_mem_peak(r->g), 0, 0, 0, NAN);
        kiln_progress_end(&r->prog);
        struct kiln_error we;
        if (r->writer && kiln_ckpt_writer_join(r->writer, NULL, &we))
            fprintf(stderr, "kiln: the last checkpoint write failed too: %s\n", we.msg);
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "training stopped at step %lld (--max-bad-steps=%d): %d steps in a "
            "row were skipped, the last for %s; the newest checkpoint (step %lld) holds the last good "
            "state; lower --lr, raise --spike-z or check the data, then resume",
            (long long)r->st.step, cfg->max_bad_steps, r->guards.consecutive, kiln_skip_name(sl->skipped),
            (long long)(r->last_ckpt_step > 0 ? r->last_ckpt_step : 0));
    }
    int last = r->st.step == cfg->max_steps;
    sample_note(r);
    if (r->data.val && ((cfg->eval_every && r->st.step % cfg->eval_every == 0) || last)) {
        sl->val_loss = evaluate(r->g, r->data.val, cfg, &r->bt, r->sp_lo.dp, r->comm);
        res->final_val_loss = sl->val_loss;
        char line[160];
        snprintf(line, sizeof(line), "step %lld: val loss %.4f", (long long)r->st.step, sl->val_loss);
        kiln_progress_note(&r->prog, line);
    }
    // a signal may reach one rank first: all stop at the same step; the same reduction finds the slowest
    // rank's step time, and whether any rank still writes its part of the checkpoint in flight
    double agreed[3] = {stop_requested, sl->ms, r->writer && kiln_ckpt_writer_busy(r->writer)};
    if (r->comm)
        kiln_comm_all_reduce_host(r->ckpt_comm, agreed, 3, KILN_F64, KILN_RED_MAX);
    int32_t stop = (int32_t)agreed[0];
    double slowest_ms = agreed[1];
    if (r->comm)
        sl->slowest_ms = slowest_ms;
    // every rank's files are written: the checkpoint is installed now, its collectives on this thread
    if (r->writer && kiln_ckpt_writer_awaiting(r->writer) && agreed[2] == 0) {
        int rc = kiln_ckpt_writer_commit(r->writer, err);
        if (rc)
            return rc;
    }
    // A checkpoint at its cadence (not in the middle of a run of skipped steps: those are not progress, and a
    // run stopped by --max-bad-steps keeps its last good checkpoint), at the end, and on a stop signal.
    int due =
        (cfg->ckpt_every && r->st.step % cfg->ckpt_every == 0 && r->guards.consecutive == 0) || last || stop;
    if (r->writer && due) {
        if (r->dp)
            kiln_dp_gather_master(r->dp);
        kiln_loader_get_state(r->data.train, &r->st.loader);
        r->st.precision = kiln_fp8_state_to_json(r->fp8);
        cJSON *state = kiln_train_state_to_json(&r->st, cfg, &r->guards, kiln_lr_at(cfg, (int)r->st.step));
        cJSON_Delete(r->st.precision);
        r->st.precision = NULL;
        int rc = kiln_ckpt_writer_start(r->writer, r->os, r->st.step, state, &sl->ckpt_stall_ms, err);
        if (rc)
            return rc;
        sl->prev_ckpt_write_ms = kiln_ckpt_writer_last_write_ms(r->writer);
        r->last_ckpt_step = r->st.step;
        res->checkpoints++;
        if (sl->ckpt_stall_ms > res->max_ckpt_stall_ms)
            res->max_ckpt_stall_ms = sl->ckpt_stall_ms;
    }
    double comm_ms = r->dp ? kiln_dp_wait_s(r->dp) * 1e3 : NAN;
    if (r->metrics &&
        (r->st.step % cfg->log_every == 0 || last || !isnan(sl->val_loss) || sl->skipped || stop || due)) {
        double tok_s = sl->tok_s, pk = r->peak;
        log_metrics(r->metrics, sl, &r->guards, kiln_model_mem_peak(r->g),
                    pk > 0 ? r->fpt * tok_s / pk / r->env.world : 0,
                    pk > 0 ? r->fpt_causal * tok_s / pk / r->env.world : 0,
                    pk > 0 && r->fpt_recompute > 0 ? (r->fpt + r->fpt_recompute) * tok_s / pk / r->env.world
                                                   : 0,
                    comm_ms);
    }
    char extra[320] = ""; // (the longest line these parts make is about 170 bytes)
    int n = 0;
    if (r->env.world > 1)
        n = snprintf(extra, sizeof(extra),
                     "%.0f tok/s/rank | slowest rank %.1f ms/step | comm wait %.1f ms/step | ",
                     sl->tok_s / r->env.world, slowest_ms,
                     comm_ms - r->prev_comm_ms); // this step's; the metrics keep the running total
    if (r->peak > 0)
        n += snprintf(extra + n, sizeof(extra) - (size_t)n, "MFU %.1f%% (causal %.1f%%) | ",
                      100.0 * r->fpt * sl->tok_s / r->peak / r->env.world,
                      100.0 * r->fpt_causal * sl->tok_s / r->peak / r->env.world);
    n += snprintf(extra + n, sizeof(extra) - (size_t)n, "mem %.2f GiB",
                  (double)kiln_model_mem_peak(r->g) / (1 << 30));
    if (sl->offload_ms > 0 && sl->ms > 0) // the share of the step spent waiting on the host's optimizer
        n += snprintf(extra + n, sizeof(extra) - (size_t)n, " | host wait %.0f%%",
                      100.0 * sl->offload_wait_ms / sl->ms);
    if (!isnan(sl->ckpt_stall_ms))
        snprintf(extra + n, sizeof(extra) - (size_t)n, " | ckpt stall %.1fms", sl->ckpt_stall_ms);
    kiln_progress_update(&r->prog, (int)r->st.step, sl->loss, sl->tok_s, extra);
    r->prev_comm_ms = comm_ms;
    if (stop)
        res->stop_signal = stop;
    *stop_out = stop != 0;
    return 0;
}

// The end of a run that finished its steps: the last checkpoint written, and model.safetensors (rank 0).
static int run_finish(struct run *r, struct kiln_error *err) {
    struct kiln_config *cfg = r->cfg;
    int rc;
    if (r->writer && (rc = kiln_ckpt_writer_join(r->writer, NULL, err)))
        return rc;
    if (!cfg->out[0] || r->res->stop_signal || !cfg->save_model)
        return 0;
    if (r->dp)
        kiln_dp_gather_master(r->dp);
    if (!r->rank0 && !(r->tp && r->tp_lo.cross_rank == 0))
        return 0;
    float *host = kiln_xmalloc(r->pt->total * sizeof(float));
    if (r->dp)
        kiln_dp_get_master(r->dp, host);
    else
        kiln_optim_state_get_master(r->os, 0, r->pt->total, host);
    const struct kiln_param_table *pt = r->pt;
    struct kiln_param_table whole;
    if (r->tp) { // rank 0 writes the whole model, from every part its group holds
        kiln_params_build(&whole, &cfg->model);
        float *all = r->rank0 ? kiln_xmalloc(whole.total * sizeof(float)) : NULL;
        kiln_tp_gather_whole(r->tp, r->pt, host, &whole, all);
        free(host);
        host = all;
        pt = &whole;
    }
    rc = 0;
    if (r->rank0) {
        char path[1200];
        snprintf(path, sizeof(path), "%s/model.safetensors", cfg->out);
        rc = kiln_write_model_safetensors(path, pt, host, cfg, err);
    }
    if (r->tp)
        kiln_params_free(&whole);
    free(host);
    return rc;
}

// the communicators of a run that ended on an error every rank shares, for kiln_train_end_job
static struct kiln_comm *ended_comm, *ended_ckpt_comm;

static int run_teardown(struct run *r, int rc, struct kiln_error *err) {
    if (r->writer) {
        // after an error the ranks may not all be here, and a group's commit is collective: the write in
        // flight is left uninstalled (run_finish committed it on success)
        struct kiln_error we;
        if (rc)
            kiln_ckpt_writer_abandon(r->writer);
        else if (kiln_ckpt_writer_join(r->writer, NULL, &we)) {
            *err = we;
            rc = we.code;
        }
        kiln_ckpt_writer_free(r->writer);
    }
    free(r->bt.in);
    free(r->bt.tgt);
    free(r->bt.in_l);
    free(r->bt.tgt_l);
    free(r->nan_steps);
    kiln_metrics_close(r->metrics);
    kiln_guards_free(&r->guards);
    kiln_dp_free(r->dp); // (before the state: an offloaded step it started is the state's pipeline's)
    kiln_optim_state_free(r->os);
    free(r->spans);
    kiln_fp8_free(r->fp8);
    kiln_model_free(r->g);
    if (r->tp)
        kiln_params_free(&r->whole_pt);
    // after an error the other ranks may be inside a collective that this one will never join: closing the
    // communicators (MPI_Finalize waits for them) would hang, so cmd/ ends the job instead
    // (kiln_comm_abort_job)
    r->res->world = r->env.world > 0 ? r->env.world : 1;
    r->res->rank = r->env.rank;
    if (rc && r->comm && !r->stopped_together) {
        r->res->abort_job = 1; // the watchdog keeps watching until the job ends
    } else if (rc && r->comm) {
        // every rank has the same error: each reports it, then they leave together (kiln_train_end_job), so
        // that no rank's exit makes the launcher kill another before its report is out
        kiln_watchdog_stop();
        ended_comm = r->comm;
        ended_ckpt_comm = r->ckpt_comm;
        r->res->end_job = 1;
    } else {
        if (r->comm) // every rank is done with the step's collectives before any leaves
            kiln_comm_barrier(r->comm);
        kiln_watchdog_stop(); // before the communicators it could abort are gone
        kiln_sp_free(r->sp);  // and its own, split from the world (after an error the job ends instead)
        if (r->tp)
            kiln_comm_close(r->cross);
        kiln_tp_free(r->tp);
        kiln_comm_close(r->ckpt_comm);
        kiln_comm_close(r->comm);
    }
    if (!r->res->abort_job)
        kiln_watchdog_stop();
    if (r->be_open)
        kiln_backend_close(&r->be);
    run_data_free(&r->data);
    kiln_dir_unlock(r->lock_fd); // last: everything this run wrote into the directory is closed
    return rc;
}

void kiln_train_end_job(void) {
    if (!ended_comm)
        return;
    kiln_comm_barrier(ended_comm);
    kiln_comm_close(ended_ckpt_comm);
    kiln_comm_close(ended_comm);
    ended_comm = ended_ckpt_comm = NULL;
}

// The note a slow first step prints: a thread started before it, which waits 2 s unless the step ends first.
struct first_step {
    struct kiln_progress *prog;
    long long step;
    double tokens;
    int fresh;
    atomic_int done;
};

static void *first_step_note(void *arg) {
    struct first_step *fs = arg;
    for (int i = 0; i < 40; i++) {
        if (atomic_load(&fs->done))
            return NULL;
        usleep(50000);
    }
    char line[256];
    snprintf(line, sizeof(line), "kiln: step %lld is under way (%.0f tokens%s); its line comes when it ends",
             fs->step, fs->tokens, fs->fresh ? "; the first step also warms up" : "");
    kiln_progress_note(fs->prog, line);
    return NULL;
}

int kiln_train(struct kiln_config *cfg, const struct kiln_knobs *knobs, struct kiln_train_result *res,
               struct kiln_error *err) {
    memset(res, 0, sizeof(*res));
    res->final_val_loss = NAN;
    struct run r;
    memset(&r, 0, sizeof(r));
    r.cfg = cfg;
    r.knobs = knobs;
    r.res = res;
    r.lock_fd = -1;
    stop_requested = 0;
    in_loop = 0;
    int rc = run_setup(&r, err);
    if (rc)
        return run_teardown(&r, rc, err);
    kiln_progress_begin(&r.prog, cfg->max_steps, !cfg->quiet && r.rank0);
    // the first step's progress line comes only when it ends, minutes later for a large model on a CPU: a
    // step still running after 2 s says so
    struct first_step fs = {
        .prog = &r.prog, .step = r.st.step + 1, .tokens = r.tokens_per_step, .fresh = r.st.step == 0};
    pthread_t fs_thread;
    int fs_on = r.prog.enabled && r.st.step < cfg->max_steps &&
                pthread_create(&fs_thread, NULL, first_step_note, &fs) == 0;
    in_loop = 1;
    r.start = r.st.step;
    r.last_ckpt_step = r.start > 0 ? r.start : -1;
    for (int64_t step = r.start; step < cfg->max_steps; step++) {
        kiln_flight_set_step(step + 1);
        // as --inject-crash, only in a run that started fresh: the restart after the hang runs on
        if (step + 1 == r.stall_step && r.env.rank == r.stall_rank && r.start == 0)
            kiln_train_injected_stall(step + 1);
        if (cfg->inject_crash && step + 1 == cfg->inject_crash && r.start == 0) {
            // the checkpoint in flight completes first, so that tests know where the run resumes (kills at
            // random moments, during writes too, are tested with SIGKILL)
            if (r.writer)
                kiln_ckpt_writer_join(r.writer, NULL, NULL);
            fprintf(stderr, "kiln: --inject-crash=%d: aborting before step %d (testing)\n", cfg->inject_crash,
                    cfg->inject_crash);
            abort();
        }
        double t0 = kiln_now_s();
        struct step_log sl;
        run_step(&r, step, &sl);
        r.be.ops->synchronize(r.be.ctx);
        double dt = kiln_now_s() - t0;
        if (fs_on) { // before the step's own line
            atomic_store(&fs.done, 1);
            pthread_join(fs_thread, NULL);
            fs_on = 0;
        }
        if (step > r.start) { // the first step pays one-time costs
            r.timed_s += dt;
            r.timed_tokens += (long)r.tokens_per_step;
        } else {
            r.first_tok_s = r.tokens_per_step / dt;
        }
        int stop = 0;
        if ((rc = run_after_step(&r, &sl, dt, &stop, err)))
            return run_teardown(&r, rc, err);
        if (stop)
            break;
    }
    kiln_progress_end(&r.prog);
    // a run of one step has only its first, slower one to show
    res->tokens_per_s = r.timed_s > 0 ? r.timed_tokens / r.timed_s : r.first_tok_s;
    rc = run_finish(&r, err);
    return run_teardown(&r, rc, err);
}
