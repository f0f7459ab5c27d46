// Resume: N steps straight equal N/2 + resume + N/2 bit for bit; checkpoints do not perturb training; corrupt
// checkpoints fall back to the previous one; a different model is refused and a safe change allowed; NaN
// steps are skipped and counted; --max-bad-steps stops the run keeping the last good checkpoint; the spike
// detector's statistics and its checkpoint round trip; metrics.jsonl truncation; counts in state.json beyond
// 2^53, or contradicting each other, are refused. Tiny models on the CPU.
#include "test_util.h"

#include <cjson/cJSON.h>

#include "io/checkpoint.h"
#include "io/fsutil.h"
#include "run/guards.h"
#include "run/train_ckpt.h"
#include "run/metrics.h"
#include "run/trainer.h"
#include "util/sha256.h"

// ---- helpers ---------------------------------------------------------------------------------------

static uint64_t run_seed; // one model seed per test run: fresh weights and data order every run

// Trains a tiny model into out with the given extra flags ("--name=value" strings, NULL-terminated).
static int train(const char *out, int max_steps, struct kiln_train_result *res, struct kiln_error *err, ...) {
    char *argv[32];
    char a_out[1100], a_steps[32], a_seed[48];
    int argc = 0;
    snprintf(a_out, sizeof(a_out), "--out=%s", out);
    snprintf(a_steps, sizeof(a_steps), "--max-steps=%d", max_steps);
    snprintf(a_seed, sizeof(a_seed), "--seed=%llu", (unsigned long long)run_seed);
    char *base[] = {"--layers=1",
                    "--heads=2",
                    "--dim=32",
                    "--seq=32",
                    "--batch=4",
                    "--eval-every=5",
                    "--eval-steps=2",
                    "--warmup=3",
                    "--threads=1",
                    "--quiet",
                    a_out,
                    a_steps,
                    a_seed};
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++)
        argv[argc++] = base[i];
    va_list ap;
    va_start(ap, err);
    for (char *s; (s = va_arg(ap, char *));)
        argv[argc++] = s;
    va_end(ap);
    struct kiln_config cfg;
    int rc = kiln_config_parse(&cfg, argc, argv, err);
    if (rc)
        return rc;
    return kiln_train(&cfg, NULL, res, err); // every knob at its default
}

__attribute__((noinline)) static char *read_all(const char *path, size_t *n) {
    char *d = NULL;
    struct kiln_error err;
    if (kiln_read_file(path, &d, n, &err))
        fail_msg("%s", err.msg);
    return d;
}

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    if (na != nb || memcmp(x, y, na))
        fail_msg("%s and %s differ (%zu vs %zu bytes)", a, b, na, nb);
    free(x);
    free(y);
}

// The "loss" field of metrics line `step`, as written (bitwise comparable), or "" when absent.
static void loss_at(const char *run, int step, char *out, size_t cap) {
    char path[1200], key[48];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    snprintf(key, sizeof(key), "{\"step\":%d,\"loss\":", step);
    size_t n;
    char *d = read_all(path, &n);
    out[0] = 0;
    char *p = strstr(d, key);
    if (p) {
        p += strlen(key);
        snprintf(out, cap, "%.*s", (int)strcspn(p, ","), p);
    }
    free(d);
}

static char *metrics_line(const char *run, int step) { // malloc'd line or NULL
    char path[1200], key[48];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    snprintf(key, sizeof(key), "{\"step\":%d,", step);
    size_t n;
    char *d = read_all(path, &n), *p = strstr(d, key), *r = NULL;
    if (p)
        r = strndup(p, strcspn(p, "\n"));
    free(d);
    return r;
}

static void sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

static cJSON *read_state(const char *run, int step) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/ckpt/step_%08d/state.json", run, step);
    size_t n;
    char *d = read_all(path, &n);
    cJSON *j = cJSON_Parse(d);
    free(d);
    assert_non_null(j);
    return j;
}

static double json_num(const cJSON *j, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b)
        v = cJSON_GetObjectItemCaseSensitive(v, b);
    if (!cJSON_IsNumber(v))
        fail_msg("state.json: %s%s%s missing", a, b ? "." : "", b ? b : "");
    return v->valuedouble;
}

// ---- training, resumed -----------------------------------------------------------------------------

