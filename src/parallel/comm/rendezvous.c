// See rendezvous.h.
#include "parallel/comm/rendezvous.h"

#include <string.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/store.h"

int kiln_rdzv_share(const struct kiln_dist_env *env, void *data, size_t bytes, double timeout_s,
                    struct kiln_error *err) {
    if (env->world == 1)
        return 0;
    if (env->launcher == KILN_LAUNCHER_MPIRUN && kiln_comm_mpi_available()) {
        // mpirun gives no MASTER_ADDR: the bytes travel over MPI itself
        struct kiln_comm *mpi;
        struct kiln_comm_open_opts o = {.kind = KILN_COMM_MPI, .timeout_s = timeout_s};
        int rc = kiln_comm_open_world(env, &o, &mpi, err);
        if (rc)
            return rc;
        kiln_comm_broadcast_host(mpi, data, bytes, 0);
        kiln_comm_close(mpi);
        return 0;
    }
    if (!env->master_addr[0] || env->master_port <= 0)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "MASTER_ADDR/MASTER_PORT (environment): rank %d of %d (%s) has no rendezvous address; "
            "set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port",
            env->rank, env->world, kiln_launcher_name(env->launcher));
    struct kiln_store *st;
    int rc =
        kiln_store_open(&st, env->master_addr, env->master_port, env->rank == 0, env->world, timeout_s, err);
    if (rc)
        return rc;
    size_t n = 0;
    if (env->rank == 0)
        rc = kiln_store_set(st, "kiln/rdzv/share", data, bytes, err);
    else if (!(rc = kiln_store_get(st, "kiln/rdzv/share", data, bytes, &n, timeout_s, err)) && n != bytes)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                         "rendezvous (TCP store at %s:%d): got %zu bytes, expected %zu; is another kiln job "
                         "using MASTER_PORT %d?",
                         env->master_addr, env->master_port, n, bytes, env->master_port);
    if (!rc) // rank 0's server must outlive every read
        rc = kiln_store_barrier(st, "kiln/rdzv/shared", timeout_s, err);
    kiln_store_close(st);
    return rc;
}
