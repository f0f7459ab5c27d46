// Config and checkpoint agreement across ranks. See agree.h.
#include "run/agree.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/sha256.h"

// Options whose values may differ between ranks: each is read only by rank 0 (the metrics and their
// TensorBoard copy, the progress line, the samples) or stays inside one rank (its CPU threads, its watchdog's
// timeout, the peak FLOP/s its MFU divides by).
static const char *const MAY_DIFFER[] = {"log-every",  "quiet",       "sample-every", "threads",
                                         "peak-flops", "tensorboard", "hang-timeout"};

static int may_differ(const char *name) {
    for (size_t i = 0; i < sizeof(MAY_DIFFER) / sizeof(MAY_DIFFER[0]); i++)
        if (!strcmp(name, MAY_DIFFER[i]))
            return 1;
    return 0;
}

// What is compared of a value. --out: whether it is set (only rank 0 uses the path: it names the checkpoint
// directories every rank writes into and resumes from, so another rank may spell it otherwise, e.g.
// relative to another working directory); without it a rank would skip the checkpoints' collectives.
// --resume: auto, never, or a checkpoint (which one is kiln_agree_checkpoint's to compare: the path may be
// spelled otherwise too).
static const char *compared(const char *name, const char *value) {
    if (!strcmp(name, "out"))
        return value[0] ? "(set)" : "";
    if (!strcmp(name, "resume") && strcmp(value, "auto") && strcmp(value, "never"))
        return "(a checkpoint)";
    return value;
}

// root's text (a NUL-terminated string) on every rank, malloc'd
static char *share_text(struct kiln_comm *c, const char *text, int root) {
    int64_t n = c->rank == root ? (int64_t)strlen(text) + 1 : 0;
    kiln_comm_broadcast_host(c, &n, sizeof(n), root);
    char *buf = kiln_xmalloc((size_t)n);
    if (c->rank == root)
        memcpy(buf, text, (size_t)n);
    kiln_comm_broadcast_host(c, buf, (size_t)n, root);
    buf[n - 1] = 0;
    return buf;
}

// Every rank's digest against rank 0's. Returns the first rank whose digest differs (0: none); then *root and
// *theirs hold rank 0's and that rank's texts (malloc'd), the same on every rank.
static int first_differing(struct kiln_comm *c, const uint8_t digest[32], const char *text, char **root,
                           char **theirs) {
    uint8_t *all = kiln_xmalloc((size_t)c->size * 32);
    kiln_comm_all_gather_host(c, digest, all, 32);
    int d = 0;
    for (int r = 1; r < c->size && !d; r++)
        if (memcmp(all + (size_t)r * 32, all, 32))
            d = r;
    free(all);
    if (d) {
        *root = share_text(c, text, 0);
        *theirs = share_text(c, text, d);
    }
    return d;
}

// The options that must agree, one `name=value` line each (the value as `RUN/config` writes it); the digest
// covers what is compared of each.
static char *config_text(const struct kiln_config *cfg, uint8_t digest[32]) {
    size_t cap = 4096, len = 0;
    char *text = kiln_xmalloc(cap);
    text[0] = 0;
    struct kiln_sha256 h;
    kiln_sha256_init(&h);
    for (size_t i = 0; i < kiln_config_n_options(); i++) {
        const char *name = kiln_config_option_name(i);
        if (may_differ(name))
            continue;
        char value[1100];
        kiln_config_option_value(cfg, i, value, sizeof(value));
        const char *cmp = compared(name, value);
        kiln_sha256_update(&h, name, strlen(name) + 1);
        kiln_sha256_update(&h, cmp, strlen(cmp) + 1);
        size_t need = strlen(name) + strlen(value) + 3;
        if (len + need > cap) {
            cap = 2 * (len + need);
            text = kiln_xrealloc(text, cap);
        }
        len += (size_t)snprintf(text + len, cap - len, "%s=%s\n", name, value);
    }
    kiln_sha256_final(&h, digest);
    return text;
}

// The value of option `name` in a config_text, pointing into it (up to the newline); NULL when absent.
static const char *find_value(const char *text, const char *name, size_t *len) {
    size_t n = strlen(name);
    for (const char *l = text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        if (!strncmp(l, name, n) && l[n] == '=') {
            *len = strcspn(l + n + 1, "\n");
            return l + n + 1;
        }
    }
    return NULL;
}

int kiln_agree_config(struct kiln_comm *comm, const struct kiln_config *cfg, struct kiln_error *err) {
    if (!comm || comm->size <= 1)
        return 0;
    uint8_t digest[32];
    char *mine = config_text(cfg, digest), *root = NULL, *theirs = NULL;
    int d = first_differing(comm, digest, mine, &root, &theirs);
    free(mine);
    if (!d)
        return 0;
    // the first option, in the table's order, whose compared values differ
    int rc = KILN_ERR_USAGE;
    for (size_t i = 0; i < kiln_config_n_options(); i++) {
        const char *name = kiln_config_option_name(i);
        size_t la = 0, lb = 0;
        const char *a = find_value(root, name, &la), *b = find_value(theirs, name, &lb);
        if (!a || !b)
            continue;
        char va[1100], vb[1100];
        snprintf(va, sizeof(va), "%.*s", (int)la, a);
        snprintf(vb, sizeof(vb), "%.*s", (int)lb, b);
        if (!strcmp(compared(name, va), compared(name, vb)))
            continue;
        kiln_errorf(err, rc,
                    "rank %d has %s=%s where rank 0 has %s=%s (--%s): every rank must run the same config; "
                    "give every rank the same options (docs/distributed.md, \"What the ranks agree on\")",
                    d, name, vb[0] ? vb : "(none)", name, va[0] ? va : "(none)", name);
        free(root);
        free(theirs);
        return rc;
    }
    // (the digests differ, so some compared value does: this is only a guard)
    kiln_errorf(err, rc,
                "rank %d's config differs from rank 0's (--config): every rank must run the same config", d);
    free(root);
    free(theirs);
    return rc;
}

int kiln_agree_checkpoint(struct kiln_comm *comm, const char *dir, const char *state_json, long long step,
                          struct kiln_error *err) {
    if (!comm || comm->size <= 1)
        return 0;
    uint8_t digest[32];
    kiln_sha256(state_json, strlen(state_json), digest);
    char hex[65], text[1300];
    kiln_sha256_hex(digest, hex);
    snprintf(text, sizeof(text), "%s (step %lld, state.json %.12s)", dir, step, hex);
    char *root = NULL, *theirs = NULL;
    int d = first_differing(comm, digest, text, &root, &theirs);
    if (!d)
        return 0;
    kiln_errorf(err, KILN_ERR_USAGE,
                "rank %d resumes from %s where rank 0 resumes from %s (--resume): every rank must resume "
                "from the same checkpoint; give every rank the same --out and --resume, on storage every "
                "rank reads alike",
                d, theirs, root);
    free(root);
    free(theirs);
    return KILN_ERR_USAGE;
}
