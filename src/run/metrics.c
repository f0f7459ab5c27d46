// metrics.jsonl (and TensorBoard). See metrics.h.
#include "run/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "io/fsutil.h"
#include "io/tensorboard.h"

struct kiln_metrics {
    FILE *jsonl; // written only through its descriptor, a whole line at a time (kiln_metrics_write)
    char path[1200];
    int warned;         // a failed write was reported (once: the run goes on, and so do the writes)
    struct kiln_tb *tb; // --tensorboard, or NULL (also after a failed write)
};

// The run's options as the Text tab's first entry, as a Markdown code block (one option a line).
static int tb_write_config(struct kiln_tb *tb, const struct kiln_config *cfg, int64_t step,
                           struct kiln_error *err) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot format the config for TensorBoard: out of memory");
    kiln_config_write(cfg, f);
    fclose(f);
    size_t lines = 1;
    for (size_t i = 0; i < n; i++)
        lines += buf[i] == '\n';
    char *md = kiln_xmalloc(n + 4 * lines + 1), *o = md;
    for (char *line = buf; *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line + 1) : strlen(line);
        memcpy(o, "    ", 4);
        memcpy(o + 4, line, len);
        o += 4 + len;
        line += len;
    }
    *o = '\0';
    int rc = kiln_tb_write_text(tb, step, "config", md, err);
    free(md);
    free(buf);
    return rc;
}

int kiln_metrics_open(const struct kiln_config *cfg, int64_t resumed_step, struct kiln_metrics **out,
                      struct kiln_error *err) {
    *out = NULL;
    char path[1200];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", cfg->out);
    int rc;
    // a killed run may have logged steps past its last checkpoint: those lines go, the rest is appended to
    if (resumed_step > 0 && (rc = kiln_metrics_truncate(path, resumed_step, err)))
        return rc;
    FILE *f = fopen(path, resumed_step > 0 ? "a" : "w");
    if (!f)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: %s", path, strerror(errno));
    struct kiln_metrics *m = kiln_xcalloc(1, sizeof(*m));
    m->jsonl = f;
    snprintf(m->path, sizeof(m->path), "%s", path);
    // Every open starts a new event file (TensorBoard merges a directory's files) with a session start at the
    // first step to come: as in metrics.jsonl, what a killed run logged past its checkpoint is dropped.
    if (cfg->tensorboard[0] && ((rc = kiln_tb_open(cfg->tensorboard, "--tensorboard", &m->tb, err)) ||
                                (rc = kiln_tb_write_start(m->tb, resumed_step + 1, err)) ||
                                (rc = tb_write_config(m->tb, cfg, resumed_step, err)))) {
        kiln_metrics_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

// The row's numbers as scalars, tagged by what they measure.
static void tb_write_row(struct kiln_metrics *m, const struct kiln_metrics_row *r) {
    struct kiln_tb_scalar v[24];
    int n = 0;
    v[n++] = (struct kiln_tb_scalar){"train/loss", r->loss};
    v[n++] = (struct kiln_tb_scalar){"train/lr", r->lr};
    v[n++] = (struct kiln_tb_scalar){"train/grad_norm", r->grad_norm};
    if (r->tokens > 0)
        v[n++] = (struct kiln_tb_scalar){"train/tokens", (double)r->tokens};
    if (!isnan(r->val_loss))
        v[n++] = (struct kiln_tb_scalar){"val/loss", r->val_loss};
    v[n++] = (struct kiln_tb_scalar){"perf/tokens_per_s", r->tokens_per_s};
    v[n++] = (struct kiln_tb_scalar){"perf/step_ms", r->ms};
    v[n++] = (struct kiln_tb_scalar){"perf/peak_mem_bytes", (double)r->peak_mem_bytes};
    if (r->mfu > 0) {
        v[n++] = (struct kiln_tb_scalar){"perf/mfu", r->mfu};
        v[n++] = (struct kiln_tb_scalar){"perf/mfu_causal", r->mfu_causal};
    }
    if (r->hfu > 0)
        v[n++] = (struct kiln_tb_scalar){"perf/hfu", r->hfu};
    if (!isnan(r->comm_wait_ms))
        v[n++] = (struct kiln_tb_scalar){"perf/comm_wait_ms", r->comm_wait_ms};
    if (r->slowest_ms > 0)
        v[n++] = (struct kiln_tb_scalar){"perf/slowest_rank_ms", r->slowest_ms};
    if (r->comm_ops > 0)
        v[n++] = (struct kiln_tb_scalar){"perf/comm_ops", (double)r->comm_ops};
    if (r->offload_ms > 0) {
        v[n++] = (struct kiln_tb_scalar){"perf/offload_ms", r->offload_ms};
        v[n++] = (struct kiln_tb_scalar){"perf/offload_wait_ms", r->offload_wait_ms};
        if (r->offload_copy_gbps > 0)
            v[n++] = (struct kiln_tb_scalar){"perf/offload_copy_gbps", r->offload_copy_gbps};
    }
    if (!isnan(r->ckpt_stall_ms))
        v[n++] = (struct kiln_tb_scalar){"ckpt/stall_ms", r->ckpt_stall_ms};
    if (r->prev_ckpt_write_ms > 0)
        v[n++] = (struct kiln_tb_scalar){"ckpt/prev_write_ms", r->prev_ckpt_write_ms};
    if (r->skipped_total) {
        v[n++] = (struct kiln_tb_scalar){"guards/skipped_steps", (double)r->skipped_total};
        v[n++] = (struct kiln_tb_scalar){"guards/skipped_nan", (double)r->skipped_nan};
        v[n++] = (struct kiln_tb_scalar){"guards/skipped_spike_loss", (double)r->skipped_spike_loss};
        v[n++] = (struct kiln_tb_scalar){"guards/skipped_spike_grad", (double)r->skipped_spike_grad};
    }
    struct kiln_error err;
    if (kiln_tb_write_scalars(m->tb, r->step, v, n, &err)) {
        // metrics.jsonl goes on; one warning rather than one per step
        fprintf(stderr, "kiln: warning: TensorBoard writing stopped: %s\n", err.msg);
        kiln_tb_close(m->tb);
        m->tb = NULL;
    }
}

// ,"key":value in fmt, or null where the value is not finite (JSON has no NaN: a skipped step's loss or norm)
static void put_num(FILE *f, const char *key, const char *fmt, double v) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f);
}

