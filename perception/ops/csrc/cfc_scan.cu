// CfC recurrence over K steps (DESIGN §3): forward as one persistent kernel, backward through time as one.
//
// Layout. Batch rows are independent through time, so each row is owned by NCTA thread blocks and no
// grid-wide sync is ever needed. W_rec and W_out hold 80k fp32 values (320 KiB): more than one SM keeps.
//  - sm_90 (NCTA = 2, a thread-block cluster): rank r owns units u in [r·D/2, (r+1)·D/2) and hidden
//    channels d in the same range, i.e. W_rec's rows for its u and W_out's 4·D/2 rows for its d (128 KiB
//    fp32), all in registers: each thread keeps the one W_out row (forward) or column slice (backward) it
//    multiplies, so a step reads no weights from shared memory, whose bandwidth bounded the matvec when
//    W_out lived there. The forward's blocks each compute z for all D units (the peer's W_rec rows in
//    shared memory, 32 KiB at D = 128), so only h halves cross the cluster: one barrier per step. The
//    backward crosses twice per step (its one-crossing form measured slower, benchmarks/results/cfc_one_exchange.md).
//    Exact fp32 weights; 2·B blocks (128 of 132 SMs at B = 64).
//  - portable (NCTA = 1, sm_89 / forced): one block per row, W_rec in registers; of each thread's 2·D
//    W_out values D sit in registers, NS in shared memory (what sm_89's 99 KiB per block leaves: 92 at
//    D = 128) and the rest are read from L2 each step (36 KiB per step at D = 128 instead of all 256 KiB).
//    Same arithmetic order as the cluster path up to the split of the sums.
// Backward stores nothing extra from the forward: z and the gate pre-activations are recomputed from h_seq
// by two GEMMs outside (cfc.py), and the weight gradients are GEMMs over the per-step gradients
// this kernel writes, so no atomics: every output element has exactly one writer and every sum a fixed order.
// Every matvec sums in four interleaved partial sums (fixed order), so no thread waits on one long FMA chain.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>
#include <torch/library.h>

#include "cfc_cell.cuh"
#include "common.cuh"
#include "messages.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace cg = cooperative_groups;

