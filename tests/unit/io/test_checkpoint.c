// Checkpoints: save/load round trips, pruning policy, torn and corrupt checkpoints never chosen, and a
// SIGKILL test: a writer killed at random moments never leaves a checkpoint that find_latest would return
// and that fails to verify.
#include "test_util.h"

#include "io/checkpoint.h"
#include "io/fsutil.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

// ---- a fake model whose every value is a function of (step, tensor, index) ------------------------

enum { NT = 3 };
static const int64_t model_numel[NT] = {300, 1000, 17};

static float value_at(int64_t step, int tensor, int64_t i, int which) {
    uint64_t x = (uint64_t)step * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)tensor << 40) ^ (uint64_t)i ^
                 ((uint64_t)which << 60);
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ULL;
    return (float)((x >> 40) & 0xffff) - 32768.0f;
}

struct fake_ckpt {
    float *buf[2][NT]; // [model/optim][tensor]
    struct kiln_st_tensor t[2][NT];
    struct kiln_ckpt_file files[2];
};

// scale multiplies every tensor's size (the kill test uses bigger files so kills land mid-write)
static void fake_fill(struct fake_ckpt *c, int64_t step, int scale) {
    static const char *names[2][NT] = {
        {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.ln_f.bias"},
        {"m.transformer.wte.weight", "v.transformer.wte.weight", "m.transformer.ln_f.bias"}};
    for (int w = 0; w < 2; w++) {
        for (int k = 0; k < NT; k++) {
            int64_t n = model_numel[k] * scale;
            c->buf[w][k] = malloc(sizeof(float) * (size_t)n);
            for (int64_t i = 0; i < n; i++)
                c->buf[w][k][i] = value_at(step, k, i, w);
            c->t[w][k] = (struct kiln_st_tensor){names[w][k], KILN_ST_F32, 1, {n}, c->buf[w][k]};
        }
    }
    c->files[0] = (struct kiln_ckpt_file){"model.safetensors", c->t[0], NT};
    c->files[1] = (struct kiln_ckpt_file){"optim.safetensors", c->t[1], NT};
}

static void fake_free(struct fake_ckpt *c) {
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < NT; k++)
            free(c->buf[w][k]);
}

// 0 when the loaded model/optim hold exactly what fake_fill(step) wrote
static int fake_matches(const struct kiln_ckpt *ck, int64_t step, int scale) {
    struct kiln_safetensors *f[2] = {ck->model, ck->optim};
    for (int w = 0; w < 2; w++) {
        if (!f[w] || kiln_safetensors_count(f[w]) != NT)
            return 1;
        for (int k = 0; k < NT; k++) {
            const struct kiln_st_tensor *t = kiln_safetensors_at(f[w], k);
            if (t->ndim != 1 || t->shape[0] != model_numel[k] * scale)
                return 1;
            const float *x = t->data;
            for (int64_t i = 0; i < t->shape[0]; i++)
                if (x[i] != value_at(step, k, i, w))
                    return 1;
        }
    }
    return 0;
}

static int save_step(const char *run, int64_t step, const struct kiln_ckpt_policy *policy, int scale,
                     struct kiln_error *err) {
    struct fake_ckpt c;
    fake_fill(&c, step, scale);
    cJSON *state = cJSON_CreateObject();
    cJSON_AddNumberToObject(state, "step", (double)step);
    cJSON_AddNumberToObject(state, "tokens_seen", (double)step * 4096);
    cJSON *loader = cJSON_AddObjectToObject(state, "loader");
    cJSON_AddNumberToObject(loader, "shard", 3);
    int rc = kiln_ckpt_save(run, step, c.files, 2, state, policy, err);
    cJSON_Delete(state);
    fake_free(&c);
    return rc;
}

static void ckpt_path(char *out, size_t cap, const char *run, int64_t step) {
    snprintf(out, cap, "%s/ckpt/step_%08lld", run, (long long)step);
}

static int64_t state_step(const struct kiln_ckpt *ck) {
    return (int64_t)cJSON_GetObjectItemCaseSensitive(ck->state, "step")->valuedouble;
}

// ---- round trip -------------------------------------------------------------------------------

