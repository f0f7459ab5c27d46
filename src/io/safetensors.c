// safetensors reader (mmap + full validation) and writer (atomic). Format notes in safetensors.h.
#include "io/safetensors.h"

#include "io/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const st_dtype_names[KILN_ST_NDTYPES] = {"F32", "BF16", "I32", "F16", "I64"};
static const size_t st_dtype_sizes[KILN_ST_NDTYPES] = {4, 2, 4, 2, 8};

size_t kiln_st_dtype_bytes(int dtype) {
    return (dtype >= 0 && dtype < KILN_ST_NDTYPES) ? st_dtype_sizes[dtype] : 0;
}

const char *kiln_st_dtype_name(int dtype) {
    return (dtype >= 0 && dtype < KILN_ST_NDTYPES) ? st_dtype_names[dtype] : NULL;
}

int kiln_st_dtype_parse(const char *name) {
    for (int i = 0; i < KILN_ST_NDTYPES; i++)
        if (strcmp(name, st_dtype_names[i]) == 0)
            return i;
    return -1;
}

int64_t kiln_st_tensor_numel(const struct kiln_st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

size_t kiln_st_tensor_bytes(const struct kiln_st_tensor *t) {
    return (size_t)kiln_st_tensor_numel(t) * kiln_st_dtype_bytes(t->dtype);
}

// Offsets and dims travel through JSON; keep them exactly representable as doubles (cJSON parses doubles).
#define ST_MAX_INT ((int64_t)1 << 53)

// numel * dtype bytes with overflow checks; -1 when it does not fit in ST_MAX_INT.
static int64_t st_nbytes(int dtype, int ndim, const int64_t *shape) {
    int64_t n = (int64_t)kiln_st_dtype_bytes(dtype);
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(n, shape[d], &n) || n > ST_MAX_INT)
            return -1;
    return n;
}

// ---- writer -----------------------------------------------------------------------------------

struct strbuf {
    char *p;
    size_t len, cap;
};

static void sb_put(struct strbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        char *np = realloc(b->p, b->cap);
        KILN_ASSERT(np != NULL);
        b->p = np;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

__attribute__((format(printf, 2, 3))) static void sb_printf(struct strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    KILN_ASSERT(n >= 0 && (size_t)n < sizeof(tmp));
    sb_put(b, tmp, (size_t)n);
}

// A JSON string literal: quotes, backslashes and control characters escaped, other bytes (UTF-8) as is.
static void sb_json_string(struct strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int st_check_tensors(const char *path, const struct kiln_st_tensor *t, int n, struct kiln_error *err) {
    const char *what = "cannot write safetensors file";
    if (n < 0)
        return kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): negative tensor count %d", what, path, n);
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
            return kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): tensor %d has an empty or reserved name", what,
                               path, i);
        if (!kiln_st_dtype_name(t[i].dtype))
            return kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): tensor \"%s\" has unknown dtype %d", what, path,
                               t[i].name, t[i].dtype);
        if (t[i].ndim < 0 || t[i].ndim > KILN_ST_MAX_DIMS)
            return kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): tensor \"%s\" has ndim %d (0..%d allowed)",
                               what, path, t[i].name, t[i].ndim, KILN_ST_MAX_DIMS);
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0)
                return kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): tensor \"%s\" has negative dim %lld", what,
                                   path, t[i].name, (long long)t[i].shape[d]);
        int64_t nb = st_nbytes(t[i].dtype, t[i].ndim, t[i].shape);
        if (nb < 0)
            return kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): tensor \"%s\" is larger than 2^53 bytes", what,
                               path, t[i].name);
        if (nb > 0 && !t[i].data)
            return kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): tensor \"%s\" has no data", what, path,
                               t[i].name);
    }
    const char **names = kiln_xmalloc(sizeof(char *) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++)
        names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof(char *), name_cmp);
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            int rc = kiln_errorf(err, KILN_ERR_USAGE, "%s (%s): duplicate tensor name \"%s\"", what, path,
                                 names[i]);
            free(names);
            return rc;
        }
    }
    free(names);
    return 0;
}

