// A build without MPI (no libopenmpi-dev when it was configured): the MPI transport says so.
#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"

int kiln_comm_mpi_available(void) {
    return 0;
}

int kiln_comm_mpi_open(struct kiln_comm *c, const struct kiln_dist_env *env,
                       const struct kiln_comm_open_opts *o, struct kiln_error *err) {
    (void)c;
    (void)env;
    (void)o;
    return kiln_errorf(err, KILN_ERR_USAGE,
                       "comm mpi (--comm): this kiln was built without MPI; install libopenmpi-dev "
                       "(scripts/install-deps.sh) and rebuild");
}

void kiln_comm_mpi_abort(int code) {
    (void)code;
}
