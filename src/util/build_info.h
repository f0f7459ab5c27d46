// What this binary is: the version, the git commit it was built from ("-dirty" with uncommitted changes,
// "unknown" outside a git checkout), and the CUDA architectures compiled in ("" without CUDA). Written at
// every build by cmake/build_info.cmake. The backends and transports compiled in are asked of the registry
// (kiln_backend_compiled) and of parallel/comm/comm.h (kiln_comm_compiled).
#ifndef KILN_UTIL_BUILD_INFO_H
#define KILN_UTIL_BUILD_INFO_H

extern const char kiln_build_version[];
extern const char kiln_build_commit[];
extern const char kiln_build_cuda_archs[];
extern const char kiln_build_type[];

#endif
