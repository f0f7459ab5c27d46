#include "util/progress.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t recent_mu = PTHREAD_MUTEX_INITIALIZER;
static char recent[KILN_LOG_RECENT][256];
static unsigned n_recent; // lines remembered so far

void kiln_log_remember(const char *line) {
    pthread_mutex_lock(&recent_mu);
    char *slot = recent[n_recent % KILN_LOG_RECENT];
    size_t n = strnlen(line, sizeof(recent[0]) - 1); // a longer line is cut
    memcpy(slot, line, n);
    slot[n] = 0;
    n_recent++;
    pthread_mutex_unlock(&recent_mu);
}

void kiln_log_write_recent(FILE *f) {
    int locked = 0;
    for (int i = 0; i < 100 && !locked; i++)
        if (!(locked = (pthread_mutex_trylock(&recent_mu) == 0)))
            usleep(10000);
    if (!locked)
        return;
    unsigned first = n_recent > KILN_LOG_RECENT ? n_recent - KILN_LOG_RECENT : 0;
    for (unsigned i = first; i < n_recent; i++)
        fprintf(f, "  %s\n", recent[i % KILN_LOG_RECENT]);
    pthread_mutex_unlock(&recent_mu);
}

double kiln_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kiln_format_duration(double s, char *buf, size_t cap) {
    if (s < 0 || s != s)
        s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

void kiln_progress_begin(struct kiln_progress *p, int total, int enabled) {
    memset(p, 0, sizeof(*p));
    p->enabled = enabled;
    p->tty = isatty(fileno(stderr));
    p->total = total;
    p->t_start = kiln_now_s();
}

static void format_rate(double r, char *buf, size_t cap) {
    if (r >= 1e6)
        snprintf(buf, cap, "%.2fM", r / 1e6);
    else if (r >= 1e3)
        snprintf(buf, cap, "%.1fk", r / 1e3);
    else
        snprintf(buf, cap, "%.0f", r);
}

void kiln_progress_update(struct kiln_progress *p, int step, double loss, double tok_per_s,
                          const char *extra) {
    double now = kiln_now_s();
    char rate[32], eta[32], line[512];
    format_rate(tok_per_s, rate, sizeof(rate));
    double elapsed = now - p->t_start;
    kiln_format_duration(step > 0 ? elapsed / step * (p->total - step) : 0, eta, sizeof(eta));
    int n = snprintf(line, sizeof(line), "step %d/%d | loss %.4f | %s tok/s%s%s | ETA %s", step, p->total,
                     loss, rate, extra ? " | " : "", extra ? extra : "", eta);
    kiln_log_remember(line); // every rank, every step: what a hang dump shows
    if (!p->enabled)
        return;
    int last = step == p->total;
    // on a terminal redraw at most 10x a second; in a log, a line every 10 s (and the last step)
    if (!last && now - p->t_last_print < (p->tty ? 0.1 : 10.0))
        return;
    p->t_last_print = now;
    if (p->tty) {
        fprintf(stderr, "\r%s%*s", line, p->last_len > n ? p->last_len - n : 0, "");
        p->last_len = n;
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
}

void kiln_progress_note(struct kiln_progress *p, const char *line) {
    kiln_log_remember(line);
    if (!p->enabled)
        return;
    if (p->tty && p->last_len) {
        fprintf(stderr, "\r%*s\r", p->last_len, "");
        p->last_len = 0;
        p->t_last_print = 0;
    }
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

void kiln_progress_end(struct kiln_progress *p) {
    if (p->enabled && p->tty && p->last_len)
        fprintf(stderr, "\n");
    p->last_len = 0;
}
