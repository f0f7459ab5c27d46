// SHA-256 (FIPS 180-4) with a streaming API. Checkpoints hash every file they write (GB-sized), so the
// block function uses the x86 SHA extensions when the CPU has them and a portable C version otherwise.
#ifndef KILN_UTIL_SHA256_H
#define KILN_UTIL_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;

struct kiln_sha256 {
    uint32_t h[8];      // chaining state
    uint64_t len_bytes; // bytes absorbed so far
    uint8_t buf[64];    // partial block
    size_t nbuf;        // bytes in buf
    int use_shani;      // set by init from cpuid; tests may clear it to exercise the portable path
};

void kiln_sha256_init(struct kiln_sha256 *s);
void kiln_sha256_update(struct kiln_sha256 *s, const void *data, size_t n);
void kiln_sha256_final(struct kiln_sha256 *s, uint8_t digest[32]);

// One-shot helpers. hex gets 64 lowercase hex digits and a NUL.
void kiln_sha256(const void *data, size_t n, uint8_t digest[32]);
void kiln_sha256_hex(const uint8_t digest[32], char hex[65]);

// Hashes a whole file (streamed). Fails with a one-line message naming the file.
int kiln_sha256_file(const char *path, char hex[65], struct kiln_error *err);

// 1 when the SHA-NI path is available on this CPU.
int kiln_sha256_have_shani(void);

#endif