static void test_save_then_load_round_trips_everything(void **state) {
    (void)state;
    char run[256], p[700];
    struct kiln_error err = {0};
    test_tmpdir(run, sizeof(run));
    uint64_t rng = test_seed() ^ 0xc4;
    int64_t step = 1 + (int64_t)(test_rand_u64(&rng) % 100000);

    struct fake_ckpt c;
    fake_fill(&c, step, 1);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "tokens_seen", 12345);
    cJSON_AddStringToObject(st, "config_hash", "abc");
    if (kiln_ckpt_save(run, step, c.files, 2, st, NULL, &err))
        fail_msg("%s", err.msg);
    // the caller's object is untouched
    assert_null(cJSON_GetObjectItem(st, "files"));
    assert_null(cJSON_GetObjectItem(st, "format"));
    cJSON_Delete(st);
    fake_free(&c);

    // layout
    ckpt_path(p, sizeof(p), run, step);
    assert_true(kiln_is_dir(p));
    char *latest;
    size_t n;
    snprintf(p, sizeof(p), "%s/ckpt/latest", run);
    assert_int_equal(kiln_read_file(p, &latest, &n, &err), 0);
    char want[64];
    snprintf(want, sizeof(want), "step_%08lld\n", (long long)step);
    assert_string_equal(latest, want);
    free(latest);

    char found[1024];
    assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), NULL, NULL, &err), 0);
    ckpt_path(p, sizeof(p), run, step);
    assert_string_equal(found, p);

    struct kiln_ckpt ck;
    if (kiln_ckpt_load(found, &ck, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(fake_matches(&ck, step, 1), 0);
    assert_int_equal(state_step(&ck), step);
    assert_string_equal(cJSON_GetObjectItem(ck.state, "format")->valuestring, KILN_CKPT_FORMAT);
    assert_string_equal(cJSON_GetObjectItem(ck.state, "config_hash")->valuestring, "abc");
    assert_true(cJSON_GetObjectItem(ck.state, "tokens_seen")->valuedouble == 12345);
    cJSON *files = cJSON_GetObjectItem(ck.state, "files");
    assert_int_equal(cJSON_GetArraySize(files), 2);
    // the recorded hashes are the files' real sha256 (independently: sha256sum)
    char cmd[1200], theirs[65];
    snprintf(cmd, sizeof(cmd), "sha256sum '%s/model.safetensors'", found);
    FILE *pp = popen(cmd, "r");
    assert_int_equal(fscanf(pp, "%64s", theirs), 1);
    pclose(pp);
    assert_string_equal(cJSON_GetObjectItem(files, "model.safetensors")->valuestring, theirs);
    assert_string_equal(ck.path, found);
    kiln_ckpt_close(&ck);
    kiln_ckpt_close(&ck); // twice is fine

    struct kiln_ckpt ck2;
    assert_int_equal(kiln_ckpt_load_latest(run, &ck2, NULL, NULL, &err), 0);
    assert_int_equal(state_step(&ck2), step);
    kiln_ckpt_close(&ck2);

    // saving the same step again replaces it (new content), leaving nothing stale behind
    assert_int_equal(save_step(run, step + 1, NULL, 1, &err), 0);
    struct fake_ckpt c2;
    fake_fill(&c2, step + 7, 1); // different content under the same step name
    cJSON *st2 = cJSON_CreateObject();
    assert_int_equal(kiln_ckpt_save(run, step, c2.files, 2, st2, NULL, &err), 0);
    cJSON_Delete(st2);
    fake_free(&c2);
    ckpt_path(p, sizeof(p), run, step);
    assert_int_equal(kiln_ckpt_load(p, &ck, &err), 0);
    assert_int_equal(fake_matches(&ck, step + 7, 1), 0);
    kiln_ckpt_close(&ck);
    char **paths;
    int64_t *steps;
    assert_int_equal(kiln_ckpt_list(run, &paths, &steps, &err), 2);
    assert_int_equal(steps[0], step + 1); // newest first
    assert_int_equal(steps[1], step);
    for (int i = 0; i < 2; i++)
        free(paths[i]);
    free(paths);
    free(steps);
    char lsout[64] = {0};
    snprintf(cmd, sizeof(cmd), "ls -A '%s/ckpt' | grep -c tmp", run);
    pp = popen(cmd, "r");
    assert_non_null(fgets(lsout, sizeof(lsout), pp));
    pclose(pp);
    assert_int_equal(atoi(lsout), 0);
    test_rmrf(run);
}

static void test_save_rejects_bad_arguments(void **state) {
    (void)state;
    char run[256];
    struct kiln_error err = {0};
    test_tmpdir(run, sizeof(run));
    struct fake_ckpt c;
    fake_fill(&c, 1, 1);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "step", 5);
    assert_int_equal(kiln_ckpt_save(run, 6, c.files, 2, st, NULL, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "differs from 6"));
    assert_int_equal(kiln_ckpt_save(run, -1, c.files, 2, NULL, NULL, &err), KILN_ERR_USAGE);
    struct kiln_ckpt_file bad[2] = {c.files[0], c.files[1]};
    static const char *bad_names[] = {"../escape.safetensors", "state.json", ".hidden", "", "latest"};
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
        bad[1].name = bad_names[i];
        assert_int_equal(kiln_ckpt_save(run, 5, bad, 2, st, NULL, &err), KILN_ERR_USAGE);
        assert_non_null(strstr(err.msg, "bad file name"));
    }
    bad[1].name = bad[0].name;
    assert_int_equal(kiln_ckpt_save(run, 5, bad, 2, st, NULL, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "given twice"));
    // nothing was created by refused saves
    char found[1024];
    assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), NULL, NULL, &err), KILN_CKPT_NONE);
    cJSON_Delete(st);
    fake_free(&c);
    test_rmrf(run);
}

