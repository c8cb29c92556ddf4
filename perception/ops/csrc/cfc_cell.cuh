// What the CfC kernels share (cfc_scan.cu, and any candidate kernel measured against them): the cell's
// arithmetic (the accurate activations, the four-sum dot product, lecun_tanh's constants) and the launch
// of a kernel in clusters of NCTA blocks per batch row.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace perception_cfc {

// tanhf without --use_fast_math (the extension's flags have none): within 2 ulp, a shorter chain than expm1f's.
__device__ __forceinline__ float tanh_acc(float x) { return tanhf(x); }
__device__ __forceinline__ float sigmoid_acc(float x) { return 0.5f * tanh_acc(0.5f * x) + 0.5f; }

// sum_i w[i]·v[i] over N values (N % 4 == 0), v in shared memory (float4), w a register array or a
// strided pointer: four partial sums, added as (s0 + s1) + (s2 + s3). A register array needs the loop
// fully unrolled (UNROLL = N / 4); reads from memory unroll less, so their loads do not pile up in registers.
template <int N, int UNROLL = N / 4, typename W>
__device__ __forceinline__ float dot4(const W& w, const float* __restrict__ v, float init) {
  const float4* v4 = reinterpret_cast<const float4*>(v);
  float s0 = init, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll UNROLL
  for (int i = 0; i < N / 4; ++i) {
    const float4 x = v4[i];
    s0 = fmaf(w(4 * i), x.x, s0);
    s1 = fmaf(w(4 * i + 1), x.y, s1);
    s2 = fmaf(w(4 * i + 2), x.z, s2);
    s3 = fmaf(w(4 * i + 3), x.w, s3);
  }
  return (s0 + s1) + (s2 + s3);
}

// Component k of a float4 (k a compile-time constant once the dot products unroll).
__device__ __forceinline__ float lane(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// A cluster barrier in its two halves (sm_90; cluster_group::sync() is the pair back to back). arrive
// releases this thread's earlier writes, the peer's shared memory included; wait acquires everyone's. A global
// store placed between them is one the barrier does not wait for, so it overlaps the barrier.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

constexpr float kLecunA = 1.7159f;
constexpr float kLecunB = 0.666f;

// `blocks` batch rows of `ncta` blocks each (a thread-block cluster when ncta > 1) on the current stream.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), int ncta, int blocks, int threads, size_t smem, Args... args) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks * ncta);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = ncta;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ncta > 1 ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

}  // namespace perception_cfc
