// Where this process sits in a job, read from the environment of the launcher that started it.
//
//   mpirun (OpenMPI)   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                      OMPI_COMM_WORLD_LOCAL_SIZE (without the local pair: one node)
//   torchrun-style     RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//                      (kiln launch sets these too; without LOCAL_RANK/LOCAL_WORLD_SIZE: one node, local rank
//                      = RANK; MASTER_ADDR and MASTER_PORT are required when WORLD_SIZE > 1)
//   Slurm's srun       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and this node's task count from the first
//   of
//                      SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE ("2(x3),1",
//                      indexed by SLURM_NODEID); the master is the first host of SLURM_STEP_NODELIST,
//                      SLURM_JOB_NODELIST or SLURM_NODELIST ("gpu[01-04,07],cpu3" gives gpu01) unless
//                      MASTER_ADDR is set, its port 20000 + SLURM_JOB_ID % 20000 unless MASTER_PORT is set.
//                      srun's tasks are told apart by SLURM_STEP_ID, which srun sets and an sbatch script's
//                      (or salloc's) own shell lacks: that shell has SLURM_PROCID=0 too, but is one process.
//   none of these      one process: rank 0 of 1
//
// Precedence: mpirun's variables, then torchrun-style RANK/WORLD_SIZE, then Slurm's (srun's task variables).
// A variable set to the empty string counts as unset. Bad or inconsistent values fail here with one line
// naming the variable (RANK >= WORLD_SIZE, a missing MASTER_ADDR where it is needed, a non-number, RANK
// without WORLD_SIZE, MASTER_PORT outside 1..65535, ...), never later as a hang.
#ifndef KILN_COMM_ENV_H
#define KILN_COMM_ENV_H

#include <stddef.h>

#include "util/error.h"

enum kiln_launcher {
    KILN_LAUNCHER_NONE = 0, // no launcher: one process
    KILN_LAUNCHER_MPIRUN,
    KILN_LAUNCHER_TORCHRUN, // RANK/WORLD_SIZE (torchrun, kiln launch, or set by hand)
    KILN_LAUNCHER_SLURM,
};
const char *kiln_launcher_name(enum kiln_launcher l); // "none", "mpirun", "torchrun", "slurm"

struct kiln_dist_env {
    enum kiln_launcher launcher;
    int rank, world;             // in the job
    int local_rank, local_world; // on this node (local_rank picks the GPU)
    char master_addr[256];       // rank 0's TCP store; "" when none is given (mpirun, one process), or
                                 // MASTER_ADDR when set under any launcher
    int master_port;             // 0 when none
};

// Reads the environment: envp is a NULL-terminated "NAME=value" array (NULL: the process's environ), so that
// tests can pass their own. Returns 0, or KILN_ERR_USAGE with a line naming the variable.
int kiln_dist_env_read(struct kiln_dist_env *out, const char *const *envp, struct kiln_error *err);

// One line for logs: "rank 1 of 4 (local 1 of 2, torchrun, master 10.0.0.1:29500)".
void kiln_dist_env_describe(const struct kiln_dist_env *e, char *buf, size_t cap);

#endif
