// Reading the launcher's environment (env.h): which launcher started this process, and where the process
// sits in the job. Every check fails with one line naming the variable and its value.
#include "parallel/comm/env.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

const char *kiln_launcher_name(enum kiln_launcher l) {
    switch (l) {
    case KILN_LAUNCHER_NONE:
        return "none";
    case KILN_LAUNCHER_MPIRUN:
        return "mpirun";
    case KILN_LAUNCHER_TORCHRUN:
        return "torchrun";
    case KILN_LAUNCHER_SLURM:
        return "slurm";
    }
    return "unknown";
}

// ---- looking up and parsing variables -----------------------------------------------------------

// The value of name in envp, or NULL when it is unset. A variable set to the empty string counts as unset
// (`VAR= cmd` is how shells clear one). The last definition wins, as with getenv on a duplicated entry.
static const char *env_get(const char *const *envp, const char *name) {
    size_t n = strlen(name);
    const char *found = NULL;
    for (const char *const *p = envp; *p; p++)
        if (!strncmp(*p, name, n) && (*p)[n] == '=')
            found = *p + n + 1;
    return found && *found ? found : NULL;
}

enum { NUM_OK = 0, NUM_GARBAGE, NUM_NEGATIVE, NUM_TOO_LARGE };

// A whole decimal number in 0..max (surrounding blanks allowed): NUM_OK, or what is wrong with it, the usage
// error naming the variable already in err.
static int parse_count(const char *name, const char *v, long long max, long long *out,
                       struct kiln_error *err) {
    const char *s = v;
    while (isspace((unsigned char)*s))
        s++;
    int negative = *s == '-';
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    while (end != s && isspace((unsigned char)*end))
        end++;
    if (end == s || *end != '\0' || !(isdigit((unsigned char)*s) || *s == '-' || *s == '+')) {
        kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s='%.64s' (environment): not a whole number; launchers set it to a decimal number such as 0",
            name, v);
        return NUM_GARBAGE;
    }
    if (negative && (x != 0 || errno == ERANGE)) {
        kiln_errorf(err, KILN_ERR_USAGE, "%s=%.64s (environment): negative; it must be 0 or more", name, v);
        return NUM_NEGATIVE;
    }
    if (errno == ERANGE || x > max) {
        kiln_errorf(err, KILN_ERR_USAGE, "%s=%.64s (environment): too large; it must be at most %lld", name,
                    v, max);
        return NUM_TOO_LARGE;
    }
    *out = x;
    return NUM_OK;
}

// An optional int variable: *present says whether it is set.
static int get_int(const char *const *envp, const char *name, int *present, int *out,
                   struct kiln_error *err) {
    const char *v = env_get(envp, name);
    *present = v != NULL;
    if (!v)
        return 0;
    long long x;
    if (parse_count(name, v, INT_MAX, &x, err))
        return KILN_ERR_USAGE;
    *out = (int)x;
    return 0;
}

// Checks rank < world and local_rank < local_world <= world, naming the variables the values came from.
static int check_ranks(const struct kiln_dist_env *e, const char *rank_var, const char *world_var,
                       const char *local_rank_var, const char *local_world_var, struct kiln_error *err) {
    if (e->world < 1)
        return kiln_errorf(err, KILN_ERR_USAGE, "%s=%d (environment): a job has at least one process",
                           world_var, e->world);
    if (e->rank >= e->world)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "%s=%d (environment): not below %s=%d; ranks run from 0 to %s-1 (%d here)",
                           rank_var, e->rank, world_var, e->world, world_var, e->world - 1);
    if (e->local_world < 1)
        return kiln_errorf(err, KILN_ERR_USAGE, "%s=%d (environment): a node runs at least one process",
                           local_world_var, e->local_world);
    if (e->local_rank >= e->local_world)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s=%d (environment): not below %s=%d; local ranks run from 0 to %s-1 on each node",
            local_rank_var, e->local_rank, local_world_var, e->local_world, local_world_var);
    if (e->local_world > e->world)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s=%d (environment): more processes on this node than %s=%d in the whole job; check "
            "the launch command",
            local_world_var, e->local_world, world_var, e->world);
    return 0;
}

