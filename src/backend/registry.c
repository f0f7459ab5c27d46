// Backend registration: the one place, besides the build files, where KILN_CUDA appears
// (docs/architecture.md).
//
// kiln does not link the CUDA backend: it loads it (core/cuda_module.h) the first time a GPU is asked for,
// and "auto" first asks the machine whether it can have an NVIDIA GPU at all, so that a run on the CPU never
// maps the CUDA libraries. Test programs link the CUDA backend in and use it directly.
#include "core/backend.h"

#include <dirent.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "core/cuda_module.h"
#include "util/module.h"

#ifdef KILN_CUDA
// Defined where the CUDA backend is linked in (the test programs; the build names it with -u so that the
// linker keeps it); kiln's own binary leaves it undefined and loads the module.
#pragma weak kiln_cuda_module_table

// The CUDA backend's table, once loaded (or the error that loading it gave).
static const struct kiln_cuda_module *load_module(struct kiln_error *err) {
    if (&kiln_cuda_module_table)
        return &kiln_cuda_module_table;
    const struct kiln_cuda_module *m =
        kiln_module_symbol("libkiln_cuda.so", "kiln_cuda_module_table", "the CUDA backend",
                           "install the CUDA runtime, cuBLAS and NCCL libraries kiln was built against (or "
                           "add their directory to "
                           "LD_LIBRARY_PATH), or use --device=cpu",
                           err);
    if (!m)
        return NULL;
    static const size_t want[4] = KILN_CUDA_MODULE_SIZES;
    if (m->abi != KILN_CUDA_MODULE_ABI || memcmp(m->struct_bytes, want, sizeof(want)) != 0) {
        kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "the CUDA backend (libkiln_cuda.so): the module comes from another build of kiln; install "
            "the module built with this binary beside it, or use --device=cpu");
        return NULL;
    }
    return m;
}
#endif

const struct kiln_cuda_module *kiln_cuda_module(struct kiln_error *err) {
#ifdef KILN_CUDA
    return load_module(err);
#else
    kiln_errorf(err, KILN_ERR_USAGE,
                "device cuda (--device): this kiln was built without CUDA; use --device=cpu or rebuild where "
                "nvcc is installed");
    return NULL;
#endif
}

// 1 when this machine may have an NVIDIA GPU, answered without loading CUDA: the driver's files (the kernel
// module's /proc entry, its device nodes, or WSL's GPU device), or an NVIDIA display or 3D controller on the
// PCI bus (the driver may be installed but not yet started). 0 means CUDA would see no GPU either.
static int probe_gpu(void) {
    if (!access("/proc/driver/nvidia", F_OK) || !access("/dev/nvidiactl", F_OK) || !access("/dev/dxg", F_OK))
        return 1;
    DIR *d = opendir("/sys/bus/pci/devices");
    if (!d)
        return 1; // cannot tell: let CUDA answer
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[384], vendor[16] = "", class_[16] = "";
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", e->d_name);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(vendor, sizeof(vendor), f))
                vendor[0] = 0;
            fclose(f);
        }
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/class", e->d_name);
        if ((f = fopen(path, "r"))) {
            if (!fgets(class_, sizeof(class_), f))
                class_[0] = 0;
            fclose(f);
        }
        found = !strncmp(vendor, "0x10de", 6) && !strncmp(class_, "0x03", 4); // NVIDIA, display controller
    }
    closedir(d);
    return found;
}

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int gpu_possible_answer;
static void probe_run(void) {
    gpu_possible_answer = probe_gpu();
}

// The loaded CUDA backend, for a question that has a cheap answer when no GPU can be there: NULL when there
// is no CUDA in the build, no GPU on the machine, or no module to load.
static const struct kiln_cuda_module *cuda_if_gpu(void) {
#ifdef KILN_CUDA
    if (!&kiln_cuda_module_table) {
        pthread_once(&probe_once, probe_run);
        if (!gpu_possible_answer)
            return NULL;
    }
    return load_module(NULL);
#else
    (void)probe_once;
    (void)probe_run;
    return NULL;
#endif
}

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
    const struct kiln_cuda_module *m = NULL;
    struct kiln_error e = {0};
    pthread_once(&probe_once, probe_run);
    if (&kiln_cuda_module_table || gpu_possible_answer)
        m = load_module(&e);
    if (m)
        m->describe(f);
    else if (e.msg[0])
        fprintf(f, "gpus: unknown: %s\n", e.msg);
    else
        fprintf(f, "gpus: none visible (no NVIDIA driver or GPU)\n");
#else
    fprintf(f, "gpus: none (built without CUDA)\n");
#endif
}

size_t kiln_backend_gpu_free(int index) {
    const struct kiln_cuda_module *m = cuda_if_gpu();
    return m ? m->device_free(index) : 0;
}

const char *kiln_backend_resolve(const char *name) {
    if (strcmp(name, "auto") != 0)
        return name;
    const struct kiln_cuda_module *m = cuda_if_gpu();
    return m && m->device_count() > 0 ? "cuda" : "cpu";
}

int kiln_backend_device_count(const char *name) {
    if (strcmp(name, "cuda") != 0)
        return 1;
    const struct kiln_cuda_module *m = cuda_if_gpu();
    return m ? m->device_count() : 0;
}

int kiln_backend_open(const char *name, const struct kiln_backend_opts *opts, struct kiln_backend *out,
                      struct kiln_error *err) {
    memset(out, 0, sizeof(*out));
    name = kiln_backend_resolve(name);
    if (strcmp(name, "cuda") == 0) {
        struct kiln_error e = {0};
        const struct kiln_cuda_module *m = kiln_cuda_module(&e);
        if (!m) {
            if (err)
                *err = e;
            return e.code;
        }
        return m->backend_open(opts, out, err);
    }
    if (strcmp(name, "cpu") != 0)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "unknown device '%s' (--device): allowed values are cpu, cuda, auto", name);
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
