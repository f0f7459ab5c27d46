// Sharing a few bytes from one rank with all others before any communicator exists: NCCL's unique id.
// Under mpirun it travels over MPI (MPI_Bcast on the world); otherwise over the TCP store at
// MASTER_ADDR:MASTER_PORT, which rank 0 serves (parallel/comm/store.h).
#ifndef KILN_COMM_RENDEZVOUS_H
#define KILN_COMM_RENDEZVOUS_H

#include <stddef.h>

#include "parallel/comm/env.h"
#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// Rank 0's `bytes` bytes of data reach every rank's data. A rank that cannot reach the store within timeout_s
// gets an error naming the address, port and what it waited for.
int kiln_rdzv_share(const struct kiln_dist_env *env, void *data, size_t bytes, double timeout_s,
                    struct kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif
