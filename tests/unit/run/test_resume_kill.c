// The kill test: `kiln train --ckpt-every=1|2` SIGKILLed at 20 random moments (many land while the background
// thread writes a checkpoint), resumed each time. Every checkpoint on disk verifies after every kill, every
// resume succeeds, the metrics hold each step once with the uninterrupted run's loss, and the final weights
// equal the uninterrupted run's byte for byte. Runs the kiln binary built next to this test.
#include "test_util.h"

#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <sys/wait.h>

#include "io/checkpoint.h"
#include "io/fsutil.h"

enum { N_KILLS = 20, N_STEPS = 600 };

static char kiln_path[1200];
static uint64_t model_seed;

static pid_t spawn(const char *out, int ckpt_every) {
    char a_out[1100], a_ckpt[32], a_seed[48], a_steps[32];
    snprintf(a_out, sizeof(a_out), "--out=%s", out);
    snprintf(a_ckpt, sizeof(a_ckpt), "--ckpt-every=%d", ckpt_every);
    snprintf(a_seed, sizeof(a_seed), "--seed=%llu", (unsigned long long)model_seed);
    snprintf(a_steps, sizeof(a_steps), "--max-steps=%d", N_STEPS);
    char *argv[] = {"kiln",      "train",          "--layers=1",  "--heads=2",   "--dim=32", "--seq=32",
                    "--batch=4", "--eval-every=0", "--threads=1", "--warmup=10", "--quiet",  a_out,
                    a_ckpt,      a_seed,           a_steps,       NULL};
    pid_t pid = fork();
    if (pid == 0) {
        execv(kiln_path, argv);
        _exit(127);
    }
    assert_true(pid > 0);
    return pid;
}

static int wait_status(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        assert_int_equal(errno, EINTR);
    return status;
}

// every step's "loss" field, as written; NULL where a step has no line. Fails on a step logged twice.
static void read_losses(const char *run, char losses[N_STEPS + 1][32]) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    memset(losses, 0, sizeof(char[N_STEPS + 1][32]));
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        int step;
        char loss[32];
        if (sscanf(line, "{\"step\":%d,\"loss\":%31[^,]", &step, loss) != 2 || step < 1 || step > N_STEPS)
            fail_msg("bad metrics line in %s: %s", path, line);
        if (losses[step][0])
            fail_msg("step %d logged twice in %s", step, path);
        snprintf(losses[step], 32, "%s", loss);
    }
    fclose(f);
}

static void test_sigkill_at_random_moments_then_resume_is_bit_exact(void **state) {
    (void)state;
    char root[256], ref[300], run[300];
    test_tmpdir(root, sizeof(root));
    snprintf(ref, sizeof(ref), "%s/ref", root);
    snprintf(run, sizeof(run), "%s/run", root);
    uint64_t rs = test_seed() ^ 0xC0FFEEu;

    int st = wait_status(spawn(ref, 0));
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    int kills = 0, mid_write = 0, finished = 0;
    int64_t last_step = 0;
    while (kills < N_KILLS && !finished) {
        int every = 1 + (int)(test_rand_u64(&rs) % 2);
        pid_t pid = spawn(run, every);
        struct timespec ts = {0, (long)(5 + test_rand_u64(&rs) % 115) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        st = wait_status(pid);
        if (WIFEXITED(st)) { // it got to the end first; anything else is a failed resume
            if (WEXITSTATUS(st) != 0)
                fail_msg("kiln train exited %d after %d kills (a resume failed)", WEXITSTATUS(st), kills);
            finished = 1;
            break;
        }
        assert_int_equal(WTERMSIG(st), SIGKILL);
        kills++;
        // a temp directory left behind means the kill landed during a checkpoint write
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "ls -d '%s'/ckpt/.tmp-* >/dev/null 2>&1", run);
        mid_write += system(cmd) == 0;
        char **paths;
        int64_t *steps;
        struct kiln_error err;
        int n = kiln_ckpt_list(run, &paths, &steps, &err);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            if (kiln_ckpt_verify(paths[i], &err))
                fail_msg("after kill %d: checkpoint %s does not verify: %s", kills, paths[i], err.msg);
            free(paths[i]);
        }
        if (n > 0) {
            assert_true(steps[0] >= last_step); // progress is never lost past the newest checkpoint
            last_step = steps[0];
        }
        free(paths);
        free(steps);
    }
    fprintf(stderr, "[test] %d kills (%d during a checkpoint write), newest checkpoint at step %lld of %d\n",
            kills, mid_write, (long long)last_step, N_STEPS);
    assert_true(kills >= N_KILLS / 2); // the run is long enough that most kills land
    if (!finished) {
        st = wait_status(spawn(run, 2));
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }

    char a[400], b[400];
    snprintf(a, sizeof(a), "%s/model.safetensors", ref);
    snprintf(b, sizeof(b), "%s/model.safetensors", run);
    char *x, *y;
    size_t nx, ny;
    struct kiln_error err;
    if (kiln_read_file(a, &x, &nx, &err) || kiln_read_file(b, &y, &ny, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, nx);
    free(x);
    free(y);

    static char la[N_STEPS + 1][32], lb[N_STEPS + 1][32];
    read_losses(ref, la);
    read_losses(run, lb);
    int missing = 0;
    for (int s = 1; s <= N_STEPS; s++) {
        assert_true(la[s][0]);
        if (!lb[s][0])
            missing++; // only possible when a kill fell between a checkpoint's completion and its metrics
                       // line
        else if (strcmp(la[s], lb[s]))
            fail_msg("step %d: loss %s after kills, %s uninterrupted", s, lb[s], la[s]);
    }
    assert_true(missing <= 2);
    test_rmrf(root);
}

int main(void) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = 0;
    snprintf(kiln_path, sizeof(kiln_path), "%s/kiln", dirname(self));
    if (access(kiln_path, X_OK)) {
        fprintf(stderr, "test_resume_kill: %s not found: build the kiln target first\n", kiln_path);
        return 1;
    }
    model_seed = test_seed() % 1000003;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_at_random_moments_then_resume_is_bit_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