// ---- pruning ----------------------------------------------------------------------------------

static int64_t existing_steps(const char *run, int64_t *out, int cap) {
    char **paths;
    int64_t *steps;
    struct kiln_error err;
    int n = kiln_ckpt_list(run, &paths, &steps, &err);
    assert_true(n >= 0 && n <= cap);
    for (int i = 0; i < n; i++) {
        out[i] = steps[i];
        free(paths[i]);
    }
    free(paths);
    free(steps);
    return n;
}

static void test_pruning_hand_worked_examples(void **state) {
    (void)state;
    char run[256];
    struct kiln_error err;
    int64_t have[64];
    // keep_last=2: steps 1..7 leave 7, 6
    test_tmpdir(run, sizeof(run));
    struct kiln_ckpt_policy p1 = {2, 0};
    for (int s = 1; s <= 7; s++)
        assert_int_equal(save_step(run, s, &p1, 1, &err), 0);
    assert_int_equal(existing_steps(run, have, 64), 2);
    assert_int_equal(have[0], 7);
    assert_int_equal(have[1], 6);
    test_rmrf(run);
    // keep_last=2, keep_every=3: steps 1..10 leave 10, 9, 6, 3
    test_tmpdir(run, sizeof(run));
    struct kiln_ckpt_policy p2 = {2, 3};
    for (int s = 1; s <= 10; s++)
        assert_int_equal(save_step(run, s, &p2, 1, &err), 0);
    assert_int_equal(existing_steps(run, have, 64), 4);
    assert_int_equal(have[0], 10);
    assert_int_equal(have[1], 9);
    assert_int_equal(have[2], 6);
    assert_int_equal(have[3], 3);
    test_rmrf(run);
    // keep_last=0 keeps everything; a NULL policy too
    test_tmpdir(run, sizeof(run));
    struct kiln_ckpt_policy p3 = {0, 4};
    for (int s = 1; s <= 5; s++)
        assert_int_equal(save_step(run, s * 10, s % 2 ? &p3 : NULL, 1, &err), 0);
    assert_int_equal(existing_steps(run, have, 64), 5);
    test_rmrf(run);
}

static void test_pruning_random_policies_match_the_rule(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0x9e;
    struct kiln_error err;
    for (int trial = 0; trial < 6; trial++) {
        char run[256];
        test_tmpdir(run, sizeof(run));
        struct kiln_ckpt_policy pol = {1 + (int)(test_rand_u64(&rng) % 4),
                                       test_rand_u64(&rng) % 2 ? 0 : 2 + (int)(test_rand_u64(&rng) % 4)};
        int64_t model[64];
        int nm = 0;
        int64_t step = 0;
        int saves = 1 + (int)(test_rand_u64(&rng) % 12);
        for (int k = 0; k < saves; k++) {
            step += 1 + (int64_t)(test_rand_u64(&rng) % 4);
            assert_int_equal(save_step(run, step, &pol, 1, &err), 0);
            // the rule from the spec, on a model of the directory (newest first)
            for (int i = nm; i > 0; i--)
                model[i] = model[i - 1];
            model[0] = step;
            nm++;
            int w = 0;
            for (int i = 0; i < nm; i++)
                if (i < pol.keep_last || (pol.keep_every && model[i] % pol.keep_every == 0))
                    model[w++] = model[i];
            nm = w;
            int64_t have[64];
            int nh = (int)existing_steps(run, have, 64);
            assert_int_equal(nh, nm);
            for (int i = 0; i < nm; i++)
                assert_int_equal(have[i], model[i]);
        }
        test_rmrf(run);
    }
}

