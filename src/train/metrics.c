// metrics.jsonl (and TensorBoard). See metrics.h.
#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/fsutil.h"

struct kiln_metrics {
    FILE *jsonl;
};

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
    *out = m;
    return 0;
}

void kiln_metrics_write(struct kiln_metrics *m, const struct kiln_metrics_row *r) {
    FILE *f = m->jsonl;
    fprintf(f,
            "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens_per_s\":%.1f,\"ms\":%.3f,"
            "\"peak_mem_bytes\":%zu",
            (long long)r->step, r->loss, r->lr, r->grad_norm, r->tokens_per_s, r->ms, r->peak_mem_bytes);
    if (r->mfu > 0)
        fprintf(f, ",\"mfu\":%.4f,\"mfu_causal\":%.4f", r->mfu, r->mfu_causal);
    if (r->hfu > 0) // with recompute: model FLOPs plus the recomputed forward work
        fprintf(f, ",\"hfu\":%.4f", r->hfu);
    if (!isnan(r->val_loss))
        fprintf(f, ",\"val_loss\":%.6f", r->val_loss);
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
    if (r->prev_ckpt_write_ms > 0) // the background write of the previous checkpoint, finished by now
        fprintf(f, ",\"prev_ckpt_write_ms\":%.3f", r->prev_ckpt_write_ms);
    fprintf(f, "}\n");
    fflush(f);
}

void kiln_metrics_close(struct kiln_metrics *m) {
    if (!m)
        return;
    fclose(m->jsonl);
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