// One line to the end of metrics.jsonl, whole or not at all: a write that fails part-way (a full disk, a
// quota, the file size limit) is cut back to where the line began, so that the next line starts on a line
// boundary and every line parses. The first failure is reported once; training goes on, and so do the
// writes (the disk may get space back).
static void append_line(struct kiln_metrics *m, const char *line, size_t n) {
    int fd = fileno(m->jsonl);
    off_t at = lseek(fd, 0, SEEK_END);
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, line + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    if (done == n)
        return;
    int why = errno ? errno : ENOSPC;
    if (done > 0 && at >= 0 && ftruncate(fd, at) != 0 && !m->warned)
        fprintf(stderr, "kiln: warning: %s could not be cut back to its last whole line: %s\n", m->path,
                strerror(errno));
    if (!m->warned)
        fprintf(
            stderr,
            "kiln: warning: cannot write %s: %s; training goes on, and the lines that do not fit are left "
            "out (once there is space again, the next ones are written)\n",
            m->path, strerror(why));
    m->warned = 1;
}

void kiln_metrics_write(struct kiln_metrics *m, const struct kiln_metrics_row *r) {
    char *line = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&line, &len);
    KILN_ASSERT(f);
    fprintf(f, "{\"step\":%lld", (long long)r->step);
    put_num(f, "loss", "%.6f", r->loss);
    put_num(f, "lr", "%.6g", r->lr);
    put_num(f, "grad_norm", "%.6g", r->grad_norm);
    fprintf(f, ",\"tokens_per_s\":%.1f,\"ms\":%.3f,\"peak_mem_bytes\":%zu", r->tokens_per_s, r->ms,
            r->peak_mem_bytes);
    if (r->mfu > 0)
        fprintf(f, ",\"mfu\":%.4f,\"mfu_causal\":%.4f", r->mfu, r->mfu_causal);
    if (r->hfu > 0) // with recompute: model FLOPs plus the recomputed forward work
        fprintf(f, ",\"hfu\":%.4f", r->hfu);
    if (!isnan(r->val_loss))
        put_num(f, "val_loss", "%.6f", r->val_loss);
    if (r->skipped)
        fprintf(f, ",\"skipped\":\"%s\"", r->skipped);
    if (r->skipped_total)
        fprintf(f,
                ",\"skipped_steps\":%lld,\"skipped_nan\":%lld,\"skipped_spike_loss\":%lld,"
                "\"skipped_spike_grad\":%lld",
                (long long)r->skipped_total, (long long)r->skipped_nan, (long long)r->skipped_spike_loss,
                (long long)r->skipped_spike_grad);
    if (!isnan(r->ckpt_stall_ms))
        fprintf(f, ",\"ckpt_stall_ms\":%.3f", r->ckpt_stall_ms);
    if (!isnan(r->comm_wait_ms))
        fprintf(f, ",\"comm_wait_ms\":%.3f", r->comm_wait_ms);
    if (r->slowest_ms > 0)
        fprintf(f, ",\"slowest_rank_ms\":%.3f", r->slowest_ms);
    if (r->comm_ops > 0)
        fprintf(f, ",\"comm_ops\":%lld", (long long)r->comm_ops);
    if (r->offload_ms > 0)
        fprintf(f, ",\"offload_ms\":%.3f,\"offload_wait_ms\":%.3f", r->offload_ms, r->offload_wait_ms);
    if (r->offload_copy_gbps > 0)
        fprintf(f, ",\"offload_copy_gbps\":%.2f", r->offload_copy_gbps);
    if (r->prev_ckpt_write_ms > 0) // the background write of the previous checkpoint, finished by now
        fprintf(f, ",\"prev_ckpt_write_ms\":%.3f", r->prev_ckpt_write_ms);
    if (r->tokens > 0)
        fprintf(f, ",\"tokens\":%lld", (long long)r->tokens);
    fprintf(f, "}\n");
    fclose(f);
    errno = 0;
    append_line(m, line, len);
    free(line);
    if (m->tb)
        tb_write_row(m, r);
}

