// Shard writing (through io/fsutil's atomic file) and validated, memory-mapped reading of .bin and .npy.
#include "data/shards.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/fsutil.h"
#include "util/error.h"

int kiln_shard_elem_bytes(int vocab_size) {
    return vocab_size <= 65535 ? 2 : 4;
}

int kiln_shard_write(const char *path, const int32_t *tokens, size_t n, int elem_bytes, char sha256_hex[65],
                     struct kiln_error *err) {
    KILN_ASSERT(elem_bytes == 2 || elem_bytes == 4);
    if (n > INT32_MAX)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "shard too large (%s): %zu tokens, the header holds at most %d; "
                           "use a smaller --shard-tokens",
                           path, n, INT32_MAX);
    int32_t header[KILN_SHARD_HEADER_INTS] = {0};
    header[0] = elem_bytes == 2 ? KILN_SHARD_MAGIC_U16 : KILN_SHARD_MAGIC_U32;
    header[1] = elem_bytes == 2 ? KILN_SHARD_VERSION_U16 : KILN_SHARD_VERSION_U32;
    header[2] = (int32_t)n;
    struct kiln_afile f;
    int rc = kiln_afile_open(&f, path, err);
    if (rc)
        return rc;
    rc = kiln_afile_write(&f, header, sizeof(header), err);
    enum { CHUNK = 1 << 16 };
    static _Thread_local uint32_t buf[CHUNK];
    for (size_t i = 0; i < n && !rc; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        for (size_t k = 0; k < m; k++) {
            uint32_t t = (uint32_t)tokens[i + k];
            if (tokens[i + k] < 0 || (elem_bytes == 2 && t > 0xFFFF)) {
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "token id %d does not fit a %s shard (%s, token offset %zu): "
                                 "ids must be 0..%u; use the uint32 layout for this vocabulary",
                                 (int)tokens[i + k], elem_bytes == 2 ? "uint16" : "uint32", path, i + k,
                                 elem_bytes == 2 ? 0xFFFFu : 0x7FFFFFFFu);
                break;
            }
            if (elem_bytes == 2)
                ((uint16_t *)buf)[k] = (uint16_t)t;
            else
                buf[k] = t;
        }
        if (!rc)
            rc = kiln_afile_write(&f, buf, m * (size_t)elem_bytes, err);
    }
    if (!rc)
        rc = kiln_afile_commit(&f, sha256_hex, err);
    if (rc)
        kiln_afile_abort(&f);
    return rc;
}

uint64_t kiln_tokens_first_bad(const void *tokens, int elem_bytes, uint64_t n, int vocab_size) {
    uint64_t first = UINT64_MAX;
    if (vocab_size <= 0 || (elem_bytes == 2 && vocab_size > 0xFFFF))
        return first;
    const uint16_t *t16 = tokens;
    const uint32_t *t32 = tokens;
    const uint32_t v = (uint32_t)vocab_size;
    const int64_t nb = (int64_t)((n + 65535) / 65536);
    // blocks in parallel; within a block stop at the first bad id
#pragma omp parallel for schedule(static) reduction(min : first) if (n > (1u << 22))
    for (int64_t b = 0; b < nb; b++) {
        uint64_t lo = (uint64_t)b * 65536, hi = lo + 65536 < n ? lo + 65536 : n;
        uint32_t mx = 0;
        if (elem_bytes == 2)
            for (uint64_t i = lo; i < hi; i++)
                mx = t16[i] > mx ? t16[i] : mx;
        else
            for (uint64_t i = lo; i < hi; i++)
                mx = t32[i] > mx ? t32[i] : mx;
        if (mx < v)
            continue;
        for (uint64_t i = lo; i < hi; i++) {
            uint32_t t = elem_bytes == 2 ? t16[i] : t32[i];
            if (t >= v) {
                first = i < first ? i : first;
                break;
            }
        }
    }
    return first;
}