namespace {

using namespace perception_common;
using namespace perception_cfc;

// The blocks that share one batch row: NCTA = 1 is a plain block, NCTA = 2 a cluster on sm_90.
template <int NCTA>
struct Cta;

template <>
struct Cta<1> {
  __device__ static unsigned rank() { return 0; }
  __device__ static float* map(float* p, unsigned) { return p; }
  __device__ static void sync() { __syncthreads(); }
  __device__ static void arrive() { __syncthreads(); }
  __device__ static void wait() {}
};

template <>
struct Cta<2> {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __device__ static unsigned rank() { return cg::this_cluster().block_rank(); }
  __device__ static float* map(float* p, unsigned r) { return cg::this_cluster().map_shared_rank(p, r); }
  __device__ static void sync() { cg::this_cluster().sync(); }
  __device__ static void arrive() { cluster_arrive(); }
  __device__ static void wait() { cluster_wait(); }
#else
  __device__ static unsigned rank() { __trap(); return 0; }
  __device__ static float* map(float* p, unsigned) { __trap(); return p; }
  __device__ static void sync() { __trap(); }
  __device__ static void arrive() { __trap(); }
  __device__ static void wait() { __trap(); }
#endif
};

template <int D, int NCTA>
struct Shape {
  static constexpr int T = 2 * D;             // threads per block
  static constexpr int DL = D / NCTA;         // hidden channels (and units) owned by one block
  static constexpr int JL = 4 * D / NCTA;     // rows of W_out owned: [f1, f2, ta, tb] of its channels
  static constexpr int SA = T / DL;           // forward W_rec·h: splits of the sum over channels
  static constexpr int CA = D / SA;           //   channels per split (W_rec values in registers)
  static constexpr int JPT = JL / T;          // forward W_out·z: outputs per thread
  static constexpr int C2 = JL / 2;           // backward W_outᵀ·dg: rows per split (2 splits)
  static constexpr int C4 = DL / 2;           // backward W_recᵀ·d_pre: units per split (registers)
  static constexpr bool kRegW = NCTA > 1;     // W_out slice in registers: D values per thread
  static constexpr int PEER_W4 = SA * (CA / 4) * DL;  // cluster forward: float4s of the peer's W_rec rows
  static constexpr int fwd_base_floats = NCTA == 1 ? 2 * D + T + JL : 4 * PEER_W4 + 3 * D + 2 * T + JL;
  static constexpr int bwd_base_floats = JL + DL + 2 * NCTA * DL * 2;
  // Portable path: each thread's W_out values are 2·D; the first D sit in registers, the next NS in shared
  // memory (as much as sm_89's 99 KiB per block leaves), the last D − NS are read from L2 each step.
  static constexpr int kSm89Floats = 99 * 1024 / 4;
  static constexpr int kBaseFloats = fwd_base_floats > bwd_base_floats ? fwd_base_floats : bwd_base_floats;
  static constexpr int kNsFit = (kSm89Floats - kBaseFloats) / T / 4 * 4;
  static constexpr int NS = NCTA > 1 ? 0 : (kNsFit < D ? kNsFit : D);
  static constexpr int fwd_smem_floats = fwd_base_floats + NS * T;
  static constexpr int bwd_smem_floats = bwd_base_floats + NS * T;
  static_assert(CA % 4 == 0 && C2 % 4 == 0 && C4 % 4 == 0 && JPT >= 1, "unsupported D");
  static_assert(!kRegW || (JPT == 1 && C2 == D), "the register slice is one W_out row (forward), D rows (backward)");
  static_assert(kRegW || (JPT == 2 && C2 == 2 * D && NS % 4 == 0), "portable: two W_out rows (forward), 2·D (backward)");
  // global row of W_out for the block's local row jl (gate-major: jl = gate·DL + channel)
  __device__ static int jg(int jl, int d0) { return (jl / DL) * D + d0 + jl % DL; }
};

// Portable path: float4 steps of a weight sum read from L2 in flight at once (more would cost registers).
constexpr int kL2Unroll = 3;

// ---------------------------------------------------------------------------------------------------
// Forward: h_t = cell(x_proj_t, ts_t, h_{t-1}); writes h_seq only.

// Portable path (NCTA = 1): one block per row, W_rec in registers. Thread tid computes W_out rows tid and
// tid + T: the first from registers, the second from shared memory (its first NS values) and L2 (the rest).
template <int D>
__global__ void __launch_bounds__(2 * D, 1) cfc_scan_fwd(
    const float* __restrict__ x_proj,   // (B, K, D)
    const float* __restrict__ ts,       // (B, K)
    const float* __restrict__ h0,       // (B, D)
    const float* __restrict__ w_rec,    // (D, D)  [u][c]
    const float* __restrict__ w_out_t,  // (D, 4D) [u][j]
    const float* __restrict__ b_out,    // (4D)
    float* __restrict__ h_seq,          // (B, K, D)
    int K) {
  using S = Shape<D, 1>;
  constexpr int T = S::T, NS = S::NS;
  extern __shared__ float4 smem4[];
  float4* ws = smem4;                                     // [i4][tid]: W_out[tid + T][4·i4 .. +3], i4 < NS/4
  float* h = reinterpret_cast<float*>(ws + NS / 4 * T);  // (D)
  float* z = h + D;                                       // (D)
  float* red = z + D;                                     // (SA, D) partial sums of W_rec·h
  float* g = red + T;                                     // (4D) gate pre-activations

  const int tid = threadIdx.x;
  const int b = blockIdx.x;
  const int oa = tid % D, sa = tid / D;  // W_rec·h: output unit, split
  float wr[S::CA];
#pragma unroll
  for (int i = 0; i < S::CA; ++i) wr[i] = w_rec[oa * D + sa * S::CA + i];
  float wo[D];  // W_out[tid][0..D)
#pragma unroll
  for (int u = 0; u < D; ++u) wo[u] = w_out_t[u * S::JL + tid];
  for (int i4 = 0; i4 < NS / 4; ++i4) {
    const float* w = w_out_t + (4 * i4) * S::JL + T + tid;
    ws[i4 * T + tid] = make_float4(w[0], w[S::JL], w[2 * S::JL], w[3 * S::JL]);
  }
  const float bias0 = b_out[tid], bias1 = b_out[T + tid];
  for (int i = tid; i < D; i += T) h[i] = h0[b * D + i];
  __syncthreads();

  const float* xrow = x_proj + static_cast<size_t>(b) * K * D;
  const float* tsrow = ts + static_cast<size_t>(b) * K;
  float* hrow = h_seq + static_cast<size_t>(b) * K * D;
  float xp_next = tid < D ? xrow[tid] : 0.f;
  float ts_next = tsrow[0];

  for (int t = 0; t < K; ++t) {
    const float xp = xp_next, tst = ts_next;
    if (t + 1 < K) {  // prefetch the next step's inputs; they do not depend on the recurrence
      if (tid < D) xp_next = xrow[static_cast<size_t>(t + 1) * D + tid];
      ts_next = tsrow[t + 1];
    }
    // z = lecun_tanh(x_proj + W_rec·h)
    red[sa * D + oa] = dot4<S::CA>([&](int i) { return wr[i]; }, h + sa * S::CA, 0.f);
    __syncthreads();
    if (tid < D) {
      float pre = xp;
#pragma unroll
      for (int s = 0; s < S::SA; ++s) pre += red[s * D + tid];
      z[tid] = kLecunA * tanh_acc(kLecunB * pre);
    }
    __syncthreads();
    // g = W_out·z + b_out: row tid from registers; row tid + T from shared memory, then L2 (coalesced over tid)
    g[tid] = dot4<D>([&](int u) { return wo[u]; }, z, bias0);
    {
      float acc = dot4<NS>([&](int i) { return lane(ws[(i / 4) * T + tid], i % 4); }, z, bias1);
      if constexpr (NS < D) {
        const float* w = w_out_t + NS * S::JL + T + tid;
        acc = dot4<D - NS, kL2Unroll>([&](int i) { return w[i * S::JL]; }, z + NS, acc);
      }
      g[T + tid] = acc;
    }
    __syncthreads();
    float hn = 0.f;
    if (tid < D) {  // h' = tanh(f1)(1 − σ) + σ tanh(f2), σ = sigmoid(ta·ts + tb)
      const float f1 = g[tid], f2 = g[D + tid], ta = g[2 * D + tid], tb = g[3 * D + tid];
      const float sig = sigmoid_acc(fmaf(ta, tst, tb));
      hn = tanh_acc(f1) * (1.f - sig) + sig * tanh_acc(f2);
      h[tid] = hn;
    }
    __syncthreads();  // h complete; also orders z/red/g reuse by the next step
    if (tid < D) hrow[static_cast<size_t>(t) * D + tid] = hn;  // after the barrier: overlaps the next step
  }
}

// Cluster path (sm_90): the two blocks of a row each compute z for all D units (own units' W_rec rows in
// registers, the peer's in shared memory), so only h halves cross the cluster: one cluster barrier per
// step. h is double-buffered: with z local, the peer can finish step t+1 and store its half of h_{t+1}
// while this block still reads h_t; it cannot get further, the barrier ending step t+1 waits for this block.
// A unit's W_rec·h is summed from the same values in the same order in both blocks.
template <int D>
__global__ void __launch_bounds__(2 * D, 1) cfc_scan_fwd_cluster(
    const float* __restrict__ x_proj,  // (B, K, D)
    const float* __restrict__ ts,      // (B, K)
    const float* __restrict__ h0,      // (B, D)
    const float* __restrict__ w_rec,   // (D, D)  [u][c]
    const float* __restrict__ w_out,   // (4D, D) [j][u]
    const float* __restrict__ b_out,   // (4D)
    float* __restrict__ h_seq,         // (B, K, D)
    int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = Shape<D, 2>;
  constexpr int T = S::T, DL = S::DL, SA = S::SA, CA = S::CA;
  extern __shared__ float4 smem4[];
  float4* wpeer = smem4;                                      // [s][i4][o]: W_rec[p0 + o][s·CA + 4·i4 .. +3]
  float* hbuf = reinterpret_cast<float*>(wpeer + S::PEER_W4);  // (2, D) full h, double-buffered
  float* z = hbuf + 2 * D;                                    // (D) full z, computed in this block
  float* red = z + D;                                         // (2, SA, DL) partials: own units, peer's units
  float* g = red + 2 * T;                                     // (JL) this block's gate pre-activations

  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank();
  const int b = blockIdx.x / 2;
  const int d0 = rank * DL, p0 = (1 - rank) * DL;  // first own and first peer unit (== channel)
  const int oa = tid % DL, sa = tid / DL;          // W_rec·h: output unit (own and peer's), split

  float wo[D];  // W_out[jg(tid)][0..D), the one row this thread multiplies
  {
    const float4* row4 = reinterpret_cast<const float4*>(w_out + static_cast<size_t>(S::jg(tid, d0)) * D);
#pragma unroll
    for (int i = 0; i < D / 4; ++i) {
      const float4 v = row4[i];
      wo[4 * i] = v.x, wo[4 * i + 1] = v.y, wo[4 * i + 2] = v.z, wo[4 * i + 3] = v.w;
    }
  }
  float wr[CA];
#pragma unroll
  for (int i = 0; i < CA; ++i) wr[i] = w_rec[(d0 + oa) * D + sa * CA + i];
  for (int i = tid; i < S::PEER_W4; i += T) {
    const int o = i % DL, i4 = (i / DL) % (CA / 4), s = i / (DL * (CA / 4));
    wpeer[i] = *reinterpret_cast<const float4*>(w_rec + (p0 + o) * D + s * CA + 4 * i4);
  }
  const float bias = b_out[S::jg(tid, d0)];
  for (int i = tid; i < D; i += T) hbuf[i] = h0[b * D + i];
  cluster.sync();  // both blocks have started (their shared memory may be written) and staged h_{-1}

  const float* xrow = x_proj + static_cast<size_t>(b) * K * D;
  const float* tsrow = ts + static_cast<size_t>(b) * K;
  float* hrow = h_seq + static_cast<size_t>(b) * K * D;
  const int unit = tid < DL ? d0 + tid : p0 + tid - DL;  // the unit whose z thread tid < D completes
  float xp_next = tid < D ? xrow[unit] : 0.f;
  float ts_next = tsrow[0];

  for (int t = 0; t < K; ++t) {
    const float* h = hbuf + (t & 1) * D;      // h_{t-1}
    float* h_out = hbuf + ((t + 1) & 1) * D;  // h_t, in both blocks
    const float xp = xp_next, tst = ts_next;
    if (t + 1 < K) {  // prefetch the next step's inputs; they do not depend on the recurrence
      if (tid < D) xp_next = xrow[static_cast<size_t>(t + 1) * D + unit];
      ts_next = tsrow[t + 1];
    }
    // partials of W_rec·h for own unit d0 + oa (registers) and the peer's unit p0 + oa (shared memory)
    red[sa * DL + oa] = dot4<CA>([&](int i) { return wr[i]; }, h + sa * CA, 0.f);
    const float4* wp = wpeer + sa * (CA / 4) * DL + oa;
    red[T + sa * DL + oa] = dot4<CA>(
        [&](int i) { return lane(wp[(i / 4) * DL], i % 4); },
        h + sa * CA, 0.f);
    __syncthreads();
    if (tid < D) {  // z = lecun_tanh(x_proj + W_rec·h) for every unit, here
      const float* r = red + (tid < DL ? 0 : T) + tid % DL;
      float pre = xp;
#pragma unroll
      for (int s = 0; s < SA; ++s) pre += r[s * DL];
      z[unit] = kLecunA * tanh_acc(kLecunB * pre);
    }
    __syncthreads();
    g[tid] = dot4<D>([&](int u) { return wo[u]; }, z, bias);  // g = W_out·z + b_out for the owned row
    __syncthreads();
    float hn = 0.f;
    if (tid < DL) {  // h' = tanh(f1)(1 − σ) + σ tanh(f2), σ = sigmoid(ta·ts + tb)
      const float f1 = g[tid], f2 = g[DL + tid], ta = g[2 * DL + tid], tb = g[3 * DL + tid];
      const float sig = sigmoid_acc(fmaf(ta, tst, tb));
      hn = tanh_acc(f1) * (1.f - sig) + sig * tanh_acc(f2);
      h_out[d0 + tid] = hn;
      cluster.map_shared_rank(h_out, 1 - rank)[d0 + tid] = hn;
    }
    cluster_arrive();
    if (tid < DL) hrow[static_cast<size_t>(t) * D + d0 + tid] = hn;  // overlaps the barrier
    cluster_wait();  // h_t complete in both blocks; no block leaves while its peer may still store into it
  }
#else
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------------------
// Backward through time, t = K−1 … 0, carrying dh = ∂L/∂h_t. Writes d_pre (= ∂L/∂x_proj), d_gates
// (∂L/∂[f1, f2, ta, tb]) per step and d_h0; weight gradients are GEMMs over these outside.
template <int D, int NCTA>
__global__ void __launch_bounds__(2 * D, 1) cfc_scan_bwd(
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
  using S = Shape<D, NCTA>;
  extern __shared__ float4 smem4[];
  float4* ws = smem4;  // portable: [i4][tid]: W_out[sb·C2 + D + 4·i4 .. +3][ob], i4 < NS/4 (none on the cluster)
  float* dg = reinterpret_cast<float*>(ws + S::NS / 4 * S::T);  // (JL) this block's gate gradients
  float* dp = dg + S::JL;                                       // (DL) d_pre of the owned units
  float* xbuf = dp + S::DL;                                     // (2·NCTA, DL) partials of W_outᵀ·dg, owned units
  float* ybuf = xbuf + 2 * NCTA * S::DL;                        // (2·NCTA, DL) partials of W_recᵀ·d_pre, channels

  const int tid = threadIdx.x;
  const unsigned rank = Cta<NCTA>::rank();
  const int b = blockIdx.x / NCTA;
  const int d0 = rank * S::DL;

  const int ob = tid % D, sb = tid / D;  // backward matvecs: output (unit or channel), split (0, 1)
  float wo[D];  // W_out[jg(sb·C2 + i)][ob], i < D: all of C2 on the cluster, the first half on the portable path
#pragma unroll
  for (int i = 0; i < D; ++i) wo[i] = w_out[static_cast<size_t>(S::jg(sb * S::C2 + i, d0)) * D + ob];
  for (int i4 = 0; i4 < S::NS / 4; ++i4) {
    const float* w = w_out + static_cast<size_t>(sb * S::C2 + D + 4 * i4) * D + ob;
    ws[i4 * S::T + tid] = make_float4(w[0], w[D], w[2 * D], w[3 * D]);
  }
  float wr[S::C4];
#pragma unroll
  for (int i = 0; i < S::C4; ++i) wr[i] = w_rec[(d0 + sb * S::C4 + i) * D + ob];
  float carry = 0.f;  // ∂L/∂h_t through h_{t+1}, for channel d0 + tid (tid < DL)
  Cta<NCTA>::sync();

  const size_t row = static_cast<size_t>(b) * K;
  auto at = [&](int t, int stride) { return (row + t) * stride; };
  float gh_n = 0.f, f_n[4] = {0.f, 0.f, 0.f, 0.f}, z_n = 0.f;
  float ts_n = ts[row + K - 1];
  if (tid < S::DL) {
    gh_n = grad_h[at(K - 1, D) + d0 + tid];
#pragma unroll
    for (int q = 0; q < 4; ++q) f_n[q] = gates[at(K - 1, 4 * D) + q * D + d0 + tid];
    z_n = zs[at(K - 1, D) + d0 + tid];
  }

  for (int t = K - 1; t >= 0; --t) {
    const float gh = gh_n, f1 = f_n[0], f2 = f_n[1], ta = f_n[2], tb = f_n[3], zz = z_n, tst = ts_n;
    if (t > 0) {  // prefetch step t−1; none of it depends on the carried gradient
      ts_n = ts[row + t - 1];
      if (tid < S::DL) {
        gh_n = grad_h[at(t - 1, D) + d0 + tid];
#pragma unroll
        for (int q = 0; q < 4; ++q) f_n[q] = gates[at(t - 1, 4 * D) + q * D + d0 + tid];
        z_n = zs[at(t - 1, D) + d0 + tid];
      }
    }
    if (tid < S::DL) {  // gate gradients of the owned channels
      const float dh = carry + gh;
      const float tf1 = tanh_acc(f1), tf2 = tanh_acc(f2), sig = sigmoid_acc(fmaf(ta, tst, tb));
      const float dsp = dh * (tf2 - tf1) * sig * (1.f - sig);  // ∂L/∂(ta·ts + tb)
      const float g4[4] = {dh * (1.f - sig) * (1.f - tf1 * tf1), dh * sig * (1.f - tf2 * tf2), dsp * tst, dsp};
#pragma unroll
      for (int q = 0; q < 4; ++q) dg[q * S::DL + tid] = g4[q];
    }
    __syncthreads();
    {  // partial dz[u] = Σ_{owned rows j} W_out[j, u]·dg[j], sent to the block that owns u
      float acc = dot4<D>([&](int i) { return wo[i]; }, dg + sb * S::C2, 0.f);
      if constexpr (!S::kRegW) {  // portable: the split's other D rows from shared memory, then L2
        const float* dg2 = dg + sb * S::C2 + D;
        acc = dot4<S::NS>([&](int i) { return lane(ws[(i / 4) * S::T + tid], i % 4); }, dg2, acc);
        if constexpr (S::NS < D) {
          const float* w = w_out + static_cast<size_t>(sb * S::C2 + D + S::NS) * D + ob;  // [j][u], row stride D
          acc = dot4<D - S::NS, kL2Unroll>([&](int i) { return w[i * D]; }, dg2 + S::NS, acc);
        }
      }
      const int owner = ob / S::DL;
      Cta<NCTA>::map(xbuf, owner)[(rank * 2 + sb) * S::DL + ob % S::DL] = acc;
    }
    Cta<NCTA>::arrive();
    if (tid < S::DL) {  // d_gates between the barrier's halves: the barrier does not wait for them
#pragma unroll
      for (int q = 0; q < 4; ++q) d_gates[at(t, 4 * D) + q * D + d0 + tid] = dg[q * S::DL + tid];
    }
    Cta<NCTA>::wait();
    if (tid < S::DL) {  // d_pre = dz · lecun_tanh'(pre), lecun_tanh' = A·B·(1 − (z/A)²)
      float dz = 0.f;
#pragma unroll
      for (int k = 0; k < 2 * NCTA; ++k) dz += xbuf[k * S::DL + tid];
      const float zn = zz * (1.f / kLecunA);
      const float v = dz * (kLecunA * kLecunB) * (1.f - zn * zn);
      dp[tid] = v;
    }
    __syncthreads();
    {  // partial dh[d] = Σ_{owned units u} W_rec[u, d]·d_pre[u], sent to the block that owns d
      const float acc = dot4<S::C4>([&](int i) { return wr[i]; }, dp + sb * S::C4, 0.f);
      const int owner = ob / S::DL;
      Cta<NCTA>::map(ybuf, owner)[(rank * 2 + sb) * S::DL + ob % S::DL] = acc;
    }
    Cta<NCTA>::arrive();
    if (tid < S::DL) d_pre[at(t, D) + d0 + tid] = dp[tid];  // between the barrier's halves, as d_gates
    Cta<NCTA>::wait();
    if (tid < S::DL) {
      float dh = 0.f;
#pragma unroll
      for (int k = 0; k < 2 * NCTA; ++k) dh += ybuf[k * S::DL + tid];
      carry = dh;
    }
  }
  if (tid < S::DL) d_h0[static_cast<size_t>(b) * D + d0 + tid] = carry;
}

// ---------------------------------------------------------------------------------------------------
// Host side.

// Error messages are built as one std::string and raised before any tensor or guard is alive: streaming
// other types into TORCH_CHECK from this nvcc-compiled host code crashed the process on torch 2.11.

enum class CfcPath { kAuto, kCluster, kPortable };

// PERCEPTION_CFC_PATH = auto (cluster where it can run) | cluster | portable.
CfcPath requested_path() {
  const char* env = std::getenv("PERCEPTION_CFC_PATH");
  const std::string path = env ? env : "auto";
  if (path == "auto") return CfcPath::kAuto;
  if (path == "cluster") return CfcPath::kCluster;
  if (path == "portable") return CfcPath::kPortable;
  TORCH_CHECK(false, "PERCEPTION_CFC_PATH=" + path + ": expected one of auto, cluster, portable");
  return CfcPath::kAuto;  // unreachable
}

void check_width(int64_t D) {
  TORCH_CHECK(kernel_width_ok(D), std::string("cfc_scan kernels support D = U in ") + kKernelWidths + ", got D = " +
                                      std::to_string(D) + "; use model.ops=ref for other sizes");
}

bool use_cluster(const void* kernel, size_t smem_bytes, CfcPath path) {
  if (path == CfcPath::kPortable) return false;
  int dev = 0, major = 0, minor = 0, smem_optin = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes attr{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const bool ok = major >= 9 && attr.binaryVersion >= 90 && static_cast<size_t>(smem_optin) >= smem_bytes;
  TORCH_CHECK(ok || path != CfcPath::kCluster,
              "PERCEPTION_CFC_PATH=cluster needs an sm_90 GPU and a library built for sm_90 with " +
                  std::to_string(smem_bytes) + " bytes of shared memory per block; this is sm_" +
                  std::to_string(major * 10 + minor) + " (kernel binary sm_" + std::to_string(attr.binaryVersion) +
                  ", " + std::to_string(smem_optin) + " bytes)");
  return ok;
}

template <int D>
void fwd_dispatch(const at::Tensor& x, const at::Tensor& ts, const at::Tensor& h0, const at::Tensor& w_rec,
                  const at::Tensor& w_out, const at::Tensor& b_out, at::Tensor& h_seq, CfcPath path) {
  const int B = x.size(0), K = x.size(1);
  constexpr size_t smem2 = Shape<D, 2>::fwd_smem_floats * sizeof(float);
  if (use_cluster(reinterpret_cast<const void*>(&cfc_scan_fwd_cluster<D>), smem2, path)) {
    launch(&cfc_scan_fwd_cluster<D>, 2, B, 2 * D, smem2, x.data_ptr<float>(), ts.data_ptr<float>(),
           h0.data_ptr<float>(), w_rec.data_ptr<float>(), w_out.data_ptr<float>(), b_out.data_ptr<float>(),
           h_seq.data_ptr<float>(), K);
  } else {
    const at::Tensor w_out_t = w_out.t().contiguous();  // (D, 4D): coalesced per-step reads
    constexpr size_t smem1 = Shape<D, 1>::fwd_smem_floats * sizeof(float);
    launch(&cfc_scan_fwd<D>, 1, B, 2 * D, smem1, x.data_ptr<float>(), ts.data_ptr<float>(), h0.data_ptr<float>(),
           w_rec.data_ptr<float>(), w_out_t.data_ptr<float>(), b_out.data_ptr<float>(), h_seq.data_ptr<float>(), K);
  }
}

template <int D>
void bwd_dispatch(const at::Tensor& grad_h, const at::Tensor& gates, const at::Tensor& z, const at::Tensor& ts,
                  const at::Tensor& w_rec, const at::Tensor& w_out, at::Tensor& d_pre, at::Tensor& d_gates,
                  at::Tensor& d_h0, CfcPath path) {
  const int B = grad_h.size(0), K = grad_h.size(1);
  constexpr size_t smem2 = Shape<D, 2>::bwd_smem_floats * sizeof(float);
  const bool cluster = use_cluster(reinterpret_cast<const void*>(&cfc_scan_bwd<D, 2>), smem2, path);
  auto kernel = cluster ? &cfc_scan_bwd<D, 2> : &cfc_scan_bwd<D, 1>;
  const size_t smem = cluster ? smem2 : Shape<D, 1>::bwd_smem_floats * sizeof(float);
  launch(kernel, cluster ? 2 : 1, B, 2 * D, smem, grad_h.data_ptr<float>(), gates.data_ptr<float>(),
         z.data_ptr<float>(), ts.data_ptr<float>(), w_rec.data_ptr<float>(), w_out.data_ptr<float>(),
         d_pre.data_ptr<float>(), d_gates.data_ptr<float>(), d_h0.data_ptr<float>(), K);
}

std::string device_str(const at::Tensor& t) {
  return t.is_cuda() ? "cuda:" + std::to_string(t.get_device()) : std::string(c10::DeviceTypeName(t.device().type(), true));
}

// Messages are built from plain strings and integers only.
void check(const at::Tensor& t, const char* name, std::vector<int64_t> shape, const at::Tensor& like) {
  const std::string where = device_str(like), got = device_str(t);
  TORCH_CHECK(t.is_cuda() && t.get_device() == like.get_device(), std::string("cfc_scan: ") + name + " must be on " + where + ", got " + got);
  TORCH_CHECK(t.scalar_type() == at::kFloat, std::string("cfc_scan: ") + name + " must be float32, got " + c10::toString(t.scalar_type()));
  const std::string want = perception_msg::shape(shape), have = perception_msg::shape(t.sizes());
  TORCH_CHECK(want == have, std::string("cfc_scan: ") + name + " must have shape " + want + ", got " + have);
}

at::Tensor cfc_scan_cuda(const at::Tensor& x_proj, const at::Tensor& ts, const at::Tensor& h0,
                         const at::Tensor& w_rec, const at::Tensor& w_out, const at::Tensor& b_out) {
  TORCH_CHECK(x_proj.dim() == 3, "cfc_scan: x_proj must be (B, K, U), got " + perception_msg::shape(x_proj.sizes()));
  const int64_t B = x_proj.size(0), K = x_proj.size(1), D = x_proj.size(2);
  check(x_proj, "x_proj", {B, K, D}, x_proj);
  check(ts, "ts", {B, K}, x_proj);
  check(h0, "h0", {B, D}, x_proj);
  check(w_rec, "w_rec", {D, D}, x_proj);
  check(w_out, "w_out", {4 * D, D}, x_proj);
  check(b_out, "b_out", {4 * D}, x_proj);
  check_width(D);
  const CfcPath path = requested_path();
  const c10::cuda::CUDAGuard guard(x_proj.device());
  auto h_seq = at::empty({B, K, D}, x_proj.options());
  poison_if_asked(h_seq);
  if (B == 0 || K == 0) return h_seq;
  const auto x = x_proj.contiguous(), t = ts.contiguous(), h = h0.contiguous();
  const auto wr = w_rec.contiguous(), wo = w_out.contiguous(), bo = b_out.contiguous();
  PERCEPTION_DISPATCH_WIDTH(D, fwd_dispatch<kD>(x, t, h, wr, wo, bo, h_seq, path));
  return h_seq;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cfc_scan_bwd_cuda(const at::Tensor& grad_h, const at::Tensor& gates,
                                                                 const at::Tensor& z, const at::Tensor& ts,
                                                                 const at::Tensor& w_rec, const at::Tensor& w_out) {
  TORCH_CHECK(grad_h.dim() == 3, "cfc_scan_bwd: grad_h must be (B, K, D), got " + perception_msg::shape(grad_h.sizes()));
  const int64_t B = grad_h.size(0), K = grad_h.size(1), D = grad_h.size(2);
  check(grad_h, "grad_h", {B, K, D}, grad_h);
  check(gates, "gates", {B, K, 4 * D}, grad_h);
  check(z, "z", {B, K, D}, grad_h);
  check(ts, "ts", {B, K}, grad_h);
  check(w_rec, "w_rec", {D, D}, grad_h);
  check(w_out, "w_out", {4 * D, D}, grad_h);
  check_width(D);
  const CfcPath path = requested_path();
  const c10::cuda::CUDAGuard guard(grad_h.device());
  auto d_pre = at::empty({B, K, D}, grad_h.options());
  auto d_gates = at::empty({B, K, 4 * D}, grad_h.options());
  auto d_h0 = at::empty({B, D}, grad_h.options());
  poison_if_asked(d_pre);
  poison_if_asked(d_gates);
  poison_if_asked(d_h0);
  if (B == 0 || K == 0) return {d_pre, d_gates, d_h0.zero_()};  // K = 0: h0 reaches no output
  const auto gh = grad_h.contiguous(), gt = gates.contiguous(), zz = z.contiguous(), t = ts.contiguous();
  const auto wr = w_rec.contiguous(), wo = w_out.contiguous();
  PERCEPTION_DISPATCH_WIDTH(D, bwd_dispatch<kD>(gh, gt, zz, t, wr, wo, d_pre, d_gates, d_h0, path));
  return {d_pre, d_gates, d_h0};
}

// What one block of each portable kernel needs at width D, as built for this GPU: shared memory (static +
// dynamic) and registers, forward then backward, and the threads per block. The portable path is the one an
// sm_89 GPU (the L40S) runs: a test holds these to sm_89's limits, 99 KiB of shared memory and 64 K registers
// per block, whatever GPU builds them.
std::vector<int64_t> cfc_portable_resources(int64_t D) {
  check_width(D);
  std::vector<int64_t> out;
  PERCEPTION_DISPATCH_WIDTH(D, {
    cudaFuncAttributes fwd{}, bwd{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&fwd, reinterpret_cast<const void*>(&cfc_scan_fwd<kD>)));
    C10_CUDA_CHECK(cudaFuncGetAttributes(&bwd, reinterpret_cast<const void*>(&cfc_scan_bwd<kD, 1>)));
    out = {static_cast<int64_t>(fwd.sharedSizeBytes + Shape<kD, 1>::fwd_smem_floats * sizeof(float)),
           static_cast<int64_t>(bwd.sharedSizeBytes + Shape<kD, 1>::bwd_smem_floats * sizeof(float)),
           fwd.numRegs, bwd.numRegs, Shape<kD, 1>::T};
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(perception, CUDA, m) {
  m.impl("cfc_scan", &cfc_scan_cuda);
  m.impl("cfc_scan_bwd", &cfc_scan_bwd_cuda);
}

// Not an op on tensors, so its schema comes with its function (dispatched catch-all, no tensor to pick a key):
// (int) -> [fwd shared bytes, bwd shared bytes, fwd registers, bwd registers, threads per block]
TORCH_LIBRARY_FRAGMENT(perception, m) { m.def("cfc_portable_resources(int D) -> int[]", &cfc_portable_resources); }