// MASTER_ADDR and MASTER_PORT when set (either may be missing: the caller decides whether that is an error).
static int read_master(struct kiln_dist_env *e, const char *const *envp, struct kiln_error *err) {
    const char *addr = env_get(envp, "MASTER_ADDR");
    if (addr) {
        if (strlen(addr) >= sizeof(e->master_addr))
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "MASTER_ADDR (environment): %zu bytes long, more than a host name can be (%zu); "
                "set it to rank 0's host name or IP address",
                strlen(addr), sizeof(e->master_addr) - 1);
        for (const char *c = addr; *c; c++)
            if (isspace((unsigned char)*c) || !isprint((unsigned char)*c))
                return kiln_errorf(
                    err, KILN_ERR_USAGE,
                    "MASTER_ADDR='%.64s' (environment): contains a blank or control character; "
                    "set it to rank 0's host name or IP address",
                    addr);
        snprintf(e->master_addr, sizeof(e->master_addr), "%s", addr);
    }
    const char *port = env_get(envp, "MASTER_PORT");
    if (port) {
        long long p = 0;
        int bad = parse_count("MASTER_PORT", port, 65535, &p, err);
        if (bad == NUM_GARBAGE)
            return KILN_ERR_USAGE;
        if (bad || p < 1)
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "MASTER_PORT=%.64s (environment): outside 1..65535; pick a free TCP port on rank "
                "0's host, such as 29500",
                port);
        e->master_port = (int)p;
    }
    return 0;
}

// ---- mpirun (OpenMPI) ---------------------------------------------------------------------------

static int read_mpirun(struct kiln_dist_env *e, const char *const *envp, struct kiln_error *err) {
    int has_rank, has_size, has_lrank, has_lsize, rc;
    if ((rc = get_int(envp, "OMPI_COMM_WORLD_RANK", &has_rank, &e->rank, err)) ||
        (rc = get_int(envp, "OMPI_COMM_WORLD_SIZE", &has_size, &e->world, err)) ||
        (rc = get_int(envp, "OMPI_COMM_WORLD_LOCAL_RANK", &has_lrank, &e->local_rank, err)) ||
        (rc = get_int(envp, "OMPI_COMM_WORLD_LOCAL_SIZE", &has_lsize, &e->local_world, err)))
        return rc;
    if (has_rank != has_size)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s is set without %s (environment): mpirun sets both; run under mpirun, or unset the "
            "one left over",
            has_rank ? "OMPI_COMM_WORLD_RANK" : "OMPI_COMM_WORLD_SIZE",
            has_rank ? "OMPI_COMM_WORLD_SIZE" : "OMPI_COMM_WORLD_RANK");
    if (has_lrank != has_lsize)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s is set without %s (environment): mpirun sets both; run under mpirun, or unset the "
            "one left over",
            has_lrank ? "OMPI_COMM_WORLD_LOCAL_RANK" : "OMPI_COMM_WORLD_LOCAL_SIZE",
            has_lrank ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "OMPI_COMM_WORLD_LOCAL_RANK");
    if (!has_lrank) { // an MPI without local values: one node
        e->local_rank = e->rank;
        e->local_world = e->world;
    }
    e->launcher = KILN_LAUNCHER_MPIRUN;
    if ((rc = check_ranks(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", err)))
        return rc;
    // MPI itself needs no master, but a store-based rendezvous may use one if the user gave it
    return read_master(e, envp, err);
}

// ---- torchrun-style -----------------------------------------------------------------------------

static int read_torchrun(struct kiln_dist_env *e, const char *const *envp, struct kiln_error *err) {
    int has_rank, has_world, has_lrank, has_lworld, rc;
    if ((rc = get_int(envp, "RANK", &has_rank, &e->rank, err)) ||
        (rc = get_int(envp, "WORLD_SIZE", &has_world, &e->world, err)) ||
        (rc = get_int(envp, "LOCAL_RANK", &has_lrank, &e->local_rank, err)) ||
        (rc = get_int(envp, "LOCAL_WORLD_SIZE", &has_lworld, &e->local_world, err)))
        return rc;
    if (!has_rank || !has_world) {
        const char *set = has_rank    ? "RANK"
                          : has_world ? "WORLD_SIZE"
                          : has_lrank ? "LOCAL_RANK"
                                      : "LOCAL_WORLD_SIZE";
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s is set without %s (environment): torchrun-style launches set RANK and WORLD_SIZE "
            "together (and LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); set what "
            "is missing, or unset %s for a single process",
            set,
            !has_rank && !has_world ? "RANK and WORLD_SIZE"
            : !has_rank             ? "RANK"
                                    : "WORLD_SIZE",
            set);
    }
    if (has_lworld && !has_lrank)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "LOCAL_WORLD_SIZE=%d is set without LOCAL_RANK (environment): set both, or neither "
            "for a single-node job",
            e->local_world);
    if (has_lrank && !has_lworld)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "LOCAL_RANK=%d is set without LOCAL_WORLD_SIZE (environment): set both, or neither "
            "for a single-node job",
            e->local_rank);
    if (!has_lrank) { // one node: the local values are the job's
        e->local_rank = e->rank;
        e->local_world = e->world;
    }
    e->launcher = KILN_LAUNCHER_TORCHRUN;
    if ((rc = check_ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", err)))
        return rc;
    if ((rc = read_master(e, envp, err)))
        return rc;
    if (e->world > 1 && (!e->master_addr[0] || !e->master_port))
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s is not set (environment): torchrun-style launches with WORLD_SIZE=%d need "
            "MASTER_ADDR and MASTER_PORT, the address of rank 0's TCP store; set both (torchrun "
            "and kiln launch do), or use mpirun",
            !e->master_addr[0] ? "MASTER_ADDR" : "MASTER_PORT", e->world);
    return 0;
}