static void test_resume_is_bit_exact_and_checkpoints_do_not_perturb(void **state) {
    (void)state;
    char root[256], a[300], b[300], c[300], p1[400], p2[400];
    test_tmpdir(root, sizeof(root));
    snprintf(a, sizeof(a), "%s/a", root);
    snprintf(b, sizeof(b), "%s/b", root);
    snprintf(c, sizeof(c), "%s/c", root);
    struct kiln_train_result res;
    struct kiln_error err = {0};
    // a: 16 steps, a checkpoint every 8 and one every step of a second run (c) to show they change nothing
    if (train(a, 16, &res, &err, "--ckpt-every=8", "--keep-last=0", NULL))
        fail_msg("%s", err.msg);
    assert_int_equal(res.steps, 16);
    assert_int_equal(res.checkpoints, 2);
    if (train(c, 16, &res, &err, "--ckpt-every=1", "--keep-last=2", NULL))
        fail_msg("%s", err.msg);
    snprintf(p1, sizeof(p1), "%s/model.safetensors", a);
    snprintf(p2, sizeof(p2), "%s/model.safetensors", c);
    assert_same_file(p1, p2);
    // the checkpoint at the end holds exactly the final weights
    snprintf(p2, sizeof(p2), "%s/ckpt/step_00000016/model.safetensors", a);
    struct kiln_ckpt ck;
    snprintf(p2, sizeof(p2), "%s/ckpt/step_00000016", a);
    if (kiln_ckpt_load(p2, &ck, &err))
        fail_msg("%s", err.msg);
    struct kiln_safetensors *fin;
    if (kiln_safetensors_open(&fin, p1, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(kiln_safetensors_count(fin), kiln_safetensors_count(ck.model));
    for (int i = 0; i < kiln_safetensors_count(fin); i++) {
        const struct kiln_st_tensor *t = kiln_safetensors_at(fin, i);
        const struct kiln_st_tensor *u = kiln_safetensors_find(ck.model, t->name);
        assert_non_null(u);
        assert_int_equal(kiln_st_tensor_bytes(t), kiln_st_tensor_bytes(u));
        assert_memory_equal(t->data, u->data, kiln_st_tensor_bytes(t));
    }
    kiln_safetensors_close(fin);
    kiln_ckpt_close(&ck);

    // b: only a's step-8 checkpoint, resumed to 16
    sh("mkdir -p '%s/ckpt' && cp -r '%s/ckpt/step_00000008' '%s/ckpt/'", b, a, b);
    if (train(b, 16, &res, &err, "--ckpt-every=8", NULL))
        fail_msg("%s", err.msg);
    assert_int_equal(res.start_step, 8);
    assert_int_equal(res.steps, 16);
    snprintf(p2, sizeof(p2), "%s/model.safetensors", b);
    assert_same_file(p1, p2);
    for (int s = 9; s <= 16; s++) {
        char la[64], lb[64];
        loss_at(a, s, la, sizeof(la));
        loss_at(b, s, lb, sizeof(lb));
        assert_true(la[0]);
        assert_string_equal(la, lb);
    }
    char *l8 = metrics_line(b, 8);
    assert_null(l8); // b's metrics begin after the resumed step
    // the two final checkpoints' states agree too (tokens, loader position, guards)
    cJSON *sa = read_state(a, 16), *sb = read_state(b, 16);
    assert_true(json_num(sa, "loader", "position") == json_num(sb, "loader", "position"));
    assert_true(json_num(sa, "tokens", NULL) == 16.0 * 4 * 32);
    assert_true(json_num(sb, "tokens", NULL) == 16.0 * 4 * 32);
    assert_true(json_num(sa, "opt_step", NULL) == 16);
    cJSON_Delete(sa);
    cJSON_Delete(sb);

    // resuming a finished run with more steps continues; its metrics keep the old lines
    if (train(a, 18, &res, &err, "--ckpt-every=8", "--keep-last=0", NULL))
        fail_msg("%s", err.msg);
    assert_int_equal(res.start_step, 16);
    assert_int_equal(res.steps, 18);
    char l[64];
    loss_at(a, 3, l, sizeof(l));
    assert_true(l[0]);
    test_rmrf(root);
}

enum corruption { FLIP_BYTE, TRUNCATE, MISSING_FILE, MISSING_STATE, MISSING_TENSOR, N_CORRUPTIONS };

// Rewrites run's step_N as a checkpoint whose hashes are right but whose model lacks one (random) tensor.
static void drop_a_tensor(const char *run, int step, uint64_t *rs) {
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/ckpt/step_%08d", run, step);
    struct kiln_ckpt ck;
    struct kiln_error err;
    if (kiln_ckpt_load(dir, &ck, &err))
        fail_msg("%s", err.msg);
    int n = kiln_safetensors_count(ck.model), drop = (int)(test_rand_u64(rs) % (uint64_t)n), k = 0;
    struct kiln_st_tensor *t = calloc((size_t)n, sizeof(*t)),
                          *o = calloc((size_t)kiln_safetensors_count(ck.optim), sizeof(*o));
    for (int i = 0; i < n; i++)
        if (i != drop)
            t[k++] = *kiln_safetensors_at(ck.model, i);
    for (int i = 0; i < kiln_safetensors_count(ck.optim); i++)
        o[i] = *kiln_safetensors_at(ck.optim, i);
    struct kiln_ckpt_file files[2] = {{"model.safetensors", t, k},
                                      {"optim.safetensors", o, kiln_safetensors_count(ck.optim)}};
    if (kiln_ckpt_save(run, step, files, 2, ck.state, NULL, &err))
        fail_msg("%s", err.msg);
    if (kiln_ckpt_verify(dir, &err)) // still a well-formed checkpoint: only the trainer can tell
        fail_msg("%s", err.msg);
    free(t);
    free(o);
    kiln_ckpt_close(&ck);
}

static void test_corrupt_checkpoints_fall_back_to_the_previous_one(void **state) {
    (void)state;
    char root[256], a[300], d[300], p1[400], p2[400];
    test_tmpdir(root, sizeof(root));
    snprintf(a, sizeof(a), "%s/a", root);
    struct kiln_train_result res;
    struct kiln_error err = {0};
    if (train(a, 12, &res, &err, "--ckpt-every=4", "--keep-last=0", NULL))
        fail_msg("%s", err.msg);
    snprintf(p1, sizeof(p1), "%s/model.safetensors", a);
    uint64_t rs = test_seed() ^ 0x51u;
    const char *files[] = {"model.safetensors", "optim.safetensors", "state.json"};
    for (int kind = 0; kind < N_CORRUPTIONS; kind++) {
        snprintf(d, sizeof(d), "%s/d%d", root, kind);
        sh("mkdir -p '%s/ckpt' && cp -r '%s/ckpt/step_00000004' '%s/ckpt/step_00000008' '%s/ckpt/'", d, a, a,
           d);
        char victim[600];
        const char *file = kind == MISSING_STATE ? "state.json" : files[test_rand_u64(&rs) % 3];
        snprintf(victim, sizeof(victim), "%s/ckpt/step_00000008/%s", d, file);
        size_t n;
        char *bytes = read_all(victim, &n);
        if (kind == MISSING_TENSOR) {
            file = "a tensor";
            drop_a_tensor(d, 8, &rs);
        } else if (kind == FLIP_BYTE) {
            cJSON *before = cJSON_Parse(bytes), *after = NULL;
            for (;;) { // in state.json, a flip that leaves the same JSON (a tab become a space) is no
                       // corruption
                size_t at = (size_t)(test_rand_u64(&rs) % n);
                char was = bytes[at];
                bytes[at] ^= (char)(1 + test_rand_u64(&rs) % 255);
                after = strcmp(file, "state.json") ? NULL : cJSON_Parse(bytes);
                if (!after || !cJSON_Compare(before, after, 1))
                    break;
                cJSON_Delete(after);
                bytes[at] = was;
            }
            cJSON_Delete(after);
            cJSON_Delete(before);
            FILE *f = fopen(victim, "wb");
            assert_int_equal(fwrite(bytes, 1, n, f), n);
            fclose(f);
        } else if (kind == TRUNCATE) {
            assert_int_equal(truncate(victim, (off_t)(test_rand_u64(&rs) % n)), 0);
        } else {
            assert_int_equal(unlink(victim), 0);
        }
        free(bytes);
        fprintf(stderr, "[test] corruption %d of %s: expect one fallback message below\n", kind, file);
        if (train(d, 12, &res, &err, "--ckpt-every=4", NULL))
            fail_msg("corruption %d of %s: %s", kind, file, err.msg);
        assert_int_equal(res.start_step, 4);
        snprintf(p2, sizeof(p2), "%s/model.safetensors", d);
        assert_same_file(p1, p2);
    }
    // every checkpoint corrupt: an error, not a silent fresh start
    snprintf(d, sizeof(d), "%s/all", root);
    sh("mkdir -p '%s/ckpt' && cp -r '%s/ckpt/step_00000004' '%s/ckpt/' && rm "
       "'%s/ckpt/step_00000004/optim.safetensors'",
       d, a, d, d);
    assert_int_equal(train(d, 12, &res, &err, NULL), KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "none of the 1 checkpoints"));
    test_rmrf(root);
}

static void test_a_different_model_is_refused_and_safe_changes_allowed(void **state) {
    (void)state;
    char root[256];
    test_tmpdir(root, sizeof(root));
    struct kiln_train_result res;
    struct kiln_error err = {0};
    if (train(root, 4, &res, &err, "--ckpt-every=2", NULL))
        fail_msg("%s", err.msg);
    assert_int_equal(train(root, 8, &res, &err, "--layers=2", "--dim=64", NULL), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "layers 1 -> 2, dim 32 -> 64"));
    assert_int_equal(train(root, 8, &res, &err, "--vocab-multiple=64", NULL), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "vocab-multiple 128 -> 64"));
    assert_int_equal(train(root, 8, &res, &err, "--mlp=swiglu", NULL), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "mlp 'gelu' -> 'swiglu'"));
    // --resume=never in a run directory with checkpoints is refused too
    assert_int_equal(train(root, 8, &res, &err, "--resume=never", NULL), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "already holds checkpoints"));
    // lr, max-steps, warmup, grad-clip: allowed
    if (train(root, 6, &res, &err, "--lr=1e-3", "--warmup=1", "--grad-clip=0.5", NULL))
        fail_msg("%s", err.msg);
    assert_int_equal(res.start_step, 4);
    assert_int_equal(res.steps, 6);
    // an explicit checkpoint directory
    char dir[400];
    snprintf(dir, sizeof(dir), "--resume=%s/ckpt/step_00000002", root);
    if (train(root, 3, &res, &err, dir, NULL))
        fail_msg("%s", err.msg);
    assert_int_equal(res.start_step, 2);
    test_rmrf(root);
}

