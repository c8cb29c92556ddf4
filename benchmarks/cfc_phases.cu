// What bounds a step of the CfC scan's sm_90 cluster kernels (perception/ops/csrc/cfc_scan.cu,
// cfc_scan_fwd_cluster<128> and cfc_scan_bwd<128, 2>)? Models of their steps at D = 128 whose phases a template
// mask switches off one at a time: the time a phase costs is the full model's time less the time without it. Measured by
// benchmarks/cfc_phases.py. The outputs are not the scan's (a phase left out leaves wrong values behind);
// only the times mean something. Built from the kernel's own parts (cfc_cell.cuh): the same launch, the
// same dot products, the same activations, the same shared-memory layout and exchange.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <cooperative_groups.h>
#include <torch/extension.h>

#include "cfc_cell.cuh"

#include <iterator>
#include <string>
#include <type_traits>

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

// The backward's phases, in its kernel's order; KEEP_B is a mask of those the model runs.
enum BwdPhase : int {
  bAct = 1,        // the gate gradients' activations: two tanh, one sigmoid (else a linear stand-in)
  bStoreG = 2,     // d_gates to global memory
  bSync = 4,       // the two __syncthreads: gate gradients complete, d_pre complete
  bOutT = 8,       // W_outᵀ·dg, 128 products a thread (else one dg)
  bRecT = 16,      // W_recᵀ·d_pre, 32 products a thread (else one d_pre)
  bRemote = 32,    // the partial sums into the owner's shared memory (else this block's)
  bCluster = 64,   // the two cluster barriers (else __syncthreads)
  bStoreP = 128,   // d_pre to global memory
  bAll = 255,
};

constexpr int C2 = JL / 2, C4 = DL / 2;

template <int KEEP>
__global__ void __launch_bounds__(T, 1) bwd_phases(const float* __restrict__ grad_h, const float* __restrict__ gates,
                                                   const float* __restrict__ zs, const float* __restrict__ ts,
                                                   const float* __restrict__ w_rec, const float* __restrict__ w_out,
                                                   float* __restrict__ d_pre, float* __restrict__ d_gates, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  float* dg = reinterpret_cast<float*>(smem4);
  float* dp = dg + JL;
  float* xbuf = dp + DL;
  float* ybuf = xbuf + 4 * DL;
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank();
  const int b = blockIdx.x / 2, d0 = rank * DL;
  const int ob = tid % D, sb = tid / D;
  float wo[D];
#pragma unroll
  for (int i = 0; i < D; ++i) wo[i] = w_out[((sb * C2 + i) % JL) * D + ob];
  float wr[C4];
#pragma unroll
  for (int i = 0; i < C4; ++i) wr[i] = w_rec[(d0 + sb * C4 + i) * D + ob];
  float carry = 0.f;
  cluster.sync();
  const size_t row = static_cast<size_t>(b) * K;
  auto at = [&](int t, int stride) { return (row + t) * stride; };
  auto sync_all = [&] {
    if constexpr (KEEP & bCluster) {
      cluster.sync();
    } else {
      __syncthreads();
    }
  };
  // the step's inputs are loaded a step ahead, as the kernel does: none of them depends on the recurrence
  float gh_n = 0.f, f_n[4] = {0.f, 0.f, 0.f, 0.f}, z_n = 0.f, ts_n = ts[row + K - 1];
  auto load = [&](int t) {
    ts_n = ts[row + t];
    if (tid < DL) {
      gh_n = grad_h[at(t, D) + d0 + tid];
#pragma unroll
      for (int q = 0; q < 4; ++q) f_n[q] = gates[at(t, 4 * D) + q * D + d0 + tid];
      z_n = zs[at(t, D) + d0 + tid];
    }
  };
  load(K - 1);
  for (int t = K - 1; t >= 0; --t) {
    const float gh = gh_n, f1 = f_n[0], f2 = f_n[1], ta = f_n[2], tb = f_n[3], zz = z_n, tst = ts_n;
    if (t > 0) load(t - 1);
    if (tid < DL) {
      const float dh = carry + gh;
      float tf1, tf2, sig;
      if constexpr (KEEP & bAct) {
        tf1 = tanh_acc(f1), tf2 = tanh_acc(f2), sig = sigmoid_acc(fmaf(ta, tst, tb));
      } else {
        tf1 = 0.5f * f1, tf2 = 0.5f * f2, sig = 0.25f * fmaf(ta, tst, tb) + 0.5f;
      }
      const float dsp = dh * (tf2 - tf1) * sig * (1.f - sig);
      const float g4[4] = {dh * (1.f - sig) * (1.f - tf1 * tf1), dh * sig * (1.f - tf2 * tf2), dsp * tst, dsp};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        dg[q * DL + tid] = g4[q];
        if constexpr (KEEP & bStoreG) d_gates[at(t, 4 * D) + q * D + d0 + tid] = g4[q];
      }
    }
    if constexpr (KEEP & bSync) __syncthreads();
    {
      float acc;
      if constexpr (KEEP & bOutT) {
        acc = dot4<D>([&](int i) { return wo[i]; }, dg + sb * C2, 0.f);
      } else {
        acc = dg[sb * C2 + ob % C2];
      }
      float* dst = (KEEP & bRemote) ? cluster.map_shared_rank(xbuf, ob / DL) : xbuf;
      dst[(rank * 2 + sb) * DL + ob % DL] = acc;
    }
    sync_all();
    if (tid < DL) {
      float dz = 0.f;
#pragma unroll
      for (int k = 0; k < 4; ++k) dz += xbuf[k * DL + tid];
      const float zn = zz * (1.f / kLecunA);
      const float v = dz * (kLecunA * kLecunB) * (1.f - zn * zn);
      dp[tid] = v;
      if constexpr (KEEP & bStoreP) d_pre[at(t, D) + d0 + tid] = v;
    }
    if constexpr (KEEP & bSync) __syncthreads();
    {
      float acc;
      if constexpr (KEEP & bRecT) {
        acc = dot4<C4>([&](int i) { return wr[i]; }, dp + sb * C4, 0.f);
      } else {
        acc = dp[sb * C4 + ob % C4];
      }
      float* dst = (KEEP & bRemote) ? cluster.map_shared_rank(ybuf, ob / DL) : ybuf;
      dst[(rank * 2 + sb) * DL + ob % DL] = acc;
    }
    sync_all();
    if (tid < DL) {
      float dh = 0.f;
#pragma unroll
      for (int k = 0; k < 4; ++k) dh += ybuf[k * DL + tid];
      carry = dh;
    }
  }
  cluster.sync();  // no block leaves while its peer may still store into it
  if (tid < DL && !(KEEP & bStoreP)) d_pre[row * D + d0 + tid] = carry;  // keep the loop's result alive
