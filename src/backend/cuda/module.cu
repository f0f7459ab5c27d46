// The CUDA part's table of entry points (core/cuda_module.h): what libkiln_cuda.so exports for kiln to load,
// and what the test programs link in.
#include <stddef.h>

#include "core/cuda_module.h"

extern "C" const struct kiln_cuda_module kiln_cuda_module_table = {
    KILN_CUDA_MODULE_ABI,    KILN_CUDA_MODULE_SIZES, kiln_cuda_device_count,
    kiln_cuda_device_free,   kiln_cuda_describe,     kiln_cuda_backend_open,
#ifdef KILN_HAVE_NCCL // set by the build files where NCCL was found (parallel/comm/comm_nccl.cu is compiled)
    kiln_comm_nccl_open_gpu,
#else
    NULL,
#endif
};
