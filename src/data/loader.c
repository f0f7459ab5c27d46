// The data loader (see loader.h for the order it promises).
#include "data/loader.h"

#include <glob.h>
#include <pthread.h>
#include <string.h>

#include "data/shards.h"
#include "util/error.h"

#define FEISTEL_ROUNDS 6

struct source {
    const void *tokens; // (n) uint16, uint32 or int32 (memory)
    int elem_bytes;     // 2 or 4
    uint64_t n;
};

struct kiln_loader {
    struct kiln_loader_opts o;
    int n_src;
    struct source *src;            // (n_src)
    struct kiln_token_file *files; // (n_src) for file sources, NULL for memory
    uint64_t *win_first;           // (n_src + 1) index of each source's first window
    uint64_t W, n_tokens;
    int half_bits; // Feistel halves: the domain is [0, 2^(2*half_bits)) >= W
    // position: rank's k-th element is base + rank + k*world; j = elements taken so far
    uint64_t base, j;
    // prefetch
    int32_t *pf_in, *pf_tgt; // (B*T) each
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int have_thread, stop, want, ready, busy;
    uint64_t req_base, req_j; // the batch the thread is asked for
};

static inline uint64_t mix64(uint64_t x) { // splitmix64 finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

// One pass of the Feistel network over 2*half bits.
static uint64_t feistel(uint64_t x, int half, const uint64_t *keys) {
    uint64_t mask = (half == 32) ? 0xFFFFFFFFULL : ((1ULL << half) - 1);
    uint64_t L = x >> half, R = x & mask;
    for (int r = 0; r < FEISTEL_ROUNDS; r++) {
        uint64_t f = mix64(R ^ keys[r]) & mask;
        uint64_t nl = R;
        R = L ^ f;
        L = nl;
    }
    return (L << half) | R;
}

uint64_t kiln_loader_stream_window(const struct kiln_loader *l, uint64_t g) {
    uint64_t e = g / l->W, i = g % l->W;
    if (!l->o.shuffle || l->W == 1)
        return i;
    uint64_t keys[FEISTEL_ROUNDS];
    for (int r = 0; r < FEISTEL_ROUNDS; r++)
        keys[r] =
            mix64(mix64(l->o.seed ^ 0x6b696c6e6c6f6164ULL) + mix64(e * FEISTEL_ROUNDS + (uint64_t)r + 1));
    // cycle walking: iterate the bijection on [0, 2^bits) until it lands in [0, W); ends because i < W
    uint64_t x = i;
    do
        x = feistel(x, l->half_bits, keys);
    while (x >= l->W);
    return x;
}

void kiln_loader_window(const struct kiln_loader *l, uint64_t w, int *file, uint64_t *offset) {
    int lo = 0, hi = l->n_src - 1; // last source with win_first <= w
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->win_first[mid] <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    while (l->win_first[lo + 1] <= w) // skip sources without windows
        lo++;
    *file = lo;
    *offset = (w - l->win_first[lo]) * (uint64_t)l->o.T;
}

static void fill_batch(const struct kiln_loader *l, uint64_t base, uint64_t j, int32_t *in, int32_t *tgt) {
    const int B = l->o.B, T = l->o.T;
    for (int b = 0; b < B; b++) {
        uint64_t g = base + (uint64_t)l->o.rank + (j + (uint64_t)b) * (uint64_t)l->o.world;
        int f;
        uint64_t off;
        kiln_loader_window(l, kiln_loader_stream_window(l, g), &f, &off);
        const struct source *s = &l->src[f];
        int32_t *x = in + (size_t)b * T, *y = tgt + (size_t)b * T;
        if (s->elem_bytes == 2) {
            const uint16_t *p = (const uint16_t *)s->tokens + off;
            for (int t = 0; t < T; t++) {
                x[t] = p[t];
                y[t] = p[t + 1];
            }
        } else {
            const int32_t *p = (const int32_t *)s->tokens + off;
            memcpy(x, p, sizeof(int32_t) * (size_t)T);
            memcpy(y, p + 1, sizeof(int32_t) * (size_t)T);
        }
    }
}

static void *prefetch_main(void *arg) {
    struct kiln_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        if (l->want && !l->ready) {
            uint64_t base = l->req_base, j = l->req_j;
            l->busy = 1;
            pthread_mutex_unlock(&l->mu);
            fill_batch(l, base, j, l->pf_in, l->pf_tgt);
            pthread_mutex_lock(&l->mu);
            l->busy = 0;
            if (l->want && l->req_base == base && l->req_j == j)
                l->ready = 1;
            pthread_cond_broadcast(&l->cv);
        } else {
            pthread_cond_wait(&l->cv, &l->mu);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

// Asks the thread for the batch at the current position (call with mu held).
static void request_current(struct kiln_loader *l) {
    if (!(l->want && l->req_base == l->base && l->req_j == l->j)) {
        l->want = 1;
        l->req_base = l->base;
        l->req_j = l->j;
        l->ready = 0;
        pthread_cond_broadcast(&l->cv);
    }
}

static int check_opts(const struct kiln_loader_opts *o, struct kiln_error *err) {
    if (o->B < 1 || o->T < 1)
        return kiln_errorf(err, KILN_ERR_USAGE, "bad loader shape (B=%d, T=%d): both must be >= 1", o->B,
                           o->T);
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "bad loader rank (rank %d of world %d): need 0 <= rank < world", o->rank,
                           o->world);
    return 0;
}

// Computes windows and starts the thread once sources are in place.
static int finish_open(struct kiln_loader *l, const char *what, struct kiln_error *err) {
    l->win_first = kiln_xcalloc((size_t)l->n_src + 1, sizeof(uint64_t));
    const uint64_t T = (uint64_t)l->o.T;
    for (int i = 0; i < l->n_src; i++) {
        uint64_t n = l->src[i].n;
        l->win_first[i + 1] = l->win_first[i] + (n > T ? (n - 1) / T : 0);
        l->n_tokens += n;
    }
    l->W = l->win_first[l->n_src];
    if (l->W == 0)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "no training windows (%s): %llu tokens, but every window needs T+1 "
                           "= %d tokens inside one shard; use a smaller sequence length or more data",
                           what, (unsigned long long)l->n_tokens, l->o.T + 1);
    int bits = 1;
    while (bits < 64 && (1ULL << bits) < l->W)
        bits++;
    l->half_bits = (bits + 1) / 2;
    if (l->o.prefetch) {
        size_t bt = (size_t)l->o.B * (size_t)l->o.T;
        l->pf_in = kiln_xmalloc(sizeof(int32_t) * bt);
        l->pf_tgt = kiln_xmalloc(sizeof(int32_t) * bt);
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv, NULL);
        if (pthread_create(&l->thread, NULL, prefetch_main, l) != 0)
            return kiln_errorf(err, KILN_ERR_RUNTIME,
                               "cannot start the prefetch thread (%s): pthread_create "
                               "failed; run with prefetch off",
                               what);
        l->have_thread = 1;
        pthread_mutex_lock(&l->mu);
        request_current(l);
        pthread_mutex_unlock(&l->mu);
    }
    return 0;
}