// ---- torn and corrupt checkpoints -------------------------------------------------------------

struct skips {
    int n;
    char path[8][1024];
    char why[8][1024];
};
static void on_skip(void *user, const char *path, const char *why) {
    struct skips *s = user;
    if (s->n < 8) {
        snprintf(s->path[s->n], sizeof(s->path[0]), "%s", path);
        snprintf(s->why[s->n], sizeof(s->why[0]), "%s", why);
    }
    s->n++;
}

enum damage {
    D_TRUNCATE,
    D_FLIP,
    D_MISSING_FILE,
    D_MISSING_STATE,
    D_STATE_GARBAGE,
    D_STATE_NO_FORMAT,
    D_COUNT
};

static void apply_damage(const char *dir, enum damage d, uint64_t *rng, const char **expect) {
    char p[1200];
    struct stat st;
    switch (d) {
    case D_TRUNCATE:
        snprintf(p, sizeof(p), "%s/model.safetensors", dir);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(truncate(p, (off_t)(test_rand_u64(rng) % (uint64_t)st.st_size)), 0);
        *expect = "model.safetensors";
        break;
    case D_FLIP: {
        snprintf(p, sizeof(p), "%s/optim.safetensors", dir);
        assert_int_equal(stat(p, &st), 0);
        int fd = open(p, O_RDWR);
        off_t at = (off_t)(test_rand_u64(rng) % (uint64_t)st.st_size);
        unsigned char b;
        assert_int_equal(pread(fd, &b, 1, at), 1);
        b ^= (unsigned char)(1u << (test_rand_u64(rng) % 8));
        assert_int_equal(pwrite(fd, &b, 1, at), 1);
        close(fd);
        *expect = "optim.safetensors): sha256";
        break;
    }
    case D_MISSING_FILE:
        snprintf(p, sizeof(p), "%s/optim.safetensors", dir);
        assert_int_equal(unlink(p), 0);
        *expect = "optim.safetensors): No such file";
        break;
    case D_MISSING_STATE:
        snprintf(p, sizeof(p), "%s/state.json", dir);
        assert_int_equal(unlink(p), 0);
        *expect = "state.json): No such file";
        break;
    case D_STATE_GARBAGE:
        snprintf(p, sizeof(p), "%s/state.json", dir);
        assert_int_equal(kiln_write_file_atomic(p, "{\"format\": \"kiln-ck", 19, NULL), 0);
        *expect = "state.json): not a JSON object";
        break;
    case D_STATE_NO_FORMAT:
        snprintf(p, sizeof(p), "%s/state.json", dir);
        assert_int_equal(kiln_write_file_atomic(p, "{\"step\": 200, \"files\": {}}", 26, NULL), 0);
        *expect = "\"format\" is missing";
        break;
    default:
        fail();
    }
}

static void test_corrupt_newest_checkpoint_is_skipped_for_the_previous_one(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0xbad;
    struct kiln_error err;
    for (int d = 0; d < D_COUNT; d++) {
        char run[256], p[700], found[1024];
        test_tmpdir(run, sizeof(run));
        assert_int_equal(save_step(run, 100, NULL, 1, &err), 0);
        assert_int_equal(save_step(run, 200, NULL, 1, &err), 0);
        ckpt_path(p, sizeof(p), run, 200);
        const char *expect = NULL;
        apply_damage(p, (enum damage)d, &rng, &expect);

        assert_int_not_equal(kiln_ckpt_verify(p, &err), 0);
        if (!strstr(err.msg, expect))
            fail_msg("damage %d: verify said \"%s\", wanted \"%s\"", d, err.msg, expect);
        struct skips sk = {0};
        assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), on_skip, &sk, &err), 0);
        ckpt_path(p, sizeof(p), run, 100);
        assert_string_equal(found, p);
        assert_int_equal(sk.n, 1);
        ckpt_path(p, sizeof(p), run, 200);
        assert_string_equal(sk.path[0], p);
        assert_non_null(strstr(sk.why[0], expect));

        struct kiln_ckpt ck;
        assert_int_equal(kiln_ckpt_load_latest(run, &ck, NULL, NULL, &err), 0);
        assert_int_equal(state_step(&ck), 100);
        assert_int_equal(fake_matches(&ck, 100, 1), 0);
        kiln_ckpt_close(&ck);
        assert_int_not_equal(kiln_ckpt_load(p, &ck, &err), 0);
        assert_null(ck.model);
        assert_null(ck.state);

        // damage the older one too: checkpoints exist but none is usable -> an error, not "none"
        ckpt_path(p, sizeof(p), run, 100);
        apply_damage(p, (enum damage)((d + 1) % D_COUNT), &rng, &expect);
        memset(&sk, 0, sizeof(sk));
        int rc = kiln_ckpt_find_latest(run, found, sizeof(found), on_skip, &sk, &err);
        if (rc <= 0)
            fail_msg("damage %d then %d: find_latest returned %d (%s)", d, (d + 1) % D_COUNT, rc, found);
        assert_int_equal(sk.n, 2);
        assert_non_null(strstr(err.msg, "no usable checkpoint"));
        test_rmrf(run);
    }
}