int kiln_safetensors_write_sha(const char *path, const struct kiln_st_tensor *tensors, int n,
                               const char *const *meta_kv, char sha256_hex[65], struct kiln_error *err) {
    int rc = st_check_tensors(path, tensors, n, err);
    if (rc)
        return rc;

    // header: {"__metadata__":{...},"name":{"dtype":"F32","shape":[..],"data_offsets":[b,e]},...}
    struct strbuf h = {0};
    sb_put(&h, "{", 1);
    int first = 1;
    if (meta_kv && meta_kv[0]) {
        sb_put(&h, "\"__metadata__\":{", 16);
        for (int i = 0; meta_kv[i]; i += 2) {
            if (!meta_kv[i + 1]) {
                free(h.p);
                return kiln_errorf(err, KILN_ERR_USAGE,
                                   "cannot write safetensors file (%s): metadata key \"%s\" has no value",
                                   path, meta_kv[i]);
            }
            if (i)
                sb_put(&h, ",", 1);
            sb_json_string(&h, meta_kv[i]);
            sb_put(&h, ":", 1);
            sb_json_string(&h, meta_kv[i + 1]);
        }
        sb_put(&h, "}", 1);
        first = 0;
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        const struct kiln_st_tensor *t = &tensors[i];
        int64_t nb = st_nbytes(t->dtype, t->ndim, t->shape);
        if (!first)
            sb_put(&h, ",", 1);
        first = 0;
        sb_json_string(&h, t->name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", kiln_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            sb_printf(&h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + nb));
        off += nb;
    }
    sb_put(&h, "}", 1);
    while (h.len % 8)
        sb_put(&h, " ", 1);

    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));

    struct kiln_afile f;
    rc = kiln_afile_open(&f, path, err);
    if (!rc)
        rc = kiln_afile_write(&f, len8, 8, err);
    if (!rc)
        rc = kiln_afile_write(&f, h.p, h.len, err);
    for (int i = 0; i < n && !rc; i++)
        rc = kiln_afile_write(&f, tensors[i].data,
                              (size_t)st_nbytes(tensors[i].dtype, tensors[i].ndim, tensors[i].shape), err);
    if (!rc)
        rc = kiln_afile_commit(&f, sha256_hex, err);
    kiln_afile_abort(&f);
    free(h.p);
    return rc;
}

int kiln_safetensors_write(const char *path, const struct kiln_st_tensor *tensors, int n,
                           const char *const *meta_kv, struct kiln_error *err) {
    return kiln_safetensors_write_sha(path, tensors, n, meta_kv, NULL, err);
}

// ---- reader -----------------------------------------------------------------------------------

struct kiln_safetensors {
    char *path;
    void *map;
    size_t map_bytes;
    int n;
    struct kiln_st_tensor *t; // (n) header order; names owned
    int *by_name;             // (n) indices into t sorted by name
    int nmeta;
    char **meta; // (2*nmeta) key, value, ...
    const uint8_t *data; // the byte buffer after the header (data_bytes)
    size_t data_bytes;
};

void kiln_safetensors_close(struct kiln_safetensors *f) {
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_bytes);
    for (int i = 0; i < f->n; i++)
        free((char *)f->t[i].name);
    for (int i = 0; i < 2 * f->nmeta; i++)
        free(f->meta[i]);
    free(f->meta);
    free(f->t);
    free(f->by_name);
    free(f->path);
    free(f);
}

int kiln_safetensors_count(const struct kiln_safetensors *f) {
    return f->n;
}

const struct kiln_st_tensor *kiln_safetensors_at(const struct kiln_safetensors *f, int i) {
    return (i >= 0 && i < f->n) ? &f->t[i] : NULL;
}

