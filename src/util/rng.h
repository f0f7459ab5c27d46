// Deterministic random numbers: splitmix64 seeding a xoshiro256** stream, Box-Muller normals.
#ifndef KILN_UTIL_RNG_H
#define KILN_UTIL_RNG_H

#include <stdint.h>

struct kiln_rng {
    uint64_t s[4];
    int has_spare;
    float spare;
};

void kiln_rng_seed(struct kiln_rng *r, uint64_t seed);
uint64_t kiln_rng_u64(struct kiln_rng *r);
float kiln_rng_uniform(struct kiln_rng *r); // [0, 1)
float kiln_rng_normal(struct kiln_rng *r);  // N(0, 1)
uint64_t kiln_hash64(uint64_t x);           // splitmix64 finalizer, for deriving seeds

#endif