// ---- health guards in the loop ---------------------------------------------------------------------

static void test_injected_nans_are_skipped_and_counted(void **state) {
    (void)state;
    char root[256], inj[64];
    test_tmpdir(root, sizeof(root));
    uint64_t rs = test_seed() ^ 0x77u;
    int s1 = 2 + (int)(test_rand_u64(&rs) % 4), s2 = s1 + 2 + (int)(test_rand_u64(&rs) % 4); // 2..5, 4..12
    snprintf(inj, sizeof(inj), "--inject-nan=%d,%d", s1, s2);
    struct kiln_train_result res;
    struct kiln_error err = {0};
    if (train(root, 14, &res, &err, inj, "--ckpt-every=1", "--keep-last=0", NULL))
        fail_msg("%s", err.msg);
    assert_int_equal(res.skipped_steps, 2);
    for (int s = 1; s <= 14; s++) {
        char *l = metrics_line(root, s);
        assert_non_null(l);
        int skipped = strstr(l, "\"skipped\":\"nan\"") != NULL;
        assert_int_equal(skipped, s == s1 || s == s2);
        // JSON has no NaN: a skipped step's loss and norm are null, and the line parses
        cJSON *row = cJSON_Parse(l);
        if (!row)
            fail_msg("step %d: metrics.jsonl line is not JSON: %s", s, l);
        if (skipped)
            assert_true(cJSON_IsNull(cJSON_GetObjectItem(row, "loss")) &&
                        cJSON_IsNull(cJSON_GetObjectItem(row, "grad_norm")));
        cJSON_Delete(row);
        if (s >= s2)
            assert_non_null(strstr(l, "\"skipped_steps\":2,\"skipped_nan\":2"));
        free(l);
    }
    cJSON *st = read_state(root, 14);
    assert_true(json_num(st, "step", NULL) == 14);
    assert_true(json_num(st, "opt_step", NULL) == 12); // skipped steps do not advance bias correction
    assert_true(json_num(st, "guards", "nan") == 2);
    cJSON_Delete(st);
    // no checkpoint is written on a skipped step (ckpt-every=1): the next good step writes one
    char d1[400];
    snprintf(d1, sizeof(d1), "%s/ckpt/step_%08d", root, s1);
    assert_false(kiln_is_dir(d1));
    snprintf(d1, sizeof(d1), "%s/ckpt/step_%08d", root, s1 + 1);
    assert_true(kiln_is_dir(d1));
    test_rmrf(root);
}

