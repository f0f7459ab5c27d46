// SHA-256 per FIPS 180-4, section 6.2. Two block functions: a portable one, and one with the x86 SHA
// extensions (SHA-NI), picked at run time by cpuid. Both are checked against each other in the tests.
#include "util/sha256.h"

#include "util/error.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KILN_SHA256_X86 1
#endif

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// ---- portable block function ------------------------------------------------------------------

static inline uint32_t rotr32(uint32_t x, int n) {
    return (x >> n) | (x << (32 - n));
}
static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static void sha256_blocks_generic(uint32_t h[8], const uint8_t *p, size_t nblocks) {
    for (; nblocks; nblocks--, p += 64) {
        uint32_t w[64];
        for (int t = 0; t < 16; t++)
            w[t] = load_be32(p + 4 * t);
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = rotr32(w[t - 15], 7) ^ rotr32(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = rotr32(w[t - 2], 17) ^ rotr32(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int t = 0; t < 64; t++) {
            uint32_t S1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
            uint32_t ch = (e & f) ^ (~e & g);
            uint32_t t1 = hh + S1 + ch + sha256_k[t] + w[t];
            uint32_t S0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
            uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
            uint32_t t2 = S0 + maj;
            hh = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
    }
}

// ---- SHA-NI block function --------------------------------------------------------------------
// The SHA extensions keep the state as two vectors, ABEF and CDGH, and do two rounds per sha256rnds2.
// Message words are scheduled four at a time with sha256msg1/msg2.

#ifdef KILN_SHA256_X86
__attribute__((target("sha,sse4.1,ssse3"))) static void sha256_blocks_shani(uint32_t h[8], const uint8_t *p,
                                                                            size_t nblocks) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&h[0]);    // DCBA
    __m128i state1 = _mm_loadu_si128((const __m128i *)&h[4]); // HGFE
    tmp = _mm_shuffle_epi32(tmp, 0xB1);                       // CDAB
    state1 = _mm_shuffle_epi32(state1, 0x1B);                 // EFGH
    __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);         // ABEF
    state1 = _mm_blend_epi16(state1, tmp, 0xF0);              // CDGH

    for (; nblocks; nblocks--, p += 64) {
        __m128i save0 = state0, save1 = state1;
        __m128i m[4];
        for (int i = 0; i < 4; i++)
            m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            if (r >= 4) {
                // w[t] = w[t-16] + s0(w[t-15]) + w[t-7] + s1(w[t-2]), four words at a time
                __m128i x = _mm_sha256msg1_epu32(m[r & 3], m[(r + 1) & 3]);
                x = _mm_add_epi32(x, _mm_alignr_epi8(m[(r + 3) & 3], m[(r + 2) & 3], 4));
                m[r & 3] = _mm_sha256msg2_epu32(x, m[(r + 3) & 3]);
            }
            __m128i msg = _mm_add_epi32(m[r & 3], _mm_loadu_si128((const __m128i *)&sha256_k[4 * r]));
            state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
            msg = _mm_shuffle_epi32(msg, 0x0E);
            state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
        }
        state0 = _mm_add_epi32(state0, save0);
        state1 = _mm_add_epi32(state1, save1);
    }

    tmp = _mm_shuffle_epi32(state0, 0x1B);       // FEBA
    state1 = _mm_shuffle_epi32(state1, 0xB1);    // DCHG
    state0 = _mm_blend_epi16(tmp, state1, 0xF0); // DCBA
    state1 = _mm_alignr_epi8(state1, tmp, 8);    // HGFE
    _mm_storeu_si128((__m128i *)&h[0], state0);
    _mm_storeu_si128((__m128i *)&h[4], state1);
}
#endif

int kiln_sha256_have_shani(void) {
#ifdef KILN_SHA256_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int sse41 = (c >> 19) & 1, ssse3 = (c >> 9) & 1;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return sse41 && ssse3 && ((b >> 29) & 1);
#else
    return 0;
#endif
}

static void sha256_blocks(struct kiln_sha256 *s, const uint8_t *p, size_t nblocks) {
#ifdef KILN_SHA256_X86
    if (s->use_shani) {
        sha256_blocks_shani(s->h, p, nblocks);
        return;
    }
#endif
    sha256_blocks_generic(s->h, p, nblocks);
}

// ---- streaming API ----------------------------------------------------------------------------

void kiln_sha256_init(struct kiln_sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof(h0));
    s->len_bytes = 0;
    s->nbuf = 0;
    s->use_shani = kiln_sha256_have_shani();
}

void kiln_sha256_update(struct kiln_sha256 *s, const void *data, size_t n) {
    if (n == 0) // data may be NULL then (an empty tensor)
        return;
    const uint8_t *p = data;
    s->len_bytes += n;
    if (s->nbuf) {
        size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take, p += take, n -= take;
        if (s->nbuf < 64)
            return;
        sha256_blocks(s, s->buf, 1);
        s->nbuf = 0;
    }
    if (n >= 64) {
        sha256_blocks(s, p, n / 64);
        p += n & ~(size_t)63;
        n &= 63;
    }
    memcpy(s->buf, p, n);
    s->nbuf = n;
}

void kiln_sha256_final(struct kiln_sha256 *s, uint8_t digest[32]) {
    // padding: 0x80, zeros to 56 mod 64, then the message length in bits as a big-endian u64
    uint64_t bits = s->len_bytes * 8;
    uint8_t pad[72] = {0x80};
    size_t padlen = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
    for (int i = 0; i < 8; i++)
        pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    uint64_t len = s->len_bytes;
    kiln_sha256_update(s, pad, padlen + 8);
    s->len_bytes = len;
    KILN_ASSERT(s->nbuf == 0);
    for (int i = 0; i < 8; i++) {
        digest[4 * i + 0] = (uint8_t)(s->h[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        digest[4 * i + 3] = (uint8_t)(s->h[i]);
    }
}

void kiln_sha256(const void *data, size_t n, uint8_t digest[32]) {
    struct kiln_sha256 s;
    kiln_sha256_init(&s);
    kiln_sha256_update(&s, data, n);
    kiln_sha256_final(&s, digest);
}

void kiln_sha256_hex(const uint8_t digest[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[64] = '\0';
}

int kiln_sha256_file(const char *path, char hex[65], struct kiln_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open file (%s): %s", path, strerror(errno));
#ifdef POSIX_FADV_SEQUENTIAL
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = kiln_xmalloc(CHUNK);
    struct kiln_sha256 s;
    kiln_sha256_init(&s);
    for (;;) {
        ssize_t got = read(fd, buf, CHUNK);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read file (%s): %s", path, strerror(e));
        }
        if (got == 0)
            break;
        kiln_sha256_update(&s, buf, (size_t)got);
    }
    free(buf);
    close(fd);
    uint8_t d[32];
    kiln_sha256_final(&s, d);
    kiln_sha256_hex(d, hex);
    return 0;
}
