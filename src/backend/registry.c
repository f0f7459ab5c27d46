// Backend registration: the one place, besides the build files, where KILN_CUDA appears
// (docs/architecture.md).
#include "core/backend.h"

#include <string.h>

const char *kiln_backends_compiled(void) {
#ifdef KILN_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

void kiln_backends_describe(FILE *f) {
    fprintf(f, "backends compiled: %s\n", kiln_backends_compiled());
#ifdef KILN_CUDA
    kiln_cuda_describe(f);
#else
    fprintf(f, "gpus: none (built without CUDA)\n");
#endif
}

size_t kiln_backend_gpu_free(int index) {
#ifdef KILN_CUDA
    return kiln_cuda_device_free(index);
#else
    (void)index;
    return 0;
#endif
}

const char *kiln_backend_resolve(const char *name) {
    if (strcmp(name, "auto") != 0)
        return name;
#ifdef KILN_CUDA
    if (kiln_cuda_device_count() > 0)
        return "cuda";
#endif
    return "cpu";
}

int kiln_backend_device_count(const char *name) {
    if (strcmp(name, "cuda") != 0)
        return 1;
#ifdef KILN_CUDA
    return kiln_cuda_device_count();
#else
    return 0;
#endif
}

int kiln_backend_open(const char *name, const struct kiln_backend_opts *opts, struct kiln_backend *out,
                      struct kiln_error *err) {
    memset(out, 0, sizeof(*out));
    name = kiln_backend_resolve(name);
    int want_cuda = strcmp(name, "cuda") == 0;
    if (!want_cuda && strcmp(name, "cpu") != 0) {
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "unknown device '%s' (--device): allowed values are cpu, cuda, auto", name);
    }
    if (want_cuda) {
#ifdef KILN_CUDA
        return kiln_cuda_backend_open(opts, out, err);
#else
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "device cuda (--device): this kiln was built without CUDA; use --device=cpu or rebuild "
            "where nvcc is installed");
#endif
    }
    return kiln_cpu_backend_open(opts, out, err);
}

void kiln_backend_close(struct kiln_backend *b) {
    if (b->close)
        b->close(b);
    memset(b, 0, sizeof(*b));
}

double kiln_peak_flops_for(const char *device_name) {
    static const struct {
        const char *key;
        double flops;
    } table[] = {{"H100", 989e12}, {"H200", 989e12}, {"H800", 989e12}, {"A100", 312e12}, {"A800", 312e12}};
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strstr(device_name, table[i].key))
            return table[i].flops;
    return 0;
}