// The value after key in a .npy header dict ("{'descr': '<u2', ...}"), or NULL.
static const char *npy_value(const char *h, const char *key) {
    const char *k = strstr(h, key);
    if (!k)
        return NULL;
    k += strlen(key);
    while (*k == ' ')
        k++;
    if (*k++ != ':')
        return NULL;
    while (*k == ' ')
        k++;
    return k;
}

// Parses a NumPy .npy header. Sets *data_off and *elem_bytes; returns 0, or fills err.
static int npy_header(const unsigned char *p, size_t size, const char *path, size_t *data_off,
                      int *elem_bytes, uint64_t *count, struct kiln_error *err) {
    size_t hlen, off;
    if (size < 10)
        goto bad;
    if (p[6] == 1) {
        hlen = (size_t)p[8] | ((size_t)p[9] << 8);
        off = 10;
    } else if (p[6] == 2 || p[6] == 3) {
        if (size < 12)
            goto bad;
        hlen = (size_t)p[8] | ((size_t)p[9] << 8) | ((size_t)p[10] << 16) | ((size_t)p[11] << 24);
        off = 12;
    } else {
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "unsupported .npy version %d (%s): expected 1, 2 or 3; re-save "
                           "with numpy.save",
                           p[6], path);
    }
    if (off + hlen > size)
        goto bad;
    char h[4096];
    size_t hn = hlen < sizeof(h) - 1 ? hlen : sizeof(h) - 1;
    memcpy(h, p + off, hn);
    h[hn] = 0;
    const char *d = npy_value(h, "'descr'");
    const char *fo = npy_value(h, "'fortran_order'");
    const char *sh = npy_value(h, "'shape'");
    if (!d || !fo || !sh)
        goto bad;
    if (strncmp(d, "'<u2'", 5) == 0 || strncmp(d, "'|u2'", 5) == 0)
        *elem_bytes = 2;
    else if (strncmp(d, "'<u4'", 5) == 0 || strncmp(d, "'|u4'", 5) == 0)
        *elem_bytes = 4;
    else
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "unsupported .npy dtype (%s): %.8s; token arrays must be "
                           "little-endian uint16 ('<u2') or uint32 ('<u4')",
                           path, d);
    if (strncmp(fo, "False", 5) != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "unsupported .npy (%s): fortran_order is not False; re-save "
                           "with numpy.save",
                           path);
    // shape must be "(N,)"
    char *end;
    if (*sh != '(')
        goto bad;
    unsigned long long c = strtoull(sh + 1, &end, 10);
    while (*end == ' ')
        end++;
    if (end == sh + 1 || *end != ',')
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "unsupported .npy shape (%s): %.30s; token arrays must be 1-D", path, sh);
    end++;
    while (*end == ' ')
        end++;
    if (*end != ')')
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "unsupported .npy shape (%s): %.30s; token arrays must be 1-D", path, sh);
    *count = c;
    *data_off = off + hlen;
    return 0;
bad:
    return kiln_errorf(err, KILN_ERR_RUNTIME,
                       "bad .npy header (%s): truncated or malformed; re-save with "
                       "numpy.save",
                       path);
}

int kiln_token_path_check(const char *path, struct kiln_error *err) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    int n = (int)strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    return kiln_errorf(
        err, KILN_ERR_USAGE,
        "token file is a directory (%s): kiln reads .bin shards or .npy arrays; give the files "
        "in it, quoted, e.g. '%.*s/train_*.bin'",
        path, n, path);
}