const struct kiln_st_tensor *kiln_safetensors_find(const struct kiln_safetensors *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->t[f->by_name[mid]].name);
        if (c == 0)
            return &f->t[f->by_name[mid]];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *kiln_safetensors_meta(const struct kiln_safetensors *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0)
            return f->meta[2 * i + 1];
    return NULL;
}

int kiln_safetensors_meta_count(const struct kiln_safetensors *f) {
    return f->nmeta;
}

const char *kiln_safetensors_path(const struct kiln_safetensors *f) {
    return f->path;
}

const void *kiln_safetensors_data(const struct kiln_safetensors *f, size_t *bytes) {
    *bytes = f->data_bytes;
    return f->data;
}

// qsort contexts without globals: sort small index records that carry their keys.
struct st_by_name {
    const char *name;
    int i;
};
static int st_by_name_cmp(const void *a, const void *b) {
    return strcmp(((const struct st_by_name *)a)->name, ((const struct st_by_name *)b)->name);
}
struct st_span {
    int64_t begin, end;
    int i;
};
static int st_span_cmp(const void *a, const void *b) {
    const struct st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->i - y->i;
}

// A JSON number that is an integer in [0, 2^53]; -1 otherwise.
static int64_t json_uint(const cJSON *x) {
    if (!cJSON_IsNumber(x))
        return -1;
    double v = x->valuedouble;
    if (!(v >= 0 && v <= (double)ST_MAX_INT) || v != (double)(int64_t)v)
        return -1;
    return (int64_t)v;
}

#define ST_BAD(...) ((rc = kiln_errorf(err, KILN_ERR_RUNTIME, __VA_ARGS__)) != 0)

