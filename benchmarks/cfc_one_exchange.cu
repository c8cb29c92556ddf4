// A candidate for the CfC forward's sm_90 cluster path, measured against the kept kernel
// (perception/ops/csrc/cfc_scan.cu, cfc_scan_fwd<128, 2>) by benchmarks/cfc_one_exchange.py.
//
// The kept kernel crosses the cluster twice per step: z halves after W_rec·h, h halves after the cell.
// Here each block computes z for all D units itself (its own units' W_rec rows in registers as in the
// kept kernel, the peer's rows in shared memory, 32 KiB), so only h halves cross: one cluster barrier per
// step instead of two, for 32 more FMAs and 8 more shared float4 reads per thread. h is double-buffered:
// with z local, the peer can finish step t+1 and store its half of h_{t+1} while this block still reads
// h_t; it cannot get further, the barrier at the end of step t+1 waits for this block.
// The arithmetic and its order are the kept kernel's, so h_seq must equal its output bit for bit.
//
// The backward candidate (against cfc_scan_bwd<128, 2>) likewise crosses once per step instead of twice:
// only d_pre halves move; each block then forms dh for all D channels (the peer's W_rec rows in shared
// memory), so both carry the whole ∂L/∂h and form the gate gradients of all channels, and each block's
// dz needs no partial sums from the peer. Partial sums are formed over the kept kernel's sets in its
// order, so d_pre, d_gates and d_h0 must equal its outputs bit for bit too.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>
#include <torch/extension.h>

#include "cfc_cell.cuh"

namespace cg = cooperative_groups;

