// Drawing the next token from logits, for kiln sample.
#ifndef KILN_RUN_SAMPLER_H
#define KILN_RUN_SAMPLER_H

#include "util/rng.h"

// Returns a token id drawn from softmax(logits / temperature) restricted to the top_k largest logits
// (top_k <= 0 or >= V: all). temperature 0 is greedy (argmax). logits (V) is overwritten.
int kiln_sample_token(float *logits, int V, float temperature, int top_k, struct kiln_rng *rng);

#endif
