/* The bytes every measuring tool puts in block src -> dst at an iteration, so the receiver can
 * check each one without being told: aapc run, aapc-bench, its MPI program (C) and the cluster
 * suite's test client. One definition for C and C++: no casts, only implicit conversions
 * (the sum is taken modulo 256 by the return type). */
#ifndef AAPC_TOOLS_PATTERN_H
#define AAPC_TOOLS_PATTERN_H

#include <stddef.h>

static inline unsigned char aapc_pattern(int src, int dst, int iteration, size_t k) {
  const size_t s = src, d = dst, i = iteration;
  return k * 131 + (k >> 8) * 7 + s * 17 + d * 29 + i * 53;
}

#ifdef __cplusplus
namespace aapc::tools {
inline unsigned char pattern(int src, int dst, int iteration, size_t k) { return aapc_pattern(src, dst, iteration, k); }
}  // namespace aapc::tools
#endif

#endif