namespace {

using namespace perception_cfc;

constexpr int D = 128;        // the production width; the only one this candidate is built for
constexpr int T = 2 * D;      // threads per block, as the kept kernel
constexpr int DL = D / 2;     // units (and channels) a block owns
constexpr int SA = T / DL;    // splits of W_rec·h over channels (4)
constexpr int CA = D / SA;    // channels per split (32)
constexpr int JL = 4 * DL;    // gate rows a block owns: [f1, f2, ta, tb] of its channels
constexpr int PEER_W4 = SA * (CA / 4) * DL;  // float4s of the peer's W_rec rows
constexpr int SMEM_FLOATS = 4 * PEER_W4 + 2 * D + D + 2 * T + JL;

// global row of W_out for the block's local row jl (gate-major: jl = gate·DL + channel), as the kept kernel
__device__ int jg(int jl, int d0) { return (jl / DL) * D + d0 + jl % DL; }

__global__ void __launch_bounds__(T, 1) cfc_scan_fwd_one_exchange(
    const float* __restrict__ x_proj,  // (B, K, D)
    const float* __restrict__ ts,      // (B, K)
    const float* __restrict__ h0,      // (B, D)
    const float* __restrict__ w_rec,   // (D, D)  [u][c]
    const float* __restrict__ w_out,   // (4D, D) [j][u]
    const float* __restrict__ b_out,   // (4D)
    float* __restrict__ h_seq,         // (B, K, D)
    int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  float4* wpeer = smem4;                                    // [s][i4][o]: W_rec[p0 + o][s·CA + 4·i4 .. +3]
  float* hbuf = reinterpret_cast<float*>(wpeer + PEER_W4);  // (2, D) full h, double-buffered
  float* z = hbuf + 2 * D;                                  // (D) full z, computed in this block
  float* red = z + D;                                       // (2, SA, DL) partials: own units, peer's units
  float* g = red + 2 * T;                                   // (JL) this block's gate pre-activations

  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank();
  const int b = blockIdx.x / 2;
  const int d0 = rank * DL, p0 = (1 - rank) * DL;  // first own and first peer unit (== channel)
  const int oa = tid % DL, sa = tid / DL;          // W_rec·h: output unit (own and peer's), split

  float wo[D];  // W_out[jg(tid)][0..D), the one row this thread multiplies
  {
    const float4* row4 = reinterpret_cast<const float4*>(w_out + static_cast<size_t>(jg(tid, d0)) * D);
#pragma unroll
    for (int i = 0; i < D / 4; ++i) {
      const float4 v = row4[i];
      wo[4 * i] = v.x, wo[4 * i + 1] = v.y, wo[4 * i + 2] = v.z, wo[4 * i + 3] = v.w;
    }
  }
  float wr[CA];
#pragma unroll
  for (int i = 0; i < CA; ++i) wr[i] = w_rec[(d0 + oa) * D + sa * CA + i];
  for (int i = tid; i < PEER_W4; i += T) {
    const int o = i % DL, i4 = (i / DL) % (CA / 4), s = i / (DL * (CA / 4));
    wpeer[i] = *reinterpret_cast<const float4*>(w_rec + (p0 + o) * D + s * CA + 4 * i4);
  }
  const float bias = b_out[jg(tid, d0)];
  for (int i = tid; i < D; i += T) hbuf[i] = h0[b * D + i];
  cluster.sync();  // both blocks have started (their shared memory may be written) and staged h_{-1}

  const float* xrow = x_proj + static_cast<size_t>(b) * K * D;
  const float* tsrow = ts + static_cast<size_t>(b) * K;
  float* hrow = h_seq + static_cast<size_t>(b) * K * D;
  const int unit = tid < DL ? d0 + tid : p0 + tid - DL;  // the unit whose z thread tid < D completes
  float xp_next = tid < D ? xrow[unit] : 0.f;
  float ts_next = tsrow[0];

  for (int t = 0; t < K; ++t) {
    const float* h = hbuf + (t & 1) * D;  // h_{t-1}
    float* h_out = hbuf + ((t + 1) & 1) * D;  // h_t, in both blocks
    const float xp = xp_next, tst = ts_next;
    if (t + 1 < K) {  // prefetch the next step's inputs; they do not depend on the recurrence
      if (tid < D) xp_next = xrow[static_cast<size_t>(t + 1) * D + unit];
      ts_next = tsrow[t + 1];
    }
    // partials of W_rec·h for own unit d0 + oa (registers) and peer's unit p0 + oa (shared memory), in the
    // kept kernel's order: the peer's kernel sums its own unit from the same values the same way
    red[sa * DL + oa] = dot4<CA>([&](int i) { return wr[i]; }, h + sa * CA, 0.f);
    const float4* wp = wpeer + sa * (CA / 4) * DL + oa;
    red[T + sa * DL + oa] = dot4<CA>(
        [&](int i) {
          const float4 w = wp[(i / 4) * DL];
          return (i % 4 == 0) ? w.x : (i % 4 == 1) ? w.y : (i % 4 == 2) ? w.z : w.w;
        },
        h + sa * CA, 0.f);
    __syncthreads();
    if (tid < D) {  // z for every unit, here
      const float* r = red + (tid < DL ? 0 : T) + tid % DL;
      float pre = xp;
#pragma unroll
      for (int s = 0; s < SA; ++s) pre += r[s * DL];
      z[unit] = kLecunA * tanh_acc(kLecunB * pre);
    }
    __syncthreads();
    g[tid] = dot4<D>([&](int u) { return wo[u]; }, z, bias);
    __syncthreads();
    if (tid < DL) {  // h' = tanh(f1)(1 − σ) + σ tanh(f2), σ = sigmoid(ta·ts + tb)
      const float f1 = g[tid], f2 = g[DL + tid], ta = g[2 * DL + tid], tb = g[3 * DL + tid];
      const float sig = sigmoid_acc(fmaf(ta, tst, tb));
      const float hn = tanh_acc(f1) * (1.f - sig) + sig * tanh_acc(f2);
      hrow[static_cast<size_t>(t) * D + d0 + tid] = hn;
      h_out[d0 + tid] = hn;
      cluster.map_shared_rank(h_out, 1 - rank)[d0 + tid] = hn;
    }
    cluster.sync();  // h_t complete in both blocks; no block leaves while its peer may still store into it
  }
#else
  __trap();
#endif
}

constexpr int JA = 4 * D;                      // gate rows of all channels
constexpr int PEER_REC4 = 2 * (DL / 2 / 4) * D;  // float4s of the peer's W_rec rows, [sb][i4][d]
constexpr int BWD_SMEM_FLOATS = 4 * PEER_REC4 + JA + 2 * D + 4 * DL + 4 * D;

__global__ void __launch_bounds__(T, 1) cfc_scan_bwd_one_exchange(
    const float* __restrict__ grad_h,  // (B, K, D)
    const float* __restrict__ gates,   // (B, K, 4D) pre-activations [f1 | f2 | ta | tb]
    const float* __restrict__ zs,      // (B, K, D)
    const float* __restrict__ ts,      // (B, K)
    const float* __restrict__ w_rec,   // (D, D)  [u][d]
    const float* __restrict__ w_out,   // (4D, D) [j][u]
    float* __restrict__ d_pre,         // (B, K, D)
    float* __restrict__ d_gates,       // (B, K, 4D)
    float* __restrict__ d_h0,          // (B, D)
    int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int C2 = 2 * DL;  // gate rows per partial of dz (the kept kernel's C2)
  constexpr int C4 = DL / 2;  // units per partial of dh (the kept kernel's C4)
  extern __shared__ float4 smem4[];
  float4* wpeer = smem4;                                    // [sb][i4][d]: W_rec[p0 + sb·C4 + 4·i4 .. +3][d]
  float* dg = reinterpret_cast<float*>(wpeer + PEER_REC4);  // [ρ][q·DL + c]: gate q of channel ρ·DL + c
  float* dpbuf = dg + JA;                                   // (2, D) d_pre of all units, double-buffered
  float* xred = dpbuf + 2 * D;                              // (4, DL) partials of dz, [ρ·2 + sb][u]
  float* yred = xred + 4 * DL;                              // (4, D) partials of dh, [ρ·2 + sb][d]

  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank();
  const int b = blockIdx.x / 2;
  const int d0 = rank * DL, p0 = (1 - rank) * DL;
  // dz: thread (ou, k) forms the kept kernel's partial k = ρ·2 + sb of own unit d0 + ou
  const int ou = tid % DL, k = tid / DL, rho = k / 2, sbx = k % 2;
  float wo[C2];  // W_out[jg(sbx·C2 + i, ρ·DL)][d0 + ou]
#pragma unroll
  for (int i = 0; i < C2; ++i) wo[i] = w_out[static_cast<size_t>(jg(sbx * C2 + i, rho * DL)) * D + d0 + ou];
  // dh: thread (od, sb) forms partial rank·2 + sb (registers) and peer·2 + sb (shared memory) of channel od
  const int od = tid % D, sb = tid / D;
  float wr[C4];  // W_rec[d0 + sb·C4 + i][od]
#pragma unroll
  for (int i = 0; i < C4; ++i) wr[i] = w_rec[(d0 + sb * C4 + i) * D + od];
  for (int i = tid; i < PEER_REC4; i += T) {
    const int d = i % D, i4 = (i / D) % (C4 / 4), s = i / (D * (C4 / 4));
    const int u = p0 + s * C4 + 4 * i4;
    wpeer[i] = make_float4(w_rec[u * D + d], w_rec[(u + 1) * D + d], w_rec[(u + 2) * D + d], w_rec[(u + 3) * D + d]);
  }
  float carry = 0.f;  // ∂L/∂h_t through h_{t+1} for channel tid (tid < D): every block carries all channels
  cluster.sync();

  const size_t row = static_cast<size_t>(b) * K;
  auto at = [&](int t, int stride) { return (row + t) * stride; };
  const bool owns_channel = tid >= d0 && tid < d0 + DL;  // writes channel tid's d_gates and d_h0
  float gh_n = 0.f, f_n[4] = {0.f, 0.f, 0.f, 0.f}, z_n = 0.f;
  float ts_n = ts[row + K - 1];
  if (tid < D) {
    gh_n = grad_h[at(K - 1, D) + tid];
#pragma unroll
    for (int q = 0; q < 4; ++q) f_n[q] = gates[at(K - 1, 4 * D) + q * D + tid];
  }
  if (tid < DL) z_n = zs[at(K - 1, D) + d0 + tid];

  for (int t = K - 1; t >= 0; --t) {
    float* dp = dpbuf + (t & 1) * D;
    const float gh = gh_n, f1 = f_n[0], f2 = f_n[1], ta = f_n[2], tb = f_n[3], zz = z_n, tst = ts_n;
    if (t > 0) {  // prefetch step t−1; none of it depends on the carried gradient
      ts_n = ts[row + t - 1];
      if (tid < D) {
        gh_n = grad_h[at(t - 1, D) + tid];
#pragma unroll
        for (int q = 0; q < 4; ++q) f_n[q] = gates[at(t - 1, 4 * D) + q * D + tid];
      }
      if (tid < DL) z_n = zs[at(t - 1, D) + d0 + tid];
    }
    if (tid < D) {  // gate gradients of every channel
      const float dh = carry + gh;
      const float tf1 = tanh_acc(f1), tf2 = tanh_acc(f2), sig = sigmoid_acc(fmaf(ta, tst, tb));
      const float dsp = dh * (tf2 - tf1) * sig * (1.f - sig);  // ∂L/∂(ta·ts + tb)
      const float g4[4] = {dh * (1.f - sig) * (1.f - tf1 * tf1), dh * sig * (1.f - tf2 * tf2), dsp * tst, dsp};
      float* mine = dg + (tid / DL) * JL;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        mine[q * DL + tid % DL] = g4[q];
        if (owns_channel) d_gates[at(t, 4 * D) + q * D + tid] = g4[q];
      }
    }
    __syncthreads();
    xred[k * DL + ou] = dot4<C2>([&](int i) { return wo[i]; }, dg + rho * JL + sbx * C2, 0.f);
    __syncthreads();
    if (tid < DL) {  // d_pre = dz · lecun_tanh'(pre), lecun_tanh' = A·B·(1 − (z/A)²)
      float dz = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) dz += xred[q * DL + tid];
      const float zn = zz * (1.f / kLecunA);
      const float v = dz * (kLecunA * kLecunB) * (1.f - zn * zn);
      d_pre[at(t, D) + d0 + tid] = v;
      dp[d0 + tid] = v;
      cluster.map_shared_rank(dp, 1 - rank)[d0 + tid] = v;
    }
    cluster.sync();  // d_pre of all units in both blocks
    yred[(rank * 2 + sb) * D + od] = dot4<C4>([&](int i) { return wr[i]; }, dp + d0 + sb * C4, 0.f);
    const float4* wp = wpeer + sb * (C4 / 4) * D + od;
    yred[((1 - rank) * 2 + sb) * D + od] = dot4<C4>(
        [&](int i) {
          const float4 w = wp[(i / 4) * D];
          return (i % 4 == 0) ? w.x : (i % 4 == 1) ? w.y : (i % 4 == 2) ? w.z : w.w;
        },
        dp + p0 + sb * C4, 0.f);
    __syncthreads();
    if (tid < D) {
      float dh = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) dh += yred[q * D + tid];
      carry = dh;
    }
  }
  if (owns_channel) d_h0[static_cast<size_t>(b) * D + tid] = carry;
