// Single-thread GPT-2 BPE encode throughput: bpe_bench FILE [REPEATS] [VOCAB_DIR]
// Each repeat uses a fresh tokenizer (a cold word cache) and encodes the whole file in one call; prints the
// best MB/s (MB = 1e6 bytes of input text) and the token count, for bench/bpe_vs_tiktoken.sh.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "data/tokenizer.h"
#include "io/fsutil.h"
#include "util/error.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bpe_bench FILE [REPEATS] [VOCAB_DIR]\n");
        return 2;
    }
    int repeats = argc > 2 ? atoi(argv[2]) : 3;
    struct kiln_error err = {0};
    char *text;
    size_t n;
    if (kiln_read_file(argv[1], &text, &n, &err))
        return kiln_error_print(&err);
    double best = 1e30;
    size_t n_tokens = 0;
    for (int r = 0; r < (repeats > 0 ? repeats : 1); r++) {
        struct kiln_tokenizer *t;
        if (kiln_tokenizer_open(&t, "gpt2", argc > 3 ? argv[3] : NULL, &err))
            return kiln_error_print(&err);
        struct kiln_ids ids = {0};
        kiln_ids_reserve(&ids, n / 3 + 16);
        double t0 = now_s();
        if (kiln_tokenizer_encode(t, text, n, &ids, &err))
            return kiln_error_print(&err);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
        n_tokens = ids.n;
        kiln_ids_free(&ids);
        kiln_tokenizer_free(t);
    }
    printf("kiln gpt2 encode: %zu bytes -> %zu tokens, best of %d: %.3f s, %.2f MB/s\n", n, n_tokens, repeats,
           best, (double)n / best / 1e6);
    free(text);
    return 0;
}