int kiln_loader_open_files(struct kiln_loader **out, const char *glob_pattern,
                           const struct kiln_loader_opts *o, struct kiln_error *err) {
    *out = NULL;
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    glob_t g;
    int grc = glob(glob_pattern, 0, NULL, &g);
    if (grc != 0) {
        if (grc != GLOB_NOMATCH)
            globfree(&g);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "no data files match (%s): expected .bin shards or .npy arrays; "
                           "run kiln tokenize first or fix the pattern",
                           glob_pattern);
    }
    struct kiln_loader *l = kiln_xcalloc(1, sizeof(*l));
    l->o = *o;
    l->n_src = (int)g.gl_pathc;
    l->src = kiln_xcalloc(g.gl_pathc, sizeof(struct source));
    l->files = kiln_xcalloc(g.gl_pathc, sizeof(struct kiln_token_file));
    for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
        rc = kiln_token_file_open(&l->files[i], g.gl_pathv[i], o->vocab_size, err);
        if (!rc)
            l->src[i] = (struct source){l->files[i].tokens, l->files[i].elem_bytes, l->files[i].n_tokens};
    }
    globfree(&g);
    if (!rc)
        rc = finish_open(l, glob_pattern, err);
    if (rc) {
        kiln_loader_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

int kiln_loader_open_memory(struct kiln_loader **out, const int32_t *tokens, size_t n,
                            const struct kiln_loader_opts *o, struct kiln_error *err) {
    *out = NULL;
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    if (o->vocab_size > 0) {
        uint64_t bad = kiln_tokens_first_bad(tokens, 4, n, o->vocab_size);
        if (bad != UINT64_MAX)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "token id %d >= vocab size %d (memory tokens, token offset "
                               "%llu): the tokens were made with a different tokenizer",
                               (int)tokens[bad], o->vocab_size, (unsigned long long)bad);
    }
    struct kiln_loader *l = kiln_xcalloc(1, sizeof(*l));
    l->o = *o;
    l->n_src = 1;
    l->src = kiln_xcalloc(1, sizeof(struct source));
    l->src[0] = (struct source){tokens, 4, n};
    rc = finish_open(l, "memory tokens", err);
    if (rc) {
        kiln_loader_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

int kiln_loader_next(struct kiln_loader *l, int32_t *inputs, int32_t *targets) {
    size_t bt = (size_t)l->o.B * (size_t)l->o.T;
    if (!l->have_thread) {
        fill_batch(l, l->base, l->j, inputs, targets);
        l->j += (uint64_t)l->o.B;
        return 0;
    }
    pthread_mutex_lock(&l->mu);
    request_current(l);
    while (!l->ready)
        pthread_cond_wait(&l->cv, &l->mu);
    memcpy(inputs, l->pf_in, sizeof(int32_t) * bt);
    memcpy(targets, l->pf_tgt, sizeof(int32_t) * bt);
    l->j += (uint64_t)l->o.B;
    request_current(l); // start on the next one while the caller trains
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void kiln_loader_get_state(const struct kiln_loader *l, struct kiln_loader_state *s) {
    uint64_t g = l->base + l->j * (uint64_t)l->o.world;
    s->epoch = g / l->W;
    s->position = g % l->W;
}

static void set_position(struct kiln_loader *l, uint64_t base) {
    if (l->have_thread)
        pthread_mutex_lock(&l->mu);
    l->base = base;
    l->j = 0;
    if (l->have_thread) {
        request_current(l);
        pthread_mutex_unlock(&l->mu);
    }
}

int kiln_loader_set_state(struct kiln_loader *l, const struct kiln_loader_state *s, struct kiln_error *err) {
    if (s->position >= l->W)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "bad loader state (epoch %llu, position %llu): position must be "
            "below the %llu windows of this data; the checkpoint was made with other data or T",
            (unsigned long long)s->epoch, (unsigned long long)s->position, (unsigned long long)l->W);
    if (s->epoch > UINT64_MAX / l->W - 1)
        return kiln_errorf(err, KILN_ERR_USAGE, "bad loader state (epoch %llu): too large for %llu windows",
                           (unsigned long long)s->epoch, (unsigned long long)l->W);
    set_position(l, s->epoch * l->W + s->position);
    return 0;
}

void kiln_loader_reset(struct kiln_loader *l) {
    set_position(l, 0);
}

uint64_t kiln_loader_num_windows(const struct kiln_loader *l) {
    return l->W;
}

uint64_t kiln_loader_num_tokens(const struct kiln_loader *l) {
    return l->n_tokens;
}

uint64_t kiln_loader_rank_windows(const struct kiln_loader *l) {
    uint64_t r = (uint64_t)l->o.rank, w = (uint64_t)l->o.world;
    return l->W > r ? (l->W - r + w - 1) / w : 0;
}

int kiln_loader_num_files(const struct kiln_loader *l) {
    return l->files ? l->n_src : 0;
}

void kiln_loader_close(struct kiln_loader *l) {
    if (!l)
        return;
    if (l->have_thread) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    if (l->files)
        for (int i = 0; i < l->n_src; i++)
            kiln_token_file_close(&l->files[i]);
    free(l->files);
    free(l->src);
    free(l->win_first);
    free(l->pf_in);
    free(l->pf_tgt);
    free(l);
}