// ---- Slurm (srun) -------------------------------------------------------------------------------

// The tasks on node `node` (0-based) of a Slurm tasks-per-node list such as "2(x3),1" (2 tasks on each of 3
// nodes, then 1). With node < 0, the node that holds task `rank` under srun's default block distribution.
// Returns 0, or a usage error naming var.
static int slurm_tasks_on_node(const char *var, const char *list, int node, int rank, int *out,
                               struct kiln_error *err) {
    const char *p = list;
    long long first_task = 0; // of the current node
    int at = 0;               // the current node
    while (*p) {
        char *end;
        if (!isdigit((unsigned char)*p))
            goto bad;
        long long n = strtoll(p, &end, 10), reps = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x' || !isdigit((unsigned char)p[2]))
                goto bad;
            reps = strtoll(p + 2, &end, 10);
            if (*end != ')')
                goto bad;
            p = end + 1;
        }
        if (n < 1 || n > INT_MAX || reps < 1 || reps > INT_MAX)
            goto bad;
        if (*p == ',' && p[1])
            p++;
        else if (*p)
            goto bad;
        if (node >= 0 && node < at + reps) {
            *out = (int)n;
            return 0;
        }
        if (node < 0 && rank < first_task + n * reps) {
            *out = (int)n;
            return 0;
        }
        first_task += n * reps;
        at += (int)reps;
    }
    if (p == list)
        goto bad;
    if (node >= 0)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s=%.64s (environment): lists %d nodes, but SLURM_NODEID=%d; run the job under srun "
            "so that the task variables match",
            var, list, at, node);
    return kiln_errorf(
        err, KILN_ERR_USAGE,
        "%s=%.64s (environment): counts %lld tasks, but SLURM_PROCID=%d; run the job under srun so "
        "that the task variables match",
        var, list, first_task, rank);
bad:
    return kiln_errorf(err, KILN_ERR_USAGE,
                       "%s='%.64s' (environment): not a Slurm tasks-per-node list; expected counts such as "
                       "\"4\" or \"2(x3),1\"",
                       var, list);
}

