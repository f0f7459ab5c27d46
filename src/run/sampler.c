// Drawing the next token from logits: temperature, top-k, greedy. See sampler.h.
#include "run/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int kiln_sample_token(float *logits, int V, float temperature, int top_k, struct kiln_rng *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temperature == 0.0f)
        return best;
    float cutoff = -INFINITY;
    if (top_k > 0 && top_k < V) {
        // the k-th largest logit, by partial selection on a copy
        float *tmp = kiln_xmalloc((size_t)V * sizeof(float));
        memcpy(tmp, logits, (size_t)V * sizeof(float));
        int lo = 0, hi = V - 1, k = top_k - 1;
        while (lo < hi) {
            float pivot = tmp[(lo + hi) / 2];
            int i = lo, j = hi;
            while (i <= j) {
                while (tmp[i] > pivot)
                    i++;
                while (tmp[j] < pivot)
                    j--;
                if (i <= j) {
                    float t = tmp[i];
                    tmp[i++] = tmp[j];
                    tmp[j--] = t;
                }
            }
            if (k <= j)
                hi = j;
            else if (k >= i)
                lo = i;
            else
                break;
        }
        cutoff = tmp[k];
        free(tmp);
    }
    // the maximum is read once: the loop overwrites logits in place, logits[best] included
    float max_logit = logits[best];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        logits[i] = logits[i] >= cutoff ? expf((logits[i] - max_logit) / temperature) : 0.0f;
        sum += logits[i];
    }
    double r = kiln_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += logits[i];
        if (r < acc)
            return i;
    }
    return best;
}