void kiln_metrics_close(struct kiln_metrics *m) {
    if (!m)
        return;
    fclose(m->jsonl);
    kiln_tb_close(m->tb);
    free(m);
}

// ----------------------------------------------------------------------------
// truncation after a resume

int kiln_metrics_truncate(const char *path, int64_t step, struct kiln_error *err) {
    char *data;
    size_t n;
    FILE *probe = fopen(path, "rb");
    if (!probe)
        return errno == ENOENT
                   ? 0
                   : kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read %s: %s", path, strerror(errno));
    fclose(probe);
    int rc = kiln_read_file(path, &data, &n, err);
    if (rc)
        return rc;
    char *out = kiln_xmalloc(n + 1);
    size_t m = 0;
    for (char *line = data; line < data + n;) {
        char *nl = memchr(line, '\n', (size_t)(data + n - line));
        if (!nl)
            break; // a torn last line
        long long s;
        if (sscanf(line, "{\"step\":%lld", &s) == 1 && s <= step) {
            memcpy(out + m, line, (size_t)(nl - line + 1));
            m += (size_t)(nl - line + 1);
        }
        line = nl + 1;
    }
    rc = m == n ? 0 : kiln_write_file_atomic(path, out, m, err);
    free(out);
    free(data);
    return rc;
}
