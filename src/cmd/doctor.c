// kiln doctor RUN: reads the hang watchdog's dumps (RUN/hang/rank-N.txt, parallel/comm/watchdog.h) and says which
// rank stalled, where it was, who waited on it, and which collectives the ranks disagree on
// (kiln_hang_diagnose). Exit 0 with a diagnosis, 1 when there are no dumps to read, 2 on a usage error.
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd/cmd.h"
#include "parallel/comm/flight.h"
#include "io/fsutil.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln doctor RUN\n"
               "  explains a hang from the watchdog's dumps in RUN/hang/rank-N.txt (or RUN itself, e.g.\n"
               "  ./kiln-hang for a run without --out): which rank never entered which collective, where it\n"
               "  was, which ranks waited on it, and collectives the ranks disagree on. Dumps of SIGUSR2\n"
               "  (rank-N-usr2.txt) are read when there are no others.\n");
}

// The dump files in dir: the watchdog's, else SIGUSR2's. Returns how many (0: none).
static int list_dumps(const char *dir, glob_t *g) {
    char pat[1200];
    snprintf(pat, sizeof(pat), "%s/rank-*.txt", dir);
    if (glob(pat, 0, NULL, g) != 0)
        return 0;
    // the watchdog's own dumps first: rank-N.txt without a suffix
    size_t keep = 0;
    for (size_t i = 0; i < g->gl_pathc; i++)
        if (!strstr(strrchr(g->gl_pathv[i], '/'), "-usr2"))
            keep++;
    if (keep == 0 || keep == g->gl_pathc)
        return (int)g->gl_pathc;
    size_t j = 0;
    for (size_t i = 0; i < g->gl_pathc; i++)
        if (!strstr(strrchr(g->gl_pathv[i], '/'), "-usr2")) {
            char *t = g->gl_pathv[j];
            g->gl_pathv[j++] = g->gl_pathv[i];
            g->gl_pathv[i] = t;
        }
    return (int)keep;
}

static int by_rank(const void *a, const void *b) {
    const struct kiln_hang_dump *x = a, *y = b;
    return x->rank - y->rank;
}

static double mtime(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9 : 0;
}

int cmd_doctor(int argc, char **argv, const struct kiln_knobs *knobs) {
    (void)knobs; // (it reads a run's reports, nothing the knobs tune)
    const char *run = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' || run) {
            fprintf(stderr,
                    "error: unexpected argument '%s' (kiln doctor): it takes one run directory; "
                    "usage: kiln doctor RUN\n",
                    argv[i]);
            return 2;
        }
        run = argv[i];
    }
    if (!run) {
        fprintf(stderr, "error: no run directory (kiln doctor): usage: kiln doctor RUN\n");
        return 2;
    }
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s/hang", run);
    if (!kiln_is_dir(dir))
        snprintf(dir, sizeof(dir), "%s", run); // a directory of dumps itself (./kiln-hang)
    glob_t g;
    int n = list_dumps(dir, &g);
    if (n == 0) {
        fprintf(stderr,
                "error: no hang dumps in %s/hang (kiln doctor): the directory is missing or holds no "
                "rank-N.txt; the watchdog writes them when a job hangs (--hang-timeout), and kill -USR2 on a "
                "rank writes rank-N-usr2.txt\n",
                run);
        return 1; // (glob found nothing: g holds nothing to free)
    }
    struct kiln_hang_dump *d = calloc((size_t)n, sizeof(*d));
    int m = 0, unreadable = 0;
    double newest = -1;
    char job[32] = "";
    for (int i = 0; i < n; i++) {
        struct kiln_error err = {0};
        if (kiln_hang_dump_read(g.gl_pathv[i], &d[m], &err)) {
            fprintf(stderr, "kiln doctor: skipping %s\n", err.msg);
            unreadable++;
            continue;
        }
        double t = mtime(g.gl_pathv[i]);
        if (t > newest) { // the newest dump's job is the one to explain
            newest = t;
            snprintf(job, sizeof(job), "%s", d[m].job);
        }
        m++;
    }
    globfree(&g);
    // only the newest job's dumps: an earlier attempt's may still lie in the same directory
    int k = 0, older = 0;
    for (int i = 0; i < m; i++) {
        if (strcmp(d[i].job, job)) {
            kiln_hang_dump_free(&d[i]);
            older++;
        } else {
            d[k++] = d[i];
        }
    }
    if (k == 0) {
        fprintf(stderr,
                "error: no readable hang dump in %s (kiln doctor): %d file(s) could not be parsed (above)\n",
                dir, unreadable);
        free(d);
        return 1;
    }
    qsort(d, (size_t)k, sizeof(*d), by_rank);
    int world = d[0].world;
    printf("kiln doctor: %s: %d of %d rank(s) dumped (job %s, --hang-timeout=%g)", dir, k, world, job,
           d[0].hang_timeout_s);
    if (older)
        printf("; %d dump(s) of an earlier job ignored", older);
    printf("\n");
    // the ranks without a dump: killed before they wrote one, or their RUN/hang is not this one
    char missing[512] = "";
    size_t len = 0;
    for (int r = 0, j = 0; r < world && len + 16 < sizeof(missing); r++) {
        while (j < k && d[j].rank < r)
            j++;
        if (j >= k || d[j].rank != r)
            len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%d", len ? ", " : "", r);
    }
    if (missing[0])
        printf("no dump from rank(s) %s: killed before writing one, or on a host that does not share %s\n",
               missing, dir);
    int fired = 0;
    for (int i = 0; i < k; i++)
        if (!strcmp(d[i].trigger, "self") && fired++ < 3)
            printf("rank %d's watchdog fired: %s\n", d[i].rank, d[i].reason);
    if (fired > 3)
        printf("(and %d more ranks' watchdogs)\n", fired - 3);
    kiln_hang_diagnose(d, k, stdout);
    for (int i = 0; i < k; i++)
        kiln_hang_dump_free(&d[i]);
    free(d);
    return 0;
}