#else
  __trap();
#endif
}

void check_inputs(const char* op, const std::vector<std::pair<const at::Tensor*, const char*>>& all) {
  for (const auto& [t, name] : all) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                std::string(op) + ": " + name + " must be a contiguous float32 CUDA tensor");
  }
}

at::Tensor cfc_scan_one_exchange(const at::Tensor& x_proj, const at::Tensor& ts, const at::Tensor& h0,
                                 const at::Tensor& w_rec, const at::Tensor& w_out, const at::Tensor& b_out) {
  check_inputs("cfc_scan_one_exchange", {{&x_proj, "x_proj"}, {&ts, "ts"}, {&h0, "h0"}, {&w_rec, "w_rec"},
                                         {&w_out, "w_out"}, {&b_out, "b_out"}});
  TORCH_CHECK(x_proj.dim() == 3 && x_proj.size(2) == D, "cfc_scan_one_exchange: x_proj must be (B, K, 128)");
  const int B = x_proj.size(0), K = x_proj.size(1);
  const c10::cuda::CUDAGuard guard(x_proj.device());
  auto h_seq = at::empty_like(x_proj);
  if (B == 0 || K == 0) return h_seq;
  launch(cfc_scan_fwd_one_exchange, 2, B, T, SMEM_FLOATS * sizeof(float), x_proj.data_ptr<float>(),
                 ts.data_ptr<float>(), h0.data_ptr<float>(), w_rec.data_ptr<float>(), w_out.data_ptr<float>(),
                 b_out.data_ptr<float>(), h_seq.data_ptr<float>(), K);
  return h_seq;
}