// Fills f->t, f->meta from the parsed header and checks every tensor against the data buffer.
static int st_parse_header(struct kiln_safetensors *f, const cJSON *root, const uint8_t *data,
                           int64_t data_bytes, struct kiln_error *err) {
    const char *p = f->path;
    const char *hint = "the file is corrupt or not a safetensors file";
    int rc = 0;
    if (!cJSON_IsObject(root))
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "bad safetensors file (%s): header is not a JSON object; %s", p, hint);
    int n = 0, nmeta_obj = 0;
    for (const cJSON *c = root->child; c; c = c->next)
        (strcmp(c->string, "__metadata__") == 0) ? nmeta_obj++ : n++;
    if (nmeta_obj > 1)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "bad safetensors file (%s): duplicate \"__metadata__\"; %s",
                           p, hint);
    f->t = kiln_xcalloc((size_t)(n ? n : 1), sizeof(struct kiln_st_tensor));
    struct st_span *spans = kiln_xmalloc(sizeof(struct st_span) * (size_t)(n ? n : 1));
    struct st_by_name *names = kiln_xmalloc(sizeof(struct st_by_name) * (size_t)(n ? n : 1));

    for (const cJSON *c = root->child; c && !rc; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(c) &&
                ST_BAD("bad safetensors file (%s): \"__metadata__\" is not an object; %s", p, hint))
                break;
            int nm = cJSON_GetArraySize(c);
            f->meta = kiln_xcalloc((size_t)(2 * nm + 1), sizeof(char *));
            for (const cJSON *m = c->child; m; m = m->next) {
                if (!cJSON_IsString(m) &&
                    ST_BAD("bad safetensors file (%s): metadata \"%s\" is not a string; %s", p, m->string,
                           hint))
                    break;
                f->meta[2 * f->nmeta] = kiln_xstrdup(m->string);
                f->meta[2 * f->nmeta + 1] = kiln_xstrdup(m->valuestring);
                f->nmeta++;
            }
            continue;
        }
        const char *name = c->string;
        struct kiln_st_tensor *t = &f->t[f->n];
        t->name = kiln_xstrdup(name);
        f->n++;
        if (!cJSON_IsObject(c) &&
            ST_BAD("bad safetensors file (%s): entry \"%s\" is not an object; %s", p, name, hint))
            break;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(c, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(c, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(c, "data_offsets");
        if (!cJSON_IsString(dt) &&
            ST_BAD("bad safetensors file (%s): tensor \"%s\" has no \"dtype\" string; %s", p, name, hint))
            break;
        t->dtype = kiln_st_dtype_parse(dt->valuestring);
        if (t->dtype < 0 &&
            ST_BAD("bad safetensors file (%s): tensor \"%s\" has unknown dtype \"%s\"; kiln reads F32, BF16, "
                   "F16, I32 and I64",
                   p, name, dt->valuestring))
            break;
        if (!cJSON_IsArray(shape) &&
            ST_BAD("bad safetensors file (%s): tensor \"%s\" has no \"shape\" list; %s", p, name, hint))
            break;
        t->ndim = cJSON_GetArraySize(shape);
        if (t->ndim > KILN_ST_MAX_DIMS &&
            ST_BAD("bad safetensors file (%s): tensor \"%s\" has %d dims (kiln reads at most %d)", p, name,
                   t->ndim, KILN_ST_MAX_DIMS))
            break;
        int d = 0;
        for (const cJSON *x = shape->child; x; x = x->next, d++) {
            t->shape[d] = json_uint(x);
            if (t->shape[d] < 0 &&
                ST_BAD(
                    "bad safetensors file (%s): tensor \"%s\" has a shape that is not a list of non-negative "
                    "integers; %s",
                    p, name, hint))
                break;
        }
        if (rc)
            break;
        // offsets as doubles first, so that an offset past 2^53 is reported as past the data, not as
        // malformed
        double bd = -1, ed = -1;
        if (cJSON_IsArray(offs) && cJSON_GetArraySize(offs) == 2 &&
            cJSON_IsNumber(cJSON_GetArrayItem(offs, 0)) && cJSON_IsNumber(cJSON_GetArrayItem(offs, 1))) {
            bd = cJSON_GetArrayItem(offs, 0)->valuedouble;
            ed = cJSON_GetArrayItem(offs, 1)->valuedouble;
        }
        if ((!(bd >= 0 && ed >= 0) || bd != floor(bd) || ed != floor(ed)) &&
            ST_BAD("bad safetensors file (%s): tensor \"%s\" has \"data_offsets\" that are not a pair of "
                   "non-negative integers [begin, end]; %s",
                   p, name, hint))
            break;
        if (ed < bd &&
            ST_BAD("bad safetensors file (%s): tensor \"%s\" has data_offsets [%.0f, %.0f] that end "
                   "before they begin; %s",
                   p, name, bd, ed, hint))
            break;
        if (ed > (double)data_bytes &&
            ST_BAD(
                "bad safetensors file (%s): tensor \"%s\" has data_offsets [%.0f, %.0f] that exceed the %lld "
                "data bytes in the file; the file is truncated or corrupt",
                p, name, bd, ed, (long long)data_bytes))
            break;
        int64_t b = (int64_t)bd, e = (int64_t)ed;
        int64_t nb = st_nbytes(t->dtype, t->ndim, t->shape);
        if (nb < 0) {
            char dims[160] = "";
            for (int k = 0; k < t->ndim; k++)
                snprintf(dims + strlen(dims), sizeof(dims) - strlen(dims), "%s%lld", k ? ", " : "",
                         (long long)t->shape[k]);
            (void)ST_BAD("bad safetensors file (%s): tensor \"%s\" has shape [%s] whose size overflows (more "
                         "than 2^53 bytes of %s); %s",
                         p, name, dims, dt->valuestring, hint);
            break;
        }
        if (nb != e - b &&
            ST_BAD(
                "bad safetensors file (%s): tensor \"%s\" has data_offsets [%lld, %lld] (%lld bytes) but its "
                "shape and dtype %s need %lld bytes; %s",
                p, name, (long long)b, (long long)e, (long long)(e - b), dt->valuestring, (long long)nb,
                hint))
            break;
        t->data = data + b;
        spans[f->n - 1] = (struct st_span){b, e, f->n - 1};
        names[f->n - 1] = (struct st_by_name){t->name, f->n - 1};
    }

    if (!rc) {
        qsort(names, (size_t)f->n, sizeof(*names), st_by_name_cmp);
        for (int i = 1; i < f->n && !rc; i++)
            if (strcmp(names[i - 1].name, names[i].name) == 0)
                (void)ST_BAD("bad safetensors file (%s): duplicate tensor name \"%s\"; %s", p, names[i].name,
                             hint);
    }
    if (!rc) {
        // The tensors must tile the buffer exactly: sorted by offset, each begins where the last ended.
        qsort(spans, (size_t)f->n, sizeof(*spans), st_span_cmp);
        int64_t pos = 0;
        for (int i = 0; i < f->n && !rc; i++) {
            if (spans[i].begin != pos)
                (void)ST_BAD(
                    "bad safetensors file (%s): tensor \"%s\" starts at byte %lld of the data but the "
                    "previous tensor ends at %lld (%s); %s",
                    p, f->t[spans[i].i].name, (long long)spans[i].begin, (long long)pos,
                    spans[i].begin < pos ? "overlap" : "gap", hint);
            pos = spans[i].end;
        }
        if (!rc && pos != data_bytes)
            (void)ST_BAD(
                "bad safetensors file (%s): the tensors cover %lld data bytes but the file holds %lld after "
                "the "
                "header (file size != 8 + header + data); the file is truncated or has trailing bytes",
                p, (long long)pos, (long long)data_bytes);
    }
    if (!rc) {
        f->by_name = kiln_xmalloc(sizeof(int) * (size_t)(f->n ? f->n : 1));
        for (int i = 0; i < f->n; i++)
            f->by_name[i] = names[i].i;
    }
    free(spans);
    free(names);
    return rc;
}

