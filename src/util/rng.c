#include "util/rng.h"

#include <math.h>

uint64_t kiln_hash64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

void kiln_rng_seed(struct kiln_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        x = kiln_hash64(x);
        r->s[i] = x ? x : 1;
    }
    r->has_spare = 0;
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t kiln_rng_u64(struct kiln_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float kiln_rng_uniform(struct kiln_rng *r) {
    return (float)((kiln_rng_u64(r) >> 40) * (1.0 / 16777216.0));
}

float kiln_rng_normal(struct kiln_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    // Box-Muller in double so the result does not depend on libm's float paths
    double u1 = ((kiln_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0); // (0, 1]
    double u2 = (kiln_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    double rad = sqrt(-2.0 * log(u1));
    r->spare = (float)(rad * sin(6.283185307179586 * u2));
    r->has_spare = 1;
    return (float)(rad * cos(6.283185307179586 * u2));
}