static void test_max_bad_steps_stops_and_keeps_the_last_good_checkpoint(void **state) {
    (void)state;
    char root[256];
    test_tmpdir(root, sizeof(root));
    struct kiln_train_result res;
    struct kiln_error err = {0};
    int rc = train(root, 12, &res, &err, "--inject-nan=5,6,7,8", "--max-bad-steps=3", "--ckpt-every=1",
                   "--keep-last=2", NULL);
    assert_int_equal(rc, KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "training stopped at step 7 (--max-bad-steps=3): 3 steps in a row"));
    assert_non_null(strstr(err.msg, "the newest checkpoint (step 4)"));
    char **paths;
    int64_t *steps;
    int n = kiln_ckpt_list(root, &paths, &steps, &err);
    assert_int_equal(n, 2);
    assert_int_equal(steps[0], 4);
    assert_int_equal(steps[1], 3);
    for (int i = 0; i < n; i++) {
        if (kiln_ckpt_verify(paths[i], &err))
            fail_msg("%s", err.msg);
        free(paths[i]);
    }
    free(paths);
    free(steps);
    char p[400];
    snprintf(p, sizeof(p), "%s/model.safetensors", root);
    assert_int_equal(access(p, F_OK), -1);
    test_rmrf(root);
}

// ---- the spike detector ----------------------------------------------------------------------------

