// What bounds a step of the CfC scan's sm_90 cluster forward (perception/ops/csrc/cfc_scan.cu,
// cfc_scan_fwd_cluster<128>)? A model of its step at D = 128 whose phases a template mask switches off one at
// a time: the time a phase costs is the full model's time less the time without it. Measured by
// benchmarks/cfc_phases.py. The outputs are not the scan's (a phase left out leaves wrong values behind);
// only the times mean something. Built from the kernel's own parts (cfc_cell.cuh): the same launch, the
// same dot products, the same activations, the same shared-memory layout and exchange.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <cooperative_groups.h>
#include <torch/extension.h>

#include "cfc_cell.cuh"

namespace cg = cooperative_groups;

namespace {

using namespace perception_cfc;

constexpr int D = 128, T = 2 * D, DL = D / 2, SA = T / DL, CA = D / SA, JL = 4 * DL;
constexpr int PEER_W4 = SA * (CA / 4) * DL;
constexpr int SMEM_FLOATS = 4 * PEER_W4 + 3 * D + 2 * T + JL;

// Phases of a step, in the kernel's order; KEEP is a mask of those the model runs.
enum Phase : int {
  kRec = 1,        // W_rec·h partial sums (own rows from registers, the peer's from shared memory)
  kSync1 = 2,      // __syncthreads: partials complete
  kZ = 4,          // z = lecun_tanh(pre): the activation (else z = pre)
  kSync2 = 8,      // __syncthreads: z complete
  kOut = 16,       // W_out·z, one row of 128 per thread (else the bias and one z)
  kSync3 = 32,     // __syncthreads: gate pre-activations complete
  kCell = 64,      // the cell's activations: two tanh, one sigmoid (else a linear stand-in)
  kStore = 128,    // h_t to global memory
  kRemote = 256,   // h_t's half into the peer's shared memory
  kCluster = 512,  // cluster barrier (else __syncthreads)
  kAll = 1023,
};

__device__ __forceinline__ float act(float x, bool on) { return on ? tanh_acc(x) : x; }

template <int KEEP>
__global__ void __launch_bounds__(T, 1) step_phases(const float* __restrict__ x_proj, const float* __restrict__ w_rec,
                                                    const float* __restrict__ w_out, float* __restrict__ h_seq, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  float4* wpeer = smem4;
  float* hbuf = reinterpret_cast<float*>(wpeer + PEER_W4);
  float* z = hbuf + 2 * D;
  float* red = z + D;
  float* g = red + 2 * T;
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank();
  const int b = blockIdx.x / 2, d0 = rank * DL, p0 = (1 - rank) * DL;
  const int oa = tid % DL, sa = tid / DL;
  float wo[D];
#pragma unroll
  for (int i = 0; i < D; ++i) wo[i] = w_out[(tid % JL) * D + i];
  float wr[CA];
#pragma unroll
  for (int i = 0; i < CA; ++i) wr[i] = w_rec[(d0 + oa) * D + sa * CA + i];
  for (int i = tid; i < PEER_W4; i += T) wpeer[i] = reinterpret_cast<const float4*>(w_rec)[i % (D * D / 4)];
  for (int i = tid; i < 2 * D; i += T) hbuf[i] = 0.01f * (i % 7);
  cluster.sync();
  const float* xrow = x_proj + static_cast<size_t>(b) * K * D;
  float* hrow = h_seq + static_cast<size_t>(b) * K * D;
  const int unit = tid < DL ? d0 + tid : p0 + tid - DL;
  for (int t = 0; t < K; ++t) {
    const float* h = hbuf + (t & 1) * D;
    float* h_out = hbuf + ((t + 1) & 1) * D;
    const float xp = tid < D ? xrow[static_cast<size_t>(t) * D + unit] : 0.f;
    if constexpr (KEEP & kRec) {
      red[sa * DL + oa] = dot4<CA>([&](int i) { return wr[i]; }, h + sa * CA, 0.f);
      const float4* wp = wpeer + sa * (CA / 4) * DL + oa;
      red[T + sa * DL + oa] = dot4<CA>([&](int i) { return lane(wp[(i / 4) * DL], i % 4); }, h + sa * CA, 0.f);
    } else {
      red[sa * DL + oa] = h[tid % D];
      red[T + sa * DL + oa] = h[(tid + 1) % D];
    }
    if constexpr (KEEP & kSync1) __syncthreads();
    if (tid < D) {
      const float* r = red + (tid < DL ? 0 : T) + tid % DL;
      float pre = xp;
#pragma unroll
      for (int s = 0; s < SA; ++s) pre += r[s * DL];
      z[unit] = kLecunA * act(kLecunB * pre, KEEP & kZ);
    }
    if constexpr (KEEP & kSync2) __syncthreads();
    if constexpr (KEEP & kOut) {
      g[tid] = dot4<D>([&](int u) { return wo[u]; }, z, 0.1f);
    } else {
      g[tid] = z[tid % D] + 0.1f;
    }
    if constexpr (KEEP & kSync3) __syncthreads();
    if (tid < DL) {
      const float f1 = g[tid], f2 = g[DL + tid], ta = g[2 * DL + tid], tb = g[3 * DL + tid];
      float hn;
      if constexpr (KEEP & kCell) {
        const float sig = sigmoid_acc(fmaf(ta, 1.f, tb));
        hn = tanh_acc(f1) * (1.f - sig) + sig * tanh_acc(f2);
      } else {
        hn = 0.5f * (f1 + f2) + 0.01f * (ta - tb);
      }
      if constexpr (KEEP & kStore) hrow[static_cast<size_t>(t) * D + d0 + tid] = hn;
      h_out[d0 + tid] = hn;
      if constexpr (KEEP & kRemote) cluster.map_shared_rank(h_out, 1 - rank)[d0 + tid] = hn;
    }
    if constexpr (KEEP & kCluster) {
      cluster.sync();
    } else {
      __syncthreads();
    }
  }
  cluster.sync();  // no block leaves while its peer may still store into it
  if (tid < DL && !(KEEP & kStore)) hrow[d0 + tid] = hbuf[d0 + tid];  // keep the loop's result alive
#else
  __trap();
#endif
}

template <int KEEP>
void run(const at::Tensor& x, const at::Tensor& w_rec, const at::Tensor& w_out, at::Tensor& h_seq) {
  const int B = x.size(0), K = x.size(1);
  launch(&step_phases<KEEP>, 2, B, T, SMEM_FLOATS * sizeof(float), x.data_ptr<float>(), w_rec.data_ptr<float>(),
         w_out.data_ptr<float>(), h_seq.data_ptr<float>(), K);
}

// The variants cfc_phases.py times: the full model, and the model without one phase (or a group).
constexpr int kVariants[] = {kAll,
                             kAll & ~kCluster,
                             kAll & ~(kCluster | kRemote),
                             kAll & ~kRec,
                             kAll & ~kOut,
                             kAll & ~(kZ | kCell),
                             kAll & ~kStore,
                             kAll & ~(kSync1 | kSync3),
                             kSync1 | kSync2 | kSync3 | kCluster | kRemote};

at::Tensor phases(const at::Tensor& x, const at::Tensor& w_rec, const at::Tensor& w_out, int64_t variant) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.size(2) == D, "cfc_phases: x must be a CUDA (B, K, 128) tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  auto h_seq = at::empty_like(x);
  switch (variant) {
    case 0: run<kVariants[0]>(x, w_rec, w_out, h_seq); break;
    case 1: run<kVariants[1]>(x, w_rec, w_out, h_seq); break;
    case 2: run<kVariants[2]>(x, w_rec, w_out, h_seq); break;
    case 3: run<kVariants[3]>(x, w_rec, w_out, h_seq); break;
    case 4: run<kVariants[4]>(x, w_rec, w_out, h_seq); break;
    case 5: run<kVariants[5]>(x, w_rec, w_out, h_seq); break;
    case 6: run<kVariants[6]>(x, w_rec, w_out, h_seq); break;
    case 7: run<kVariants[7]>(x, w_rec, w_out, h_seq); break;
    case 8: run<kVariants[8]>(x, w_rec, w_out, h_seq); break;
    default: TORCH_CHECK(false, "cfc_phases: variant must be 0..8, got " + std::to_string(variant));
  }
  return h_seq;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("phases", &phases, "the step model, one variant"); }
