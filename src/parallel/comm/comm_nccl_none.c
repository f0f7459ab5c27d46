// A build without CUDA or NCCL: the NCCL transport says so.
#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"

int kiln_comm_nccl_available(void) {
    return 0;
}

int kiln_comm_nccl_open(struct kiln_comm *c, const struct kiln_dist_env *env,
                        const struct kiln_comm_open_opts *o, struct kiln_error *err) {
    (void)c;
    (void)env;
    (void)o;
    return kiln_errorf(err, KILN_ERR_USAGE,
                       "comm nccl (--comm): this kiln was built without CUDA and NCCL; use --comm=mpi");
}