#else
  __trap();
#endif
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

// The backward variants cfc_phases.py times, likewise.
constexpr int kBwdVariants[] = {bAll,
                                bAll & ~bCluster,
                                bAll & ~(bCluster | bRemote),
                                bAll & ~bOutT,
                                bAll & ~bRecT,
                                bAll & ~bAct,
                                bAll & ~(bStoreG | bStoreP),
                                bAll & ~bSync,
                                bSync | bRemote | bCluster};

// f(std::integral_constant<int, variant>) for a runtime variant < N: the mask becomes a template argument.
template <int N, int I = 0, typename F>
void pick(int64_t variant, F&& f) {
  if constexpr (I < N) {
    if (variant == I) return f(std::integral_constant<int, I>{});
    pick<N, I + 1>(variant, f);
  } else {
    TORCH_CHECK(false, "cfc_phases: variant must be 0.." + std::to_string(N - 1) + ", got " + std::to_string(variant));
  }
}

at::Tensor phases(const at::Tensor& x, const at::Tensor& w_rec, const at::Tensor& w_out, int64_t variant) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.size(2) == D, "cfc_phases: x must be a CUDA (B, K, 128) tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  auto h_seq = at::empty_like(x);
  pick<std::size(kVariants)>(variant, [&](auto i) {
    launch(&step_phases<kVariants[decltype(i)::value]>, 2, static_cast<int>(x.size(0)), T, SMEM_FLOATS * sizeof(float),
           x.data_ptr<float>(), w_rec.data_ptr<float>(), w_out.data_ptr<float>(), h_seq.data_ptr<float>(),
           static_cast<int>(x.size(1)));
  });
  return h_seq;
}

at::Tensor bwd(const at::Tensor& grad_h, const at::Tensor& gates, const at::Tensor& z, const at::Tensor& ts,
               const at::Tensor& w_rec, const at::Tensor& w_out, int64_t variant) {
  TORCH_CHECK(grad_h.is_cuda() && grad_h.dim() == 3 && grad_h.size(2) == D,
              "cfc_phases: grad_h must be a CUDA (B, K, 128) tensor");
  const c10::cuda::CUDAGuard guard(grad_h.device());
  auto d_pre = at::empty_like(grad_h);
  auto d_gates = at::empty_like(gates);
  pick<std::size(kBwdVariants)>(variant, [&](auto i) {
    launch(&bwd_phases<kBwdVariants[decltype(i)::value]>, 2, static_cast<int>(grad_h.size(0)), T, (JL + DL + 8 * DL) * sizeof(float),
           grad_h.data_ptr<float>(), gates.data_ptr<float>(), z.data_ptr<float>(), ts.data_ptr<float>(),
           w_rec.data_ptr<float>(), w_out.data_ptr<float>(), d_pre.data_ptr<float>(), d_gates.data_ptr<float>(),
           static_cast<int>(grad_h.size(1)));
  });
  return d_pre;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("phases", &phases, "the forward step's model, one variant");
  m.def("bwd", &bwd, "the backward step's model, one variant");
}
