// Loading kiln's optional modules from the directory of the running binary (util/module.h).
#include "util/module.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

// One entry per module asked for: its handle, or the error that loading it gave.
struct loaded_module {
    char file[64];
    void *handle;
    struct kiln_error err;
};
static pthread_mutex_t modules_mu = PTHREAD_MUTEX_INITIALIZER;
static struct loaded_module modules[8];
static int n_modules;

// dir/file, where dir holds the running binary (found through /proc/self/exe, so that a kiln started through
// a symbolic link or from PATH still finds the modules installed beside the real file)
static void module_path(const char *file, char *path, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[n > 0 ? n : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) // no /proc: the working directory
        snprintf(path, cap, "./%s", file);
    else
        snprintf(path, cap, "%.*s/%s", (int)(slash - exe), exe, file);
}

static void load(struct loaded_module *m, const char *what, const char *hint) {
    char path[PATH_MAX + 64];
    module_path(m->file, path, sizeof(path));
    if (access(path, F_OK) != 0) {
        kiln_errorf(&m->err, KILN_ERR_RUNTIME,
                    "%s (%s): the module is missing, though this kiln was built with it; kiln loads it from "
                    "its own directory: install it there from kiln's build directory",
                    what, path);
        return;
    }
    m->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!m->handle) {
        // e.g. "libcudart.so.13: cannot open shared object file: No such file or directory": one line
        const char *why = dlerror();
        char line[512];
        snprintf(line, sizeof(line), "%s", why ? why : "dlopen failed");
        for (char *p = line; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
        kiln_errorf(&m->err, KILN_ERR_RUNTIME, "%s (%s): cannot be loaded: %s; %s", what, path, line, hint);
    }
}

void *kiln_module_symbol(const char *file, const char *symbol, const char *what, const char *hint,
                         struct kiln_error *err) {
    pthread_mutex_lock(&modules_mu);
    struct loaded_module *m = NULL;
    for (int i = 0; i < n_modules && !m; i++)
        if (!strcmp(modules[i].file, file))
            m = &modules[i];
    if (!m) {
        KILN_ASSERT(n_modules < (int)(sizeof(modules) / sizeof(modules[0])) &&
                    strlen(file) < sizeof(m->file));
        m = &modules[n_modules++];
        snprintf(m->file, sizeof(m->file), "%s", file);
        load(m, what, hint);
    }
    void *sym = NULL;
    if (m->handle) {
        sym = dlsym(m->handle, symbol);
        if (!sym) {
            char path[PATH_MAX + 64];
            module_path(file, path, sizeof(path));
            kiln_errorf(&m->err, KILN_ERR_RUNTIME,
                        "%s (%s): the module has no %s, so it comes from another build of kiln; install the "
                        "module built with this binary",
                        what, path, symbol);
        }
    }
    if (!sym && err)
        *err = m->err;
    pthread_mutex_unlock(&modules_mu);
    return sym;
}