int kiln_token_file_open(struct kiln_token_file *f, const char *path, int vocab_size,
                         struct kiln_error *err) {
    memset(f, 0, sizeof(*f));
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open token file (%s): %s; check the path", path,
                           strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot stat token file (%s): %s", path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) { // (mmap would say "No such device")
        close(fd);
        return kiln_token_path_check(path, err);
    }
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    close(fd);
    if (size && map == MAP_FAILED)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot map token file (%s): %s", path, strerror(errno));
    const unsigned char *p = map;
    size_t pl = strlen(path);
    int is_npy = pl >= 4 && strcmp(path + pl - 4, ".npy") == 0;
    int rc = 0;
    size_t off = 0;
    uint64_t count = 0;
    int elem = 0;
    if (is_npy && size >= 6 && memcmp(p, "\x93NUMPY", 6) == 0) {
        rc = npy_header(p, size, path, &off, &elem, &count, err);
        if (!rc && (size - off) / (size_t)elem != count)
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "token file size disagrees with its header (%s): the .npy "
                             "header says %llu tokens (%llu bytes of data), the file has %zu; the file is "
                             "truncated or corrupt",
                             path, (unsigned long long)count, (unsigned long long)count * (unsigned)elem,
                             size - off);
    } else if (is_npy) { // raw np.memmap array
        elem = vocab_size > 65536 ? 4 : 2;
        if (size % (size_t)elem)
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "token file size is not a whole number of tokens (%s): %zu "
                             "bytes of headerless uint%d; the file is truncated or has another dtype",
                             path, size, elem * 8);
        count = size / (size_t)elem;
    } else {
        int32_t h[3] = {0};
        if (size < KILN_SHARD_HEADER_INTS * 4) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "token shard too small (%s): %zu bytes, less than the 1024-byte "
                             "header; the file is truncated or not a shard",
                             path, size);
        } else {
            memcpy(h, p, sizeof(h));
            off = KILN_SHARD_HEADER_INTS * 4;
            if (h[0] == KILN_SHARD_MAGIC_U16 && h[1] == KILN_SHARD_VERSION_U16)
                elem = 2;
            else if (h[0] == KILN_SHARD_MAGIC_U32 && h[1] == KILN_SHARD_VERSION_U32)
                elem = 4;
            else if (h[0] == KILN_SHARD_MAGIC_U16 || h[0] == KILN_SHARD_MAGIC_U32)
                rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                 "unsupported shard version %d (%s): magic %d needs version "
                                 "%d; re-run kiln tokenize",
                                 h[1], path, h[0],
                                 h[0] == KILN_SHARD_MAGIC_U16 ? KILN_SHARD_VERSION_U16
                                                              : KILN_SHARD_VERSION_U32);
            else
                rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                 "bad shard magic %d (%s): expected %d (uint16 tokens) or %d "
                                 "(uint32 tokens); not an llm.c/kiln token shard",
                                 h[0], path, KILN_SHARD_MAGIC_U16, KILN_SHARD_MAGIC_U32);
            if (!rc && h[2] < 0)
                rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                 "bad shard header (%s): negative token count %d; the file "
                                 "is corrupt",
                                 path, h[2]);
            count = (uint64_t)(uint32_t)h[2];
            if (!rc && size != off + count * (uint64_t)elem)
                rc = kiln_errorf(
                    err, KILN_ERR_RUNTIME,
                    "shard size disagrees with its header (%s): the header says "
                    "%llu tokens = %llu bytes, the file has %zu; the file is truncated or corrupt, "
                    "re-run kiln tokenize",
                    path, (unsigned long long)count, (unsigned long long)(off + count * (uint64_t)elem),
                    size);
        }
    }
    if (!rc && vocab_size > 0) {
        uint64_t bad = kiln_tokens_first_bad(p + off, elem, count, vocab_size);
        if (bad != UINT64_MAX) {
            uint32_t t = elem == 2 ? ((const uint16_t *)(p + off))[bad] : ((const uint32_t *)(p + off))[bad];
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "token id %u >= vocab size %d (shard %s, token offset %llu): the "
                             "shard was made with a different tokenizer; re-run kiln tokenize",
                             t, vocab_size, path, (unsigned long long)bad);
        }
    }
    if (rc) {
        if (map && map != MAP_FAILED)
            munmap(map, size);
        return rc;
    }
    f->path = kiln_xstrdup(path);
    f->elem_bytes = elem;
    f->n_tokens = count;
    f->tokens = p ? p + off : NULL;
    f->map = map;
    f->map_bytes = size;
    return 0;
}

void kiln_token_file_close(struct kiln_token_file *f) {
    if (f->map)
        munmap(f->map, f->map_bytes);
    free(f->path);
    memset(f, 0, sizeof(*f));
}