static void test_leftovers_and_strays_are_never_chosen(void **state) {
    (void)state;
    char run[256], p[1200], q[1200], found[1024];
    struct kiln_error err;
    test_tmpdir(run, sizeof(run));
    assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), NULL, NULL, &err),
                     KILN_CKPT_NONE); // no ckpt dir
    assert_int_equal(save_step(run, 100, NULL, 1, &err), 0);
    assert_int_equal(save_step(run, 200, NULL, 1, &err), 0);

    // a complete-looking temp dir of a killed writer, at a higher step
    snprintf(p, sizeof(p), "%s/ckpt/.tmp-step_00000300-99999-0123456789abcdef", run);
    ckpt_path(q, sizeof(q), run, 200);
    char cmd[2600];
    snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s'", q, p);
    assert_int_equal(system(cmd), 0);
    // a half-written latest.tmp, a garbage `latest`, a stray file and a misnamed dir
    snprintf(p, sizeof(p), "%s/ckpt/latest.tmp-1-2", run);
    assert_int_equal(kiln_write_file_atomic(p, "step_0000", 9, &err), 0);
    snprintf(p, sizeof(p), "%s/ckpt/latest", run);
    assert_int_equal(kiln_write_file_atomic(p, "../../../etc\x01\x02", 14, &err), 0);
    snprintf(p, sizeof(p), "%s/ckpt/step_00000900", run);
    assert_int_equal(kiln_write_file_atomic(p, "not a dir", 9, &err), 0);
    snprintf(p, sizeof(p), "%s/ckpt/step_9", run);
    assert_int_equal(kiln_mkdir_p(p, &err), 0);
    snprintf(p, sizeof(p), "%s/ckpt/step_0000000x", run);
    assert_int_equal(kiln_mkdir_p(p, &err), 0);

    struct skips sk = {0};
    assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), on_skip, &sk, &err), 0);
    ckpt_path(p, sizeof(p), run, 200);
    assert_string_equal(found, p);
    assert_int_equal(sk.n, 0);

    // a step_N dir whose state.json claims another step (a copy or rename gone wrong)
    ckpt_path(p, sizeof(p), run, 500);
    snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s'", q, p);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), on_skip, &sk, &err), 0);
    assert_string_equal(found, q);
    assert_int_equal(sk.n, 1);
    assert_non_null(strstr(sk.why[0], "does not match the directory name"));
    assert_int_equal(kiln_remove_tree(p, &err), 0);

    // path_out too small is an error, not a truncated path
    char tiny[8];
    assert_int_equal(kiln_ckpt_find_latest(run, tiny, sizeof(tiny), NULL, NULL, &err), KILN_ERR_USAGE);

    // the next save sweeps the temp leftovers and rewrites latest
    assert_int_equal(save_step(run, 300, NULL, 1, &err), 0);
    snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A '%s/ckpt' | grep tmp)\"", run);
    assert_int_equal(system(cmd), 0);
    char *latest;
    size_t n;
    snprintf(p, sizeof(p), "%s/ckpt/latest", run);
    assert_int_equal(kiln_read_file(p, &latest, &n, &err), 0);
    assert_string_equal(latest, "step_00000300\n");
    free(latest);
    test_rmrf(run);
}

// ---- SIGKILL at random moments ----------------------------------------------------------------

// The child saves step after step (from `first`), reporting each completed save on the pipe.
static void kill_child(const char *run, int64_t first, int fd) {
    struct kiln_ckpt_policy pol = {3, 0};
    struct kiln_error err;
    for (int64_t step = first;; step++) {
        if (save_step(run, step, &pol, 64, &err)) {
            fprintf(stderr, "child: %s\n", err.msg);
            _exit(3);
        }
        if (write(fd, &step, sizeof(step)) != sizeof(step))
            _exit(4);
    }
}