int kiln_safetensors_open(struct kiln_safetensors **out, const char *path, struct kiln_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open safetensors file (%s): %s", path,
                           strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open safetensors file (%s): not a regular file",
                           path);
    }
    if (st.st_size < 8) {
        close(fd);
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "bad safetensors file (%s): %lld bytes, shorter than the 8-byte header length; the "
            "file is truncated or not a safetensors file",
            path, (long long)st.st_size);
    }
    struct kiln_safetensors *f = kiln_xcalloc(1, sizeof(*f));
    f->path = kiln_xstrdup(path);
    f->map_bytes = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        kiln_safetensors_close(f);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot map safetensors file (%s): %s", path, strerror(e));
    }
    const uint8_t *base = f->map;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)base[i] << (8 * i);
    if (hlen > f->map_bytes - 8) {
        kiln_safetensors_close(f);
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "bad safetensors file (%s): header length %llu runs past the end of the file (%zu "
                           "bytes); the file is truncated or not a safetensors file",
                           path, (unsigned long long)hlen, (size_t)st.st_size);
    }
    // cJSON wants a NUL-terminated string; an embedded NUL would silently cut the header short
    if (memchr(base + 8, '\0', hlen)) {
        kiln_safetensors_close(f);
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "bad safetensors file (%s): header is not JSON (contains a NUL byte); the file is "
                           "corrupt or not a safetensors file",
                           path);
    }
    char *hdr = kiln_xmalloc(hlen + 1);
    memcpy(hdr, base + 8, hlen);
    hdr[hlen] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(hdr, &end, 1);
    if (!root) {
        long at = end ? (long)(end - hdr) : -1;
        free(hdr);
        kiln_safetensors_close(f);
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "bad safetensors file (%s): header is not valid JSON (near byte %ld of %llu); the file "
            "is corrupt or not a safetensors file",
            path, at, (unsigned long long)hlen);
    }
    free(hdr);
    f->data = base + 8 + hlen;
    f->data_bytes = f->map_bytes - 8 - hlen;
    int rc = st_parse_header(f, root, f->data, (int64_t)f->data_bytes, err);
    cJSON_Delete(root);
    if (rc) {
        kiln_safetensors_close(f);
        return rc;
    }
    *out = f;
    return 0;
}
