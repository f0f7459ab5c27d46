// A build with CUDA and NCCL: the NCCL transport (comm_nccl.cu) lives in the CUDA module, loaded with the
// CUDA backend (core/cuda_module.h), so that NCCL is mapped only by a run that opens it.
#include "core/cuda_module.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"

int kiln_comm_nccl_available(void) {
    return 1;
}

int kiln_comm_nccl_open(struct kiln_comm *c, const struct kiln_dist_env *env,
                        const struct kiln_comm_open_opts *o, struct kiln_error *err) {
    struct kiln_error e = {0};
    const struct kiln_cuda_module *m = kiln_cuda_module(&e);
    if (!m) {
        if (err)
            *err = e;
        return e.code;
    }
    KILN_ASSERT(m->nccl_open); // the build pairs this file with a module that has NCCL
    return m->nccl_open(c, env, o, err);
}