// The first host of a Slurm host list such as "gpu[01-04,07],cpu3" ("gpu01"), bracket groups anywhere in a
// name ("rack[1-2]-n[5-6]" gives "rack1-n5") and zero padding kept as written. Returns 0, or a usage error.
static int slurm_first_host(const char *var, const char *list, char *out, size_t cap,
                            struct kiln_error *err) {
    size_t n = 0;
    const char *p = list;
    while (*p && *p != ',') {
        if (*p == '[') {
            // the group's first entry is the start of its first range: "[01-04,07]" -> "01"
            p++;
            if (!isdigit((unsigned char)*p))
                goto bad;
            while (isdigit((unsigned char)*p)) {
                if (n + 1 >= cap)
                    goto too_long;
                out[n++] = *p++;
            }
            if (*p != '-' && *p != ',' && *p != ']')
                goto bad;
            while (*p && *p != ']') {
                if (!isdigit((unsigned char)*p) && *p != '-' && *p != ',')
                    goto bad;
                p++;
            }
            if (*p != ']')
                goto bad;
            p++;
        } else if (*p == ']' || isspace((unsigned char)*p)) {
            goto bad;
        } else {
            if (n + 1 >= cap)
                goto too_long;
            out[n++] = *p++;
        }
    }
    if (n == 0)
        goto bad;
    out[n] = '\0';
    return 0;
too_long:
    return kiln_errorf(
        err, KILN_ERR_USAGE,
        "%s='%.64s' (environment): its first host name is longer than %zu bytes; set MASTER_ADDR "
        "to rank 0's host",
        var, list, cap - 1);
bad:
    return kiln_errorf(err, KILN_ERR_USAGE,
                       "%s='%.64s' (environment): not a Slurm host list; expected names such as "
                       "\"gpu[01-04,07],cpu3\", or set MASTER_ADDR to rank 0's host",
                       var, list);
}

// The first of names that is set (its name in *which), or NULL.
static const char *env_first(const char *const *envp, const char *const *names, const char **which) {
    for (; *names; names++) {
        const char *v = env_get(envp, *names);
        if (v) {
            *which = *names;
            return v;
        }
    }
    return NULL;
}

static int read_slurm(struct kiln_dist_env *e, const char *const *envp, struct kiln_error *err) {
    int has, rc;
    long long x;
    // srun's tasks: the step's own counts first (an srun inside sbatch may use part of the allocation)
    if ((rc = get_int(envp, "SLURM_PROCID", &has, &e->rank, err)))
        return rc;
    static const char *const ntasks_vars[] = {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", NULL};
    const char *world_var = "SLURM_NTASKS";
    const char *v = env_first(envp, ntasks_vars, &world_var);
    if (!v)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "SLURM_PROCID=%d is set without SLURM_NTASKS (environment): srun sets both; launch "
            "with srun, or set RANK and WORLD_SIZE instead",
            e->rank);
    if (parse_count(world_var, v, INT_MAX, &x, err))
        return KILN_ERR_USAGE;
    e->world = (int)x;
    if ((rc = get_int(envp, "SLURM_LOCALID", &has, &e->local_rank, err)))
        return rc;
    if (!has)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "SLURM_PROCID=%d is set without SLURM_LOCALID (environment): srun sets both; launch "
            "with srun, or set RANK and WORLD_SIZE instead",
            e->rank);

    // this node's task count
    static const char *const per_node_vars[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                                                "SLURM_TASKS_PER_NODE", NULL};
    const char *local_world_var = "SLURM_TASKS_PER_NODE";
    const char *per_node = env_first(envp, per_node_vars, &local_world_var);
    int node = -1, has_node;
    if ((rc = get_int(envp, "SLURM_NODEID", &has_node, &node, err)))
        return rc;
    if (!has_node)
        node = -1;
    if (per_node) {
        if ((rc = slurm_tasks_on_node(local_world_var, per_node, node, e->rank, &e->local_world, err)))
            return rc;
    } else {
        int nodes = 1, has_nodes;
        if ((rc = get_int(envp, "SLURM_NNODES", &has_nodes, &nodes, err)))
            return rc;
        if (has_nodes && nodes > 1)
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "SLURM_TASKS_PER_NODE is not set (environment): a job on SLURM_NNODES=%d nodes "
                "needs it to tell how many tasks share this node; launch with srun",
                nodes);
        e->local_world = e->world; // one node
    }
    e->launcher = KILN_LAUNCHER_SLURM;
    if ((rc = check_ranks(e, "SLURM_PROCID", world_var, "SLURM_LOCALID", local_world_var, err)))
        return rc;

    // the master: MASTER_ADDR/MASTER_PORT, else the first host of the node list and a port from the job id
    if ((rc = read_master(e, envp, err)))
        return rc;
    if (!e->master_addr[0]) {
        static const char *const list_vars[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                                                NULL};
        const char *list_var = "SLURM_JOB_NODELIST";
        const char *list = env_first(envp, list_vars, &list_var);
        if (list && (rc = slurm_first_host(list_var, list, e->master_addr, sizeof(e->master_addr), err)))
            return rc;
    }
    if (!e->master_port) {
        const char *job = env_get(envp, "SLURM_JOB_ID");
        const char *job_var = "SLURM_JOB_ID";
        if (!job) {
            job = env_get(envp, "SLURM_JOBID");
            job_var = "SLURM_JOBID";
        }
        if (job) {
            if (parse_count(job_var, job, LLONG_MAX, &x, err))
                return KILN_ERR_USAGE;
            e->master_port = 20000 + (int)(x % 20000); // 20000..39999: one job, one port, on every node
        }
    }
    if (e->world > 1 && !e->master_addr[0])
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "SLURM_JOB_NODELIST is not set (environment): a Slurm job with %s=%d needs rank 0's "
            "host for its TCP store; set MASTER_ADDR",
            world_var, e->world);
    if (e->world > 1 && !e->master_port)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "SLURM_JOB_ID is not set (environment): a Slurm job with %s=%d needs a port for rank "
            "0's TCP store; set MASTER_PORT",
            world_var, e->world);
    return 0;
}

