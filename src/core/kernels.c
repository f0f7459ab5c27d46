// The CUDA backend's kernel choices by name (backend.h): one list, which run/knobs.c validates the
// environment against and kiln_cuda_set_kernel looks names up in, so that the two cannot disagree.
#include <string.h>

#include "core/backend.h"

// In each list the order is the backend's: index 0 is the default, and the kernels read the index.
static const char *const attn[] = {"wgmma", "fa2", "ref"};
static const char *const attn_block[] = {"wgmma", "tc", "ref"};
static const char *const wgmma_fwd[] = {"pingpong", "overlap"};
static const char *const wgmma_dq[] = {"tma-dqpw",  "tma",        "red",         "red-split",
                                       "tma-early", "tma-early2", "tma-dqfirst", "tma-split"};
static const char *const fa_variant[] = {"0", "1", "2"};
static const char *const gemm_tune[] = {"1", "0"};
static const char *const bgrad[] = {"colsum", "lt"};

#define LIST(a) a, (int)(sizeof(a) / sizeof(a[0]))
const struct kiln_kernel_knob kiln_kernel_values[KILN_KERNEL_COUNT] = {
    [KILN_KERNEL_ATTN] = {"KILN_ATTN", LIST(attn)},
    [KILN_KERNEL_ATTN_BLOCK] = {"KILN_ATTN_BLOCK", LIST(attn_block)},
    [KILN_KERNEL_WGMMA_FWD] = {"KILN_WGMMA_FWD", LIST(wgmma_fwd)},
    [KILN_KERNEL_WGMMA_DQ] = {"KILN_WGMMA_DQ", LIST(wgmma_dq)},
    [KILN_KERNEL_FA_VARIANT] = {"KILN_FA_VARIANT", LIST(fa_variant)},
    [KILN_KERNEL_GEMM_TUNE] = {"KILN_GEMM_TUNE", LIST(gemm_tune)},
    [KILN_KERNEL_BGRAD] = {"KILN_BGRAD", LIST(bgrad)},
};
#undef LIST

int kiln_kernel_lookup(const char *knob, const char *value, int *which, int *index) {
    for (int k = 0; k < KILN_KERNEL_COUNT; k++) {
        if (strcmp(knob, kiln_kernel_values[k].knob))
            continue;
        if (!value || !*value) {
            *which = k;
            *index = 0;
            return 0;
        }
        for (int i = 0; i < kiln_kernel_values[k].n_values; i++)
            if (!strcmp(value, kiln_kernel_values[k].values[i])) {
                *which = k;
                *index = i;
                return 0;
            }
        return -1;
    }
    return -1;
}
