// Noticing a rank that died. See peers.h.
#include "parallel/comm/peers.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/error.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct kiln_peer *peers; // (world)
static int my_rank, n_peers, reported;

// /proc/PID/stat: its state letter, start time and, for a zombie, its wait status (field 52, Linux 3.5+).
// 0 when it was read, -1 when the process is gone.
static int read_stat(int pid, char *state, uint64_t *start, int *exit_code) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); // the name may hold spaces and parentheses
    if (!p)
        return -1;
    // fields from 3 (state) on, space-separated
    *state = p[2];
    *start = 0;
    *exit_code = -1;
    int field = 3;
    for (char *t = p + 2; *t; field++) {
        if (field == 22)
            *start = strtoull(t, NULL, 10);
        if (field == 52)
            *exit_code = atoi(t);
        t = strchr(t, ' ');
        if (!t)
            break;
        t++;
    }
    return 0;
}

void kiln_peer_self(struct kiln_peer *me) {
    memset(me, 0, sizeof(*me));
    me->pid = (int32_t)getpid();
    char state;
    int code;
    read_stat(me->pid, &state, &me->start_ticks, &code);
    char boot[40] = "", ns[40] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    ns[n > 0 ? n : 0] = 0;
    snprintf(me->machine, sizeof(me->machine), "%.36s %.26s", boot, ns);
    if (gethostname(me->host, sizeof(me->host) - 1) != 0)
        snprintf(me->host, sizeof(me->host), "?");
}

void kiln_peers_set(int rank, int world, const struct kiln_peer *all) {
    pthread_mutex_lock(&mu);
    if (!peers && world > 1) {
        peers = kiln_xmalloc((size_t)world * sizeof(*peers));
        memcpy(peers, all, (size_t)world * sizeof(*peers));
        my_rank = rank;
        n_peers = world;
        reported = 0;
    }
    pthread_mutex_unlock(&mu);
}

void kiln_peers_clear(void) {
    pthread_mutex_lock(&mu);
    free(peers);
    peers = NULL;
    n_peers = 0;
    pthread_mutex_unlock(&mu);
}

// 1: rank r's process lives (a stopped one too), 0: gone or a zombie (*code: its wait status, or -1)
static int alive(int r, int *code) {
    char state;
    uint64_t start;
    *code = -1;
    if (read_stat(peers[r].pid, &state, &start, code) != 0 || start != peers[r].start_ticks) {
        *code = -1;
        return 0; // (another process under a reused pid: the rank's is gone)
    }
    if (state == 'Z' || state == 'X')
        return 0;
    *code = -1;
    return 1;
}

int kiln_peers_check(char *out, size_t cap) {
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (!peers || reported) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    const char *here = peers[my_rank].machine;
    int dead = -1, dead_code = -1, lowest_living = my_rank;
    for (int r = 0; r < n_peers; r++) {
        int code;
        if (r == my_rank || strcmp(peers[r].machine, here))
            continue;
        if (alive(r, &code)) {
            if (r < lowest_living)
                lowest_living = r;
        } else if (dead < 0) {
            dead = r;
            dead_code = code;
        }
    }
    if (dead >= 0) {
        reported = 1;
        rc = lowest_living == my_rank ? 1 : 2;
        int n = snprintf(out, cap, "rank %d (pid %d on %s) ", dead, (int)peers[dead].pid, peers[dead].host);
        if (n < 0 || (size_t)n >= cap)
            n = 0;
        if (dead_code > 0 && WIFSIGNALED(dead_code))
            snprintf(out + n, cap - (size_t)n, "was killed by signal %d (SIG%s)", WTERMSIG(dead_code),
                     sigabbrev_np(WTERMSIG(dead_code)) ? sigabbrev_np(WTERMSIG(dead_code)) : "?");
        else if (dead_code > 0 && WIFEXITED(dead_code)) // (0: an exit 0, or a status /proc did not show)
            snprintf(out + n, cap - (size_t)n, "exited with status %d", WEXITSTATUS(dead_code));
        else // reaped already: the signal or status went to its parent alone
            snprintf(out + n, cap - (size_t)n,
                     "died: its process is gone; the signal or exit status that "
                     "ended it went to its launcher alone (mpirun and srun report it)");
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