// A lasting change of level (a plateau ending) is not an outlier: after a few skipped steps the statistics
// have learned it, so it does not stop the run through --max-bad-steps.
static void test_spike_detector_adapts_to_a_change_of_level(void **state) {
    struct kiln_guards g;
    kiln_guards_init(&g, 6.0f, 100, 10);
    uint64_t rs = test_seed() ^ 0x51;
    for (int i = 0; i < 150; i++)
        assert_int_equal(kiln_guards_check(&g, 2.0 + 0.01 * test_rand_uniform(&rs),
                                           0.4 + 0.02 * test_rand_uniform(&rs)), KILN_SKIP_NONE);
    int skipped = 0, worst_run = 0;
    for (int i = 0; i < 200; i++) {
        enum kiln_skip why = kiln_guards_check(&g, 2.0 + 0.01 * test_rand_uniform(&rs),
                                               1.4 + 0.02 * test_rand_uniform(&rs));
        skipped += why != KILN_SKIP_NONE;
        worst_run = g.consecutive > worst_run ? g.consecutive : worst_run;
    }
    assert_true(skipped > 0);      // the jump itself is flagged
    assert_true(worst_run < 10);   // but the run is never stopped by it
    assert_false(kiln_guards_exhausted(&g));
    kiln_guards_free(&g);
}