std::vector<at::Tensor> cfc_scan_bwd_one_exchange_op(const at::Tensor& grad_h, const at::Tensor& gates,
                                                     const at::Tensor& z, const at::Tensor& ts,
                                                     const at::Tensor& w_rec, const at::Tensor& w_out) {
  check_inputs("cfc_scan_bwd_one_exchange", {{&grad_h, "grad_h"}, {&gates, "gates"}, {&z, "z"}, {&ts, "ts"},
                                             {&w_rec, "w_rec"}, {&w_out, "w_out"}});
  TORCH_CHECK(grad_h.dim() == 3 && grad_h.size(2) == D, "cfc_scan_bwd_one_exchange: grad_h must be (B, K, 128)");
  const int B = grad_h.size(0), K = grad_h.size(1);
  const c10::cuda::CUDAGuard guard(grad_h.device());
  auto d_pre = at::empty_like(grad_h);
  auto d_gates = at::empty({B, K, 4 * D}, grad_h.options());
  auto d_h0 = at::zeros({B, D}, grad_h.options());
  if (B == 0 || K == 0) return {d_pre, d_gates, d_h0};
  launch(cfc_scan_bwd_one_exchange, 2, B, T, BWD_SMEM_FLOATS * sizeof(float), grad_h.data_ptr<float>(),
                 gates.data_ptr<float>(), z.data_ptr<float>(), ts.data_ptr<float>(), w_rec.data_ptr<float>(),
                 w_out.data_ptr<float>(), d_pre.data_ptr<float>(), d_gates.data_ptr<float>(), d_h0.data_ptr<float>(), K);
  return {d_pre, d_gates, d_h0};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cfc_scan_one_exchange", &cfc_scan_one_exchange, "CfC forward, one cluster exchange per step (sm_90)");
  m.def("cfc_scan_bwd_one_exchange", &cfc_scan_bwd_one_exchange_op, "CfC backward, one cluster exchange per step");
}
