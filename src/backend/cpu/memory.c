// CPU backend: memory ops, dtype helpers and f32 <-> bf16 conversion.
// Backend memory is host memory, so most of these are memcpy/memset.
#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

uint16_t kiln_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it a (quiet) NaN, whatever the rounding would do
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); // round to nearest, ties to even
    return (uint16_t)(u >> 16);
}

float kiln_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// A block carries its size in a 64-byte header (the body stays 64-byte aligned), so that free can count it
// out of the context's bytes held (ctx NULL: not counted).
void *kiln_cpu_alloc(void *ctx, size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes || rounded > SIZE_MAX - 128) // overflow
        return NULL;
    size_t body = rounded ? rounded : 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, body + 64) != 0)
        return NULL;
    memset(p, 0, body + 64);
    *(size_t *)p = body;
    struct kiln_cpu_ctx *c = ctx;
    if (c) {
        c->mem_now += body;
        if (c->mem_now > c->mem_peak)
            c->mem_peak = c->mem_now;
    }
    return (char *)p + 64;
}

void kiln_cpu_free(void *ctx, void *p) {
    if (!p)
        return;
    char *h = (char *)p - 64;
    struct kiln_cpu_ctx *c = ctx;
    if (c)
        c->mem_now -= *(size_t *)h;
    free(h);
}

size_t kiln_cpu_mem_peak(void *ctx) {
    return ((struct kiln_cpu_ctx *)ctx)->mem_peak;
}

void kiln_cpu_zero(void *ctx, void *p, size_t bytes) {
    memset(p, 0, bytes);
}

void kiln_cpu_copy_2d(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                      size_t rows) {
    (void)ctx;
    for (size_t r = 0; r < rows; r++)
        memmove((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}

void kiln_cpu_copy_async(void *ctx, void *dst, const void *src, size_t bytes, void *done) {
    (void)ctx, (void)done; // the CPU's ops complete in order: nothing to overlap
    memcpy(dst, src, bytes);
}

void kiln_cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    if (dst != src)
        memmove(dst, src, bytes);
}

void kiln_cpu_upload(void *ctx, void *dst, const void *host_src, size_t bytes) {
    kiln_cpu_copy(ctx, dst, host_src, bytes);
}

void kiln_cpu_download(void *ctx, void *host_dst, const void *src, size_t bytes) {
    kiln_cpu_copy(ctx, host_dst, src, bytes);
}

void kiln_cpu_upload_f32(void *ctx, void *dst, enum kiln_dtype dt, const float *host_src, size_t n) {
    switch (dt) {
    case KILN_F32:
        kiln_cpu_copy(ctx, dst, host_src, n * sizeof(float));
        return;
    case KILN_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = kiln_f32_to_bf16(host_src[i]);
        return;
    }
    case KILN_I32: {
        int32_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = (int32_t)host_src[i];
        return;
    }
    case KILN_U8:
    case KILN_F64:
        break; // communication-only dtypes: no tensor of the model has them
    }
    KILN_ASSERT(0 && "upload_f32: unknown dtype");
}

void kiln_cpu_download_f32(void *ctx, float *host_dst, const void *src, enum kiln_dtype dt, size_t n) {
    switch (dt) {
    case KILN_F32:
        kiln_cpu_copy(ctx, host_dst, src, n * sizeof(float));
        return;
    case KILN_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            host_dst[i] = kiln_bf16_to_f32(s[i]);
        return;
    }
    case KILN_I32: {
        const int32_t *s = src;
        for (size_t i = 0; i < n; i++)
            host_dst[i] = (float)s[i];
        return;
    }
    case KILN_U8:
    case KILN_F64:
        break;
    }
    KILN_ASSERT(0 && "download_f32: unknown dtype");
}

void kiln_cpu_synchronize(void *ctx) {}