static void test_sigkill_during_saves_never_loses_the_last_good_checkpoint(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0x51c;
    char run[256], found[1024];
    struct kiln_error err;
    test_tmpdir(run, sizeof(run));
    int64_t last_done = -1, next = 1;
    int kills_mid_write = 0;
    for (int round = 0; round < 20; round++) {
        int pfd[2];
        assert_int_equal(pipe(pfd), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(pfd[0]);
            kill_child(run, next, pfd[1]);
        }
        close(pfd[1]);
        int64_t s;
        // every 5th round lets one save complete first, so that rounds also start from a saved state even
        // when the disk is slow; the kill moment is random relative to the save cycle either way
        if (round % 5 == 0 && read(pfd[0], &s, sizeof(s)) == sizeof(s))
            last_done = s;
        usleep((useconds_t)(test_rand_u64(&rng) % 40000)); // 0..40 ms: before, during or between saves
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status)); // it was still saving, not failing
        while (read(pfd[0], &s, sizeof(s)) == sizeof(s))
            last_done = s;
        close(pfd[0]);

        char cmd[600];
        snprintf(cmd, sizeof(cmd), "ls -A '%s/ckpt' 2>/dev/null | grep -q tmp", run);
        kills_mid_write += system(cmd) == 0;

        // every checkpoint directory that exists verifies (none is torn)
        char **paths;
        int64_t *steps;
        int n = kiln_ckpt_list(run, &paths, &steps, &err);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            if (kiln_ckpt_verify(paths[i], &err))
                fail_msg("round %d: %s does not verify: %s", round, paths[i], err.msg);
            free(paths[i]);
        }
        free(paths);
        free(steps);

        struct kiln_ckpt ck;
        int rc = kiln_ckpt_load_latest(run, &ck, NULL, NULL, &err);
        if (last_done < 0) {
            assert_true(rc == 0 ||
                        rc == KILN_CKPT_NONE); // a save may have completed just before the kill, unreported
        } else {
            if (rc)
                fail_msg("round %d: no checkpoint after step %lld was saved: %s", round, (long long)last_done,
                         err.msg);
        }
        if (rc == 0) {
            int64_t got = state_step(&ck);
            assert_true(got >= last_done);
            assert_int_equal(fake_matches(&ck, got, 64), 0);
            assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), NULL, NULL, &err), 0);
            assert_string_equal(found, ck.path);
            next = got + 1;
            kiln_ckpt_close(&ck);
        }
    }
    fprintf(stderr, "[ckpt] 20 kills: newest completed step %lld, %d kills left temp files behind\n",
            (long long)last_done, kills_mid_write);
    assert_true(last_done >= 0); // over 20 rounds some saves must have completed
    test_rmrf(run);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Not pass/fail: prints save and verify throughput for a ~40 MB checkpoint.
static void test_save_and_verify_throughput_report(void **state) {
    (void)state;
    char run[256], found[1024];
    struct kiln_error err;
    test_tmpdir(run, sizeof(run));
    int scale = 4096; // 2 files x 1317 x 4096 floats = 43 MB
    struct fake_ckpt c;
    fake_fill(&c, 1, scale);
    double t0 = now_s();
    assert_int_equal(kiln_ckpt_save(run, 1, c.files, 2, NULL, NULL, &err), 0);
    double t1 = now_s();
    assert_int_equal(kiln_ckpt_find_latest(run, found, sizeof(found), NULL, NULL, &err), 0);
    double t2 = now_s();
    double mb = 2.0 * 1317 * scale * 4 / 1e6;
    fprintf(stderr,
            "[ckpt] %.0f MB: save %.0f ms (%.0f MB/s incl. fsync + sha256), verify %.0f ms (%.0f MB/s)\n", mb,
            1e3 * (t1 - t0), mb / (t1 - t0), 1e3 * (t2 - t1), mb / (t2 - t1));
    fake_free(&c);
    test_rmrf(run);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_then_load_round_trips_everything),
        cmocka_unit_test(test_save_rejects_bad_arguments),
        cmocka_unit_test(test_pruning_hand_worked_examples),
        cmocka_unit_test(test_pruning_random_policies_match_the_rule),
        cmocka_unit_test(test_corrupt_newest_checkpoint_is_skipped_for_the_previous_one),
        cmocka_unit_test(test_leftovers_and_strays_are_never_chosen),
        cmocka_unit_test(test_sigkill_during_saves_never_loses_the_last_good_checkpoint),
        cmocka_unit_test(test_save_and_verify_throughput_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