// ---- the entry points ---------------------------------------------------------------------------

int kiln_dist_env_read(struct kiln_dist_env *out, const char *const *envp, struct kiln_error *err) {
    if (!envp)
        envp = (const char *const *)environ;
    struct kiln_dist_env e;
    memset(&e, 0, sizeof(e));
    e.world = e.local_world = 1;
    int rc;
    if (env_get(envp, "OMPI_COMM_WORLD_RANK") || env_get(envp, "OMPI_COMM_WORLD_SIZE"))
        rc = read_mpirun(&e, envp, err);
    else if (env_get(envp, "RANK") || env_get(envp, "WORLD_SIZE") || env_get(envp, "LOCAL_RANK") ||
             env_get(envp, "LOCAL_WORLD_SIZE"))
        rc = read_torchrun(&e, envp, err);
    else if (env_get(envp, "SLURM_PROCID") &&
             (env_get(envp, "SLURM_STEP_ID") || env_get(envp, "SLURM_STEPID")))
        rc = read_slurm(&e, envp, err);
    else // no launcher (an sbatch script's shell has SLURM_PROCID=0 too, but no step: it is one process)
        rc = read_master(&e, envp, err);
    if (rc)
        return rc;
    *out = e;
    return 0;
}

void kiln_dist_env_describe(const struct kiln_dist_env *e, char *buf, size_t cap) {
    if (!cap)
        return;
    int n = snprintf(buf, cap, "rank %d of %d (local %d of %d, %s", e->rank, e->world, e->local_rank,
                     e->local_world, kiln_launcher_name(e->launcher));
    if (n < 0 || (size_t)n >= cap)
        return;
    if (e->master_addr[0] && e->master_port) {
        int v6 = strchr(e->master_addr, ':') != NULL; // an IPv6 address: [::1]:29500
        snprintf(buf + n, cap - (size_t)n, ", master %s%s%s:%d)", v6 ? "[" : "", e->master_addr,
                 v6 ? "]" : "", e->master_port);
    } else {
        snprintf(buf + n, cap - (size_t)n, ")");
    }
}
