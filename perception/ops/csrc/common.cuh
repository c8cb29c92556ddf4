// What every kernel family (pool*.cu, cfc*.cu) shares: the hidden widths D the kernels are compiled for and
// the one dispatch over them, output poisoning for the tests, the cp.async copies, and the 16-byte alignment
// that float4 loads and cp.async need. Family constants (row layouts, tile shapes, cluster splits) are
// derived from the dispatched width inside each family's file, never here.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "messages.h"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

// ---------------------------------------------------------------------------------------------------
// Widths. Every family is compiled for D in {16, 32, 64, 128} (KERNEL_WIDTHS in perception/ops/common.py,
// which a CPU test keeps equal to the cases below).
//
// PERCEPTION_DISPATCH_WIDTH(d, ...) runs the statements in ... with `constexpr int kD` equal to the runtime
// width d; each family derives its own compile-time constants from kD (the pool's NV = kD / 16, the CfC's
// D = U = kD). Callers check the width first and say which widths exist (kernel_width_ok, kKernelWidths);
// the default case only guards against a missed check.
#define PERCEPTION_DISPATCH_WIDTH(d, ...)                                                                  \
  switch (d) {                                                                                             \
    case 16: { constexpr int kD = 16; __VA_ARGS__; } break;                                                \
    case 32: { constexpr int kD = 32; __VA_ARGS__; } break;                                                \
    case 64: { constexpr int kD = 64; __VA_ARGS__; } break;                                                \
    case 128: { constexpr int kD = 128; __VA_ARGS__; } break;                                              \
    default: TORCH_CHECK(false, "perception kernels: no instance for D = " + perception_msg::num(d));       \
  }

namespace perception_common {

constexpr const char* kKernelWidths = "{16, 32, 64, 128}";  // for messages; the cases above are the truth

inline bool kernel_width_ok(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

// ---------------------------------------------------------------------------------------------------
// PERCEPTION_OPS_POISON=1 fills an output with NaN before the launch, so tests see unwritten elements.
inline void poison_if_asked(at::Tensor& t) {
  if (std::getenv("PERCEPTION_OPS_POISON") != nullptr) t.fill_(std::numeric_limits<float>::quiet_NaN());
}

// ---------------------------------------------------------------------------------------------------
// Alignment. float4 loads and cp.async read 16-byte aligned addresses; a contiguous view at an odd offset
// (x.view(-1)[1:].view(...)) is not, so it is copied. Every other tensor comes back as .contiguous() would.
inline at::Tensor aligned_contiguous(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

// ---------------------------------------------------------------------------------------------------
// cp.async (sm_80+, so sm_89 and sm_90 alike). A build that also targets an older GPU compiles the copy as
// a trap there; no family launches a cp.async kernel on such a GPU.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define PERCEPTION_NO_CP_ASYNC 1
#endif

// Copies 16 bytes from global to shared memory, bypassing L1. src_bytes < 16 reads only that many bytes
// and zero-fills the rest; src_bytes = 0 reads nothing (rows past the end, with any valid address).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
#ifdef PERCEPTION_NO_CP_ASYNC
  __trap();
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(__cvta_generic_to_global(gmem)),
               "r"(src_bytes)
               : "memory");
#endif
}

// Closes the copies issued since the last commit into one group.
__device__ __forceinline__ void cp_async_commit() {
#ifndef PERCEPTION_NO_CP_ASYNC
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifndef PERCEPTION_NO_CP_ASYNC
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace perception_common
