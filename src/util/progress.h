// A compact live progress line on stderr: "step 120/1200 | loss 2.1345 | 12.3k tok/s | ETA 1m23s".
// On a terminal it redraws in place; otherwise it prints a plain line now and then.
#ifndef KILN_UTIL_PROGRESS_H
#define KILN_UTIL_PROGRESS_H

#include <stdio.h>

struct kiln_progress {
    int enabled;
    int tty;
    int total;
    double t_start;
    double t_last_print;
    int last_len;
};

double kiln_now_s(void); // monotonic seconds
void kiln_progress_begin(struct kiln_progress *p, int total, int enabled);
// extra: any further fields (already formatted), may be NULL
void kiln_progress_update(struct kiln_progress *p, int step, double loss, double tok_per_s,
                          const char *extra);
// prints a full line (e.g. an eval result) without garbling the live line
void kiln_progress_note(struct kiln_progress *p, const char *line);
void kiln_progress_end(struct kiln_progress *p);
void kiln_format_duration(double s, char *buf, size_t cap);

// The last lines of progress (every step's line, printed or not, and every note), kept for the hang
// watchdog's dump (parallel/comm/watchdog.h). Thread-safe.
#define KILN_LOG_RECENT 32
void kiln_log_remember(const char *line);
// Writes the remembered lines, oldest first, each indented by two spaces. Gives up (writes nothing) if the
// lock stays busy for a second: the thread that holds it may be the one that hangs.
void kiln_log_write_recent(FILE *f);

#endif