static void test_spike_detector_statistics_and_round_trip(void **state) {
    (void)state;
    uint64_t rs = test_seed() ^ 0x99u;
    int window = 25 + (int)(test_rand_u64(&rs) % 20);
    struct kiln_guards g, h;
    kiln_guards_init(&g, 4.0f, window, 3);
    double hist[200];
    int n = 0;
    // cold: nothing is a spike before KILN_GUARD_MIN_SAMPLES accepted values
    for (int i = 0; i < KILN_GUARD_MIN_SAMPLES - 1; i++) {
        double x = 3.0 + 0.1 * test_rand_uniform(&rs);
        assert_int_equal(kiln_guards_check(&g, x, 1.0 + 0.1 * test_rand_uniform(&rs)), KILN_SKIP_NONE);
        hist[n++] = log(x);
    }
    assert_true(isnan(kiln_spike_z(&g.loss, 1e9)));
    assert_int_equal(kiln_guards_check(&g, 1e6, 1.0), KILN_SKIP_NONE); // the 20th value, still cold
    hist[n++] = log(1e6);
    for (int i = 0; i < 60; i++) {
        double x = 3.0 + 0.1 * test_rand_uniform(&rs);
        assert_int_equal(kiln_guards_check(&g, x, 1.0 + 0.1 * test_rand_uniform(&rs)), KILN_SKIP_NONE);
        hist[n++] = log(x);
    }
    // z against an independent mean/std of the logarithms of the last `window` accepted losses
    double sum = 0, sq = 0;
    for (int i = n - window; i < n; i++)
        sum += hist[i];
    double mean = sum / window;
    for (int i = n - window; i < n; i++)
        sq += (hist[i] - mean) * (hist[i] - mean);
    double sd = sqrt(sq / window), probe = exp(mean + 5 * sd);
    assert_true(fabs(kiln_spike_z(&g.loss, probe) - 5.0) < 1e-9);
    // a loss spike and a grad spike are skipped and counted, but enter the windows (so that a genuine change
    // of level is learned); a NaN is skipped and kept out
    assert_int_equal(kiln_guards_check(&g, exp(mean + 4.5 * sd), 1.0), KILN_SKIP_SPIKE_LOSS);
    assert_int_equal(kiln_guards_check(&g, exp(mean), 1e3), KILN_SKIP_SPIKE_GRAD);
    assert_int_equal(g.consecutive, 2);
    hist[n++] = mean + 4.5 * sd;
    hist[n++] = log(exp(mean));
    double sum2 = 0, sq2 = 0;
    for (int i = n - window; i < n; i++)
        sum2 += hist[i];
    double mean2 = sum2 / window;
    for (int i = n - window; i < n; i++)
        sq2 += (hist[i] - mean2) * (hist[i] - mean2);
    double sd2 = sqrt(sq2 / window);
    assert_true(fabs(kiln_spike_z(&g.loss, probe) - (log(probe) - mean2) / sd2) < 1e-9);

    // the checkpoint round trip: the same decisions afterwards, bit for bit
    cJSON *j = kiln_guards_to_json(&g);
    char *text = cJSON_PrintUnformatted(j);
    cJSON *j2 = cJSON_Parse(text);
    kiln_guards_init(&h, 4.0f, window, 3);
    struct kiln_error err;
    if (kiln_guards_from_json(&h, j2, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(h.consecutive, 2);
    assert_int_equal(h.skipped_total, 2);
    assert_int_equal(h.skipped[KILN_SKIP_SPIKE_LOSS], 1);
    assert_true(kiln_spike_z(&h.loss, probe) == kiln_spike_z(&g.loss, probe));
    double z_before = kiln_spike_z(&g.loss, probe);
    assert_int_equal(kiln_guards_check(&g, NAN, 1.0), KILN_SKIP_NAN);
    assert_int_equal(kiln_guards_check(&h, NAN, 1.0), KILN_SKIP_NAN);
    assert_true(kiln_spike_z(&g.loss, probe) == z_before); // a NaN never enters the window
    assert_true(kiln_guards_exhausted(&g) && kiln_guards_exhausted(&h));
    for (int i = 0; i < 10; i++) {
        double x = 3.0 + 0.1 * test_rand_uniform(&rs), y = 1.0 + 0.1 * test_rand_uniform(&rs);
        assert_int_equal(kiln_guards_check(&g, x, y), kiln_guards_check(&h, x, y));
    }
    assert_true(kiln_spike_z(&h.grad, 2.0) == kiln_spike_z(&g.grad, 2.0));
    // a smaller window on resume keeps the newest values
    struct kiln_guards s;
    kiln_guards_init(&s, 4.0f, 20, 3);
    if (kiln_guards_from_json(&s, j2, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(s.loss.n, 20);
    kiln_guards_free(&s);
    // bad input
    cJSON *bad = cJSON_Parse("{\"skipped_total\": -1}");
    assert_int_equal(kiln_guards_from_json(&s, bad, &err), KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "skipped_total"));
    cJSON_Delete(bad);
    // spike tests off (spike-z 0): only NaNs are skipped
    struct kiln_guards off;
    kiln_guards_init(&off, 0.0f, 20, 3);
    for (int i = 0; i < 30; i++)
        assert_int_equal(kiln_guards_check(&off, 3.0 + 0.01 * i, 1.0), KILN_SKIP_NONE);
    assert_int_equal(kiln_guards_check(&off, 1e9, 1e9), KILN_SKIP_NONE);
    kiln_guards_free(&off);
    free(text);
    cJSON_Delete(j);
    cJSON_Delete(j2);
    kiln_guards_free(&g);
    kiln_guards_free(&h);
}

static void test_metrics_truncation_drops_later_and_torn_lines(void **state) {
    (void)state;
    char root[256], p[400];
    test_tmpdir(root, sizeof(root));
    snprintf(p, sizeof(p), "%s/metrics.jsonl", root);
    struct kiln_error err;
    assert_int_equal(kiln_metrics_truncate(p, 3, &err), 0); // missing: fine
    const char *text = "{\"step\":1,\"loss\":4}\n{\"step\":2,\"loss\":3}\n{\"step\":3,\"loss\":2}\n"
                       "{\"step\":4,\"loss\":1}\n{\"step\":5,\"lo";
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    assert_int_equal(kiln_metrics_truncate(p, 3, &err), 0);
    size_t n;
    char *d = read_all(p, &n);
    assert_string_equal(d, "{\"step\":1,\"loss\":4}\n{\"step\":2,\"loss\":3}\n{\"step\":3,\"loss\":2}\n");
    free(d);
    test_rmrf(root);
}

// ---- counts in state.json ------------------------------------------------------------------------------

// Recomputes state_sha256 as docs/formats.md defines it: sha256 of the unformatted JSON of the object
// without step, format, files and state_sha256. So a test can change a field and still pass the hash check.
static void rehash_state(cJSON *j) {
    cJSON *c = cJSON_Duplicate(j, 1);
    const char *managed[] = {"step", "format", "files", "state_sha256"};
    for (size_t i = 0; i < sizeof(managed) / sizeof(managed[0]); i++)
        cJSON_DeleteItemFromObjectCaseSensitive(c, managed[i]);
    char *text = cJSON_PrintUnformatted(c);
    uint8_t d[32];
    char hex[65];
    kiln_sha256(text, strlen(text), d);
    kiln_sha256_hex(d, hex);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "state_sha256", cJSON_CreateString(hex));
    free(text);
    cJSON_Delete(c);
}

// state with field a (or a.b) set to v, re-hashed
static cJSON *state_with(const cJSON *good, const char *a, const char *b, double v) {
    cJSON *j = cJSON_Duplicate(good, 1), *o = b ? cJSON_GetObjectItemCaseSensitive(j, a) : j;
    assert_true(cJSON_ReplaceItemInObjectCaseSensitive(o, b ? b : a, cJSON_CreateNumber(v)));
    rehash_state(j);
    return j;
}

static void test_state_counts_out_of_range_or_inconsistent_are_refused(void **state) {
    (void)state;
    struct kiln_config cfg;
    struct kiln_error err;
    if (kiln_config_init(&cfg, NULL, &err))
        fail_msg("%s", err.msg);
    cfg.model.vocab_size = 65;
    struct kiln_guards g;
    kiln_guards_init(&g, 6.0f, 100, 10);
    g.skipped[KILN_SKIP_NAN] = 2; // 3 skips, the last 2 in a row
    g.skipped[KILN_SKIP_SPIKE_LOSS] = 1;
    g.skipped_total = 3;
    g.consecutive = 2;
    struct kiln_train_state st = {
        .step = 10, .opt_step = 7, .tokens = 20480, .loader = {.epoch = 1, .position = 3}};
    cJSON *good = kiln_train_state_to_json(&st, &cfg, &g, 1e-3f);
    struct kiln_train_state back;
    if (kiln_train_state_from_json(good, &back, &err))
        fail_msg("%s", err.msg);
    assert_true(back.step == 10 && back.opt_step == 7 && back.tokens == 20480);
    assert_true(back.loader.epoch == 1 && back.loader.position == 3);
    const double two64 = 18446744073709551616.0, two53 = 9007199254740992.0;
    // a count at the edge of what a double holds exactly is still read
    cJSON *edge = state_with(good, "tokens", NULL, two53);
    if (kiln_train_state_from_json(edge, &back, &err))
        fail_msg("%s", err.msg);
    assert_true(back.tokens == (uint64_t)1 << 53);
    cJSON_Delete(edge);

    static const struct {
        const char *a, *b;
        double v;
        const char *msg;
    } cases[] = {
        // beyond 2^53 a double no longer counts by ones, and beyond 2^64 the conversion is undefined:
        // opt_step 1e300 used to come back as 0 and silently restart AdamW's bias correction
        {"opt_step", NULL, 1e300,
         "state.json field 'opt_step' is 1e+300: more than 2^53 = 9007199254740992, the largest count kept "
         "exactly; the checkpoint is damaged"},
        {"step", NULL, 18446744073709551616.0,
         "state.json field 'step' is 1.844674407370955e+19: more than 2^53 = 9007199254740992, the largest "
         "count kept exactly; the checkpoint is damaged"},
        {"tokens", NULL, 9007199254740994.0, "state.json field 'tokens' is 9007199254740994: more than 2^53"},
        {"loader", "epoch", 1e300, "state.json field 'loader.epoch' is 1e+300: more than 2^53"},
        {"loader", "position", two64, "state.json field 'loader.position' is 1.844674407370955e+19"},
        {"guards", "skipped_total", 1e300,
         "state.json field 'guards.skipped_total' is 1e+300: more than 2^53 = 9007199254740992, the largest "
         "count kept exactly; the checkpoint is damaged"},
        {"guards", "spike_grad", two64, "state.json field 'guards.spike_grad' is 1.844674407370955e+19"},
        {"guards", "consecutive", 1e300, "state.json field 'guards.consecutive' is 1e+300: more than"},
        // counts that contradict each other
        {"opt_step", NULL, 11,
         "state.json field 'opt_step' is 11: more than step 10 (AdamW updates are at most the steps); the "
         "checkpoint is damaged"},
        {"guards", "nan", 4,
         "state.json field 'guards.nan' is 4: more than guards.skipped_total 3 (every skip has one reason); "
         "the checkpoint is damaged"},
        {"guards", "consecutive", 4,
         "state.json field 'guards.consecutive' is 4: more than guards.skipped_total 3 (skips in a row are "
         "skips); the checkpoint is damaged"},
        {"guards", "skipped_total", 4,
         "state.json field 'guards.skipped_total' is 4: the reasons' counts add up to 3; the checkpoint is "
         "damaged"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *j = state_with(good, cases[i].a, cases[i].b, cases[i].v);
        int rc = kiln_train_state_from_json(j, &back, &err);
        if (rc != KILN_ERR_RUNTIME || strncmp(err.msg, cases[i].msg, strlen(cases[i].msg)))
            fail_msg("%s%s%s = %.17g: rc %d, message \"%s\"; expected \"%s...\"", cases[i].a,
                     cases[i].b ? "." : "", cases[i].b ? cases[i].b : "", cases[i].v, rc, rc ? err.msg : "",
                     cases[i].msg);
        cJSON_Delete(j);
    }
    // guards.skipped_total may not exceed the steps: every skipped step is a step
    cJSON *j = cJSON_Duplicate(good, 1), *gj = cJSON_GetObjectItemCaseSensitive(j, "guards");
    cJSON_ReplaceItemInObjectCaseSensitive(gj, "skipped_total", cJSON_CreateNumber(11));
    cJSON_ReplaceItemInObjectCaseSensitive(gj, "nan", cJSON_CreateNumber(10));
    rehash_state(j);
    assert_int_equal(kiln_train_state_from_json(j, &back, &err), KILN_ERR_RUNTIME);
    assert_string_equal(err.msg,
                        "state.json field 'guards.skipped_total' is 11: more than step 10 (skipped steps "
                        "are steps); the checkpoint is damaged");
    cJSON_Delete(j);

    // the guards' own reader refuses the same counts (the trainer calls it after kiln_train_state_from_json)
    struct kiln_guards h;
    kiln_guards_init(&h, 6.0f, 100, 10);
    cJSON *bad = kiln_guards_to_json(&g);
    cJSON_ReplaceItemInObjectCaseSensitive(bad, "skipped_total", cJSON_CreateNumber(1e300));
    assert_int_equal(kiln_guards_from_json(&h, bad, &err), KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "'guards.skipped_total' is 1e+300"));
    cJSON_ReplaceItemInObjectCaseSensitive(bad, "skipped_total", cJSON_CreateNumber(3));
    cJSON_ReplaceItemInObjectCaseSensitive(bad, "spike_loss", cJSON_CreateNumber(5));
    assert_int_equal(kiln_guards_from_json(&h, bad, &err), KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "'guards.spike_loss' is 5: more than guards.skipped_total 3"));
    cJSON_Delete(bad);
    kiln_guards_free(&h);
    cJSON_Delete(good);
    kiln_guards_free(&g);
}

int main(void) {
    run_seed = test_seed() % 1000003;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_is_bit_exact_and_checkpoints_do_not_perturb),
        cmocka_unit_test(test_corrupt_checkpoints_fall_back_to_the_previous_one),
        cmocka_unit_test(test_a_different_model_is_refused_and_safe_changes_allowed),
        cmocka_unit_test(test_injected_nans_are_skipped_and_counted),
        cmocka_unit_test(test_max_bad_steps_stops_and_keeps_the_last_good_checkpoint),
        cmocka_unit_test(test_spike_detector_statistics_and_round_trip),
        cmocka_unit_test(test_spike_detector_adapts_to_a_change_of_level),
        cmocka_unit_test(test_metrics_truncation_drops_later_and_torn_lines),
        cmocka_unit_test(test_state_counts_out_of_range_or_inconsistent_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
