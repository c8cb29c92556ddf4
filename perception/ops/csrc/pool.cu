// Attention pool: ctx[b,q,:] = softmax_k(Qw[q] . LNb[b,k,:]) @ LNb[b] and its one-pass backward
// (DESIGN §3, §5). fp32; D in {16, 32, 64, 128}; up to 8 queries per launch (more are split on the host).
//
// Both kernels stream LNb once with no barrier in the main loop. A row is owned by D/8 threads (8 columns
// each, two float4); a row's dot products are summed across those threads with xor shuffles. In the
// forward every row group keeps its own online-softmax state (running max m, sum l, acc[8] per query), so
// nothing waits on the rest of the block until the end; it saves the scores, so the backward computes only
// g . x per row. K is split across blocks by shape alone (never by the GPU), and every cross-group and
// cross-block sum is combined in a fixed order from per-block partials: no atomics, so results are bitwise
// identical run to run.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common.cuh"
#include "messages.h"

namespace {

using namespace perception_common;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxQ = 8;
constexpr int kSplitRows = 64;  // K splits are whole multiples of this
constexpr int kFwdUnroll = 4;   // rows in flight per row group
// The backward's rows reach registers through a ring in shared memory, filled with cp.async: each thread
// copies and later reads only its own slots, so the ring needs no barrier, and most of its kRingRows rows
// per row group stay in flight while one step is computed (the backward's registers go to its 8 * MQ d_Qw
// sums, not to rows in flight). One row per step where queries are many, so two blocks fit per SM without
// spilling. The order in which a row group visits its rows depends on neither constant: no result bit does.
constexpr int kRingRows = 8;
constexpr int kRingBytes = kRingRows * 2 * kThreads * 16;  // 64 KiB per block
template <int MQ>
__host__ __device__ constexpr int bwd_unroll() { return MQ >= 4 ? 1 : 2; }

struct KSplit {
  int splits;
  int rows;  // rows per split, a multiple of kSplitRows; no split is empty
};

// About 512 blocks in all (B = 64: 8 splits of 750 rows, two resident blocks per SM), from the shapes only,
// so every GPU sums in the same order. Fewer, longer blocks amortise each block's final combine.
KSplit split_k(int64_t B, int64_t K) {
  const int64_t tiles = (K + kSplitRows - 1) / kSplitRows;
  const int64_t want = std::min(tiles, std::max<int64_t>(1, (512 + B - 1) / B));
  const int64_t per = (tiles + want - 1) / want;
  return {static_cast<int>((tiles + per - 1) / per), static_cast<int>(per * kSplitRows)};
}

// Row layout: D / 8 threads per row; thread t holds float4 groups t and t + TPR of the row.
template <int NV>
struct Rows {
  static constexpr int D = 16 * NV;
  static constexpr int TPR = D / 8;            // threads per row
  static constexpr int G = kThreads / TPR;     // row groups per block
};

// One thread's share of a row dot product, rounding pinned with explicit intrinsics (no contraction
// choices): the backward's c = sum_d g*ctx at K = 1 runs this same chain on ctx (= x), so it equals the
// row's g.x bit for bit and d_s is exactly 0.
__device__ __forceinline__ float dot8(float4 a0, float4 a1, float4 b0, float4 b1) {
  float t = __fmul_rn(a0.x, b0.x);
  t = __fmaf_rn(a0.y, b0.y, t);
  t = __fmaf_rn(a0.z, b0.z, t);
  t = __fmaf_rn(a0.w, b0.w, t);
  t = __fmaf_rn(a1.x, b1.x, t);
  t = __fmaf_rn(a1.y, b1.y, t);
  t = __fmaf_rn(a1.z, b1.z, t);
  return __fmaf_rn(a1.w, b1.w, t);
}

// Sum over the TPR threads of a row (xor butterfly: every thread ends with the same bits, since a + b == b + a).
template <int TPR>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = 1; o < TPR; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int TPR>
__device__ __forceinline__ double row_sum(double v) {
#pragma unroll
  for (int o = 1; o < TPR; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float4 load_stream(const float4* p) { return __ldcs(p); }

// One thread's private ring: stage s, row u, half h lives at ring[((s * U + u) * 2 + h) * kThreads + tid]
// (consecutive threads, consecutive 16-byte slots: conflict-free). Step i covers the split's rows
// base + u * G + grp with base = k_begin + i * G * U.
template <int G, int TPR, int D, int U>
struct RowRing {
  static constexpr int kStages = kRingRows / U;
  float4* ring;
  const float4* x_b;  // (K, D / 4) of this batch row
  int tid, grp, t, k_end;

  __device__ __forceinline__ float4* slot(int stage, int u, int h) const {
    return ring + ((stage * U + u) * 2 + h) * kThreads + tid;
  }
  // Starts the copies of one step (none past the end); always commits a group, so counts stay aligned.
  __device__ __forceinline__ void issue(int stage, int base) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = base + u * G + grp;
      if (k < k_end) {
        const float4* row = x_b + static_cast<size_t>(k) * (D / 4);
        cp_async16(slot(stage, u, 0), row + t);
        cp_async16(slot(stage, u, 1), row + t + TPR);
      }
    }
    cp_async_commit();
  }
  // Waits for the oldest step in flight and reads it; rows past the end read as zeros.
  __device__ __forceinline__ void read(int stage, int base, float4 (&xv)[U][2]) const {
    cp_async_wait<kStages - 1>();  // groups of steps > this one may still be in flight
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool valid = base + u * G + grp < k_end;
      xv[u][0] = valid ? *slot(stage, u, 0) : zero;
      xv[u][1] = valid ? *slot(stage, u, 1) : zero;
    }
  }
  // Runs step(base, xv) over every step of [k_begin, k_end), kStages - 1 steps ahead of the copies.
  template <class Step>
  __device__ __forceinline__ void for_each_step(int k_begin, Step&& step) const {
    constexpr int STEP = G * U;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s, k_begin + s * STEP);
    int stage = 0;
    for (int base = k_begin; base < k_end; base += STEP) {  // uniform trip count: shuffles stay converged
      // The slot refilled here was read (into registers, and used) in the previous step.
      issue((stage + kStages - 1) % kStages, base + (kStages - 1) * STEP);
      float4 xv[U][2];
      read(stage, base, xv);
      step(base, xv);
      stage = (stage + 1) % kStages;
    }
    cp_async_wait<0>();
  }
};

// exp(m_from - m_to), 0 for an empty state (m_from = -inf); m_to >= m_from.
__device__ __forceinline__ float rescale(float m_from, float m_to) {
  return m_from == -INFINITY ? 0.f : expf(m_from - m_to);
}

// Forward, one block per (K split, b). Grid (S, B), 256 threads, no barrier in the row loop.
// Bytes: reads its LNb rows once (B*K*D*4 in all); writes the scores (B*K*Q*4) and (B, S, nq, D+2) partials.
// Deterministic: fixed rows per thread, fixed-order merges (xor butterfly with the lower lane's state
// first, then warps 0..7 in order).
template <int MQ, int NV>
__global__ void __launch_bounds__(kThreads, (MQ > 5 ? 1 : 2)) attention_pool_fwd(
    const float* __restrict__ lnb,  // (B, K, D)
    const float* __restrict__ q,    // (nq, D), this launch's queries
    float* __restrict__ part_acc,   // (B, S, nq, D): sum_k exp(s - m) * LNb[k, d]
    float* __restrict__ part_ml,    // (B, S, nq, 2): max m, sum_k exp(s - m)
    float* __restrict__ scores,     // (B, K, Q): s, kept for the backward
    int K, int rows_per_split, int nq, int Q, int q0) {
  using L = Rows<NV>;
  constexpr int D = L::D, TPR = L::TPR, G = L::G, U = kFwdUnroll;
  __shared__ __align__(16) float4 qs[MQ][D / 4];
  __shared__ __align__(16) float red_acc[kWarps][MQ][D];
  __shared__ float red_ml[kWarps][MQ][2];

  const int b = blockIdx.y, split = blockIdx.x, S = gridDim.x, tid = threadIdx.x;
  const int t = tid % TPR, grp = tid / TPR, lane = tid & 31, warp = tid >> 5;
  const int k_begin = split * rows_per_split;
  const int k_end = min(K, k_begin + rows_per_split);
  const float4* x_b = reinterpret_cast<const float4*>(lnb + static_cast<size_t>(b) * K * D);

  // Queries past nq are zero: they run (s = 0) but are never written.
  for (int i = tid; i < MQ * D / 4; i += kThreads)
    qs[i / (D / 4)][i % (D / 4)] = i / (D / 4) < nq ? reinterpret_cast<const float4*>(q)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  __syncthreads();

  float m[MQ], l[MQ], acc[MQ][8];
#pragma unroll
  for (int j = 0; j < MQ; ++j) {
    m[j] = -INFINITY, l[j] = 0.f;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[j][c] = 0.f;
  }

  for (int base = k_begin; base < k_end; base += G * U) {  // uniform trip count: shuffles stay converged
    float4 xv[U][2];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = base + u * G + grp;
      valid[u] = k < k_end;
      const float4* row = x_b + static_cast<size_t>(valid[u] ? k : k_begin) * (D / 4);
      xv[u][0] = load_stream(row + t);
      xv[u][1] = load_stream(row + t + TPR);
    }
    float s[U][MQ];  // all reductions first: U * MQ independent shuffle chains
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < MQ; ++j) s[u][j] = row_sum<TPR>(dot8(xv[u][0], xv[u][1], qs[j][t], qs[j][t + TPR]));
    // The row's first thread keeps the scores: the backward then needs no Qw . x of its own (7.7 MB at
    // B = 64, K = 6000, Q = 5, against 197 MB of LNb).
    if (t == 0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = base + u * G + grp;
#pragma unroll
        for (int j = 0; j < MQ; ++j)
          if (j < nq && k < k_end) scores[(static_cast<size_t>(b) * K + k) * Q + q0 + j] = s[u][j];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!valid[u]) continue;
#pragma unroll
      for (int j = 0; j < MQ; ++j) {
        if (s[u][j] > m[j]) {  // a new running max is rare after the first rows (about ln n times)
          const float sc = rescale(m[j], s[u][j]);
          m[j] = s[u][j];
          l[j] *= sc;
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[j][c] *= sc;
        }
        const float p = expf(s[u][j] - m[j]);
        l[j] += p;
        const float* x0 = reinterpret_cast<const float*>(&xv[u][0]);
        const float* x1 = reinterpret_cast<const float*>(&xv[u][1]);
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][c] = fmaf(p, x0[c], acc[j][c]), acc[j][4 + c] = fmaf(p, x1[c], acc[j][4 + c]);
      }
    }
  }

  // Merge the row groups of a warp: xor butterfly over the group bits, lower lane's state first.
#pragma unroll
  for (int o = TPR; o < 32; o <<= 1) {
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int j = 0; j < MQ; ++j) {
      const float m_o = __shfl_xor_sync(0xffffffffu, m[j], o), l_o = __shfl_xor_sync(0xffffffffu, l[j], o);
      const float m_new = fmaxf(m[j], m_o);
      const float sc_me = rescale(m[j], m_new), sc_o = rescale(m_o, m_new);
      const float sc_lo = upper ? sc_o : sc_me, sc_hi = upper ? sc_me : sc_o;
      const float l_lo = upper ? l_o : l[j], l_hi = upper ? l[j] : l_o;
      l[j] = fmaf(l_hi, sc_hi, l_lo * sc_lo);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float a_o = __shfl_xor_sync(0xffffffffu, acc[j][c], o);
        const float a_lo = upper ? a_o : acc[j][c], a_hi = upper ? acc[j][c] : a_o;
        acc[j][c] = fmaf(a_hi, sc_hi, a_lo * sc_lo);
      }
      m[j] = m_new;
    }
  }
  if (lane < TPR) {
#pragma unroll
    for (int j = 0; j < MQ; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) red_acc[warp][j][4 * t + c] = acc[j][c], red_acc[warp][j][4 * (t + TPR) + c] = acc[j][4 + c];
      if (t == 0) red_ml[warp][j][0] = m[j], red_ml[warp][j][1] = l[j];
    }
  }
  __syncthreads();
  // Merge the warps in order 0..7; one thread per (query, column).
  const size_t base_out = (static_cast<size_t>(b) * S + split) * nq;
  for (int i = tid; i < nq * D; i += kThreads) {
    const int j = i / D, col = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_ml[w][j][0]);
    float a = 0.f, lt = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float sc = rescale(red_ml[w][j][0], mx);
      a = fmaf(red_acc[w][j][col], sc, a);
      lt = fmaf(red_ml[w][j][1], sc, lt);
    }
    part_acc[(base_out + j) * D + col] = a;
    if (col == 0) part_ml[(base_out + j) * 2] = mx, part_ml[(base_out + j) * 2 + 1] = lt;
  }
}

// Combine the K splits: one block per (b, q), D threads. Fixed split order.
// Bytes: reads (S, D+2) partials per (b, q); writes ctx (D) and the softmax statistics (max, sum).
__global__ void attention_pool_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                       float* __restrict__ ctx, float* __restrict__ stats, int S, int nq, int D,
                                       int Q, int q0) {
  const int b = blockIdx.x / nq, j = blockIdx.x % nq, d = threadIdx.x;
  float m = -INFINITY;
  for (int s = 0; s < S; ++s) m = fmaxf(m, part_ml[((static_cast<size_t>(b) * S + s) * nq + j) * 2]);
  float l = 0.f, a = 0.f;
  for (int s = 0; s < S; ++s) {
    const size_t base = (static_cast<size_t>(b) * S + s) * nq + j;
    const float w = rescale(part_ml[base * 2], m);
    l = fmaf(part_ml[base * 2 + 1], w, l);
    a = fmaf(part_acc[base * D + d], w, a);
  }
  const size_t out = static_cast<size_t>(b) * Q + q0 + j;
  ctx[out * D + d] = a / l;
  // The max and the sum, not log-sum-exp: an fp32 lse near 10 carries an absolute error of ~5e-7, which
  // would scale every attention weight of the row alike and bias d_Qw by as much.
  if (d == 0) stats[out * 2] = m, stats[out * 2 + 1] = l;
}

// Backward, one block per (K split, b). Grid (S, B), 256 threads, no barrier in the row loop.
//   a = exp(s - m) * (1 / l) with the forward's saved s = Qw.x, d_s = a * (g.x - sum_d g*ctx),
//   d_lnb[k] = sum_q a*g[q] + d_s*Qw[q]  (each row written once by its own threads),
//   d_Qw partials[b, split] = sum_k d_s * x.
// Bytes: reads LNb once and the scores (B*K*Q*4), writes d_LNb once (2*B*K*D*4), plus (B, S, nq, D)
// partials.
// Deterministic: one writer per d_LNb element (accumulate adds the previous query group's value in a
// fixed launch order); d_Qw partials summed over row groups in a fixed order.
template <int MQ, int NV>
__global__ void __launch_bounds__(kThreads, (MQ > 5 ? 1 : 2)) attention_pool_bwd(
    const float* __restrict__ lnb,    // (B, K, D)
    const float* __restrict__ q,      // (nq, D)
    const float* __restrict__ g,      // (B, Q, D) grad of ctx
    const float* __restrict__ ctx,    // (B, Q, D)
    const float* __restrict__ stats,  // (B, Q, 2): softmax max and sum
    const float* __restrict__ scores, // (B, K, Q): s from the forward
    float* __restrict__ d_lnb,        // (B, K, D)
    float* __restrict__ part_dq,      // (B, S, nq, D)
    int K, int rows_per_split, int nq, int Q, int q0, bool accumulate) {
  using L = Rows<NV>;
  constexpr int D = L::D, TPR = L::TPR, G = L::G, U = bwd_unroll<MQ>();
  extern __shared__ float4 ring[];  // kRingBytes; after the row loop, the warps' d_Qw partial sums
  __shared__ __align__(16) float4 qs[MQ][D / 4];
  __shared__ __align__(16) float4 gs[MQ][D / 4];
  auto red = reinterpret_cast<float (*)[MQ][D]>(ring);  // (kWarps, MQ, D)

  const int b = blockIdx.y, split = blockIdx.x, S = gridDim.x, tid = threadIdx.x;
  const int t = tid % TPR, grp = tid / TPR, lane = tid & 31, warp = tid >> 5;
  const int k_begin = split * rows_per_split;
  const int k_end = min(K, k_begin + rows_per_split);
  const size_t x_off = static_cast<size_t>(b) * K * D;
  const float4* x_b = reinterpret_cast<const float4*>(lnb + x_off);
  float4* o_b = reinterpret_cast<float4*>(d_lnb + x_off);
  const size_t qrow = static_cast<size_t>(b) * Q + q0;  // this launch's first (b, q) row of g, ctx, stats

  // Queries past nq get Qw = g = 0: their a*g and d_s*Qw add exact zeros.
  for (int i = tid; i < MQ * D / 4; i += kThreads) {
    const int j = i / (D / 4), f = i % (D / 4);
    const bool live = j < nq;
    qs[j][f] = live ? reinterpret_cast<const float4*>(q)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    gs[j][f] = live ? reinterpret_cast<const float4*>(g + (qrow + j) * D)[f] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();

  // Per query: c = sum_d g*ctx (= sum_k a*d_a), softmax max and sum. K = 1 (a = 1, ctx = x): c runs the
  // rows' own g.x chain, so d_s is exactly 0. K > 1: in fp64, since an error in c shifts every row's d_s
  // alike and does not average out over K in d_Qw.
  float c[MQ], m[MQ], inv_l[MQ];
#pragma unroll
  for (int j = 0; j < MQ; ++j) {
    const bool live = j < nq;
    const float4* crow = reinterpret_cast<const float4*>(ctx + (qrow + (live ? j : 0)) * D);
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 c0 = live ? crow[t] : zero, c1 = live ? crow[t + TPR] : zero;
    const float4 g0 = gs[j][t], g1 = gs[j][t + TPR];
    const float c32 = row_sum<TPR>(dot8(c0, c1, g0, g1));
    double c64 = static_cast<double>(c0.x) * g0.x + static_cast<double>(c0.y) * g0.y +
                 static_cast<double>(c0.z) * g0.z + static_cast<double>(c0.w) * g0.w +
                 static_cast<double>(c1.x) * g1.x + static_cast<double>(c1.y) * g1.y +
                 static_cast<double>(c1.z) * g1.z + static_cast<double>(c1.w) * g1.w;
    c64 = row_sum<TPR>(c64);
    c[j] = K == 1 ? c32 : static_cast<float>(c64);
    m[j] = live ? stats[(qrow + j) * 2] : 0.f;
    inv_l[j] = live ? 1.f / stats[(qrow + j) * 2 + 1] : 1.f;  // a = exp(s - m) * (1 / l): one rounding for all rows
  }

  float dq[MQ][8];
#pragma unroll
  for (int j = 0; j < MQ; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) dq[j][e] = 0.f;

  // A step's saved scores are loaded one step ahead, so their latency hides behind a step's work.
  float s_next[U][MQ];
  auto load_scores = [&](int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = base + u * G + grp;
      const float* s_row = scores + (static_cast<size_t>(b) * K + (k < k_end ? k : k_begin)) * Q + q0;
#pragma unroll
      for (int j = 0; j < MQ; ++j) s_next[u][j] = j < nq && k < k_end ? __ldg(s_row + j) : 0.f;
    }
  };
  load_scores(k_begin);
  auto step = [&](int base, const float4 (&xv)[U][2]) {
    bool valid[U];
    float sx[U][MQ], gx[U][MQ];  // U * MQ independent shuffle chains for g . x
#pragma unroll
    for (int u = 0; u < U; ++u) {
      valid[u] = base + u * G + grp < k_end;
#pragma unroll
      for (int j = 0; j < MQ; ++j) sx[u][j] = s_next[u][j];
    }
    load_scores(base + G * U);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < MQ; ++j) gx[u][j] = row_sum<TPR>(dot8(xv[u][0], xv[u][1], gs[j][t], gs[j][t + TPR]));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = base + u * G + grp;
      float4 o0 = make_float4(0.f, 0.f, 0.f, 0.f), o1 = o0;
      if (accumulate && valid[u]) {
        o0 = o_b[static_cast<size_t>(k) * (D / 4) + t];
        o1 = o_b[static_cast<size_t>(k) * (D / 4) + t + TPR];
      }
      float* op0 = reinterpret_cast<float*>(&o0);
      float* op1 = reinterpret_cast<float*>(&o1);
      const float* x0 = reinterpret_cast<const float*>(&xv[u][0]);
      const float* x1 = reinterpret_cast<const float*>(&xv[u][1]);
#pragma unroll
      for (int j = 0; j < MQ; ++j) {
        const float a = valid[u] ? expf(sx[u][j] - m[j]) * inv_l[j] : 0.f;
        const float ds = a * (gx[u][j] - c[j]);
        const float* g0 = reinterpret_cast<const float*>(&gs[j][t]);
        const float* g1 = reinterpret_cast<const float*>(&gs[j][t + TPR]);
        const float* q0p = reinterpret_cast<const float*>(&qs[j][t]);
        const float* q1p = reinterpret_cast<const float*>(&qs[j][t + TPR]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          op0[e] = fmaf(ds, q0p[e], fmaf(a, g0[e], op0[e]));
          op1[e] = fmaf(ds, q1p[e], fmaf(a, g1[e], op1[e]));
          dq[j][e] = fmaf(ds, x0[e], dq[j][e]);
          dq[j][4 + e] = fmaf(ds, x1[e], dq[j][4 + e]);
        }
      }
      if (valid[u]) {
        __stcs(o_b + static_cast<size_t>(k) * (D / 4) + t, o0);
        __stcs(o_b + static_cast<size_t>(k) * (D / 4) + t + TPR, o1);
      }
    }
  };
  const RowRing<G, TPR, D, U> rows{ring, x_b, tid, grp, t, k_end};
  rows.for_each_step(k_begin, step);

  // d_Qw: the row groups of a warp (xor butterfly, lower lane first), then warps 0..7 in order.
#pragma unroll
  for (int o = TPR; o < 32; o <<= 1) {
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int j = 0; j < MQ; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float v_o = __shfl_xor_sync(0xffffffffu, dq[j][e], o);
        dq[j][e] = upper ? v_o + dq[j][e] : dq[j][e] + v_o;
      }
  }
  __syncthreads();  // every thread is done with its ring slots
  if (lane < TPR) {
#pragma unroll
    for (int j = 0; j < MQ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp][j][4 * t + e] = dq[j][e], red[warp][j][4 * (t + TPR) + e] = dq[j][4 + e];
  }
  __syncthreads();
  const size_t base_out = (static_cast<size_t>(b) * S + split) * nq;
  for (int i = tid; i < nq * D; i += kThreads) {
    const int j = i / D, col = i % D;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w][j][col];
    part_dq[(base_out + j) * D + col] = v;
  }
}

// d_Qw[q0 + j, d] = sum over (b, split) partials: grid (nq, ceil(D/32)), 8 warps; warp w sums partials
// w, w+8, ... in order, then warp 0 adds the 8 warp sums in order. Deterministic, no atomics.
__global__ void attention_pool_reduce_dq(const float* __restrict__ part_dq, float* __restrict__ dq, int n_parts,
                                         int nq, int D, int q0) {
  // fp64 sums: n_parts * D terms per query, negligible work even at sm_89's fp64 rate.
  __shared__ double red[8][32];
  const int j = blockIdx.x, d = blockIdx.y * 32 + (threadIdx.x & 31), w = threadIdx.x >> 5;
  double t = 0.0;
  if (d < D)
    for (int p = w; p < n_parts; p += 8) t += part_dq[(static_cast<size_t>(p) * nq + j) * D + d];
  red[w][threadIdx.x & 31] = t;
  __syncthreads();
  if (w == 0 && d < D) {
    double s = 0.0;
    for (int i = 0; i < 8; ++i) s += red[i][threadIdx.x];
    dq[static_cast<size_t>(q0 + j) * D + d] = static_cast<float>(s);
  }
}

// Query groups run a kernel with exactly their count where it is 1, 2, 4, 5 or 8 (SharedQuery is 1,
// PerHorizon 5); 3, 6 and 7 take the next size up with zero queries in the spare slots.
#define PERCEPTION_DISPATCH_MQ(nq, ...)                      \
  switch (nq) {                                              \
    case 1: { constexpr int MQ = 1; __VA_ARGS__; } break;    \
    case 2: { constexpr int MQ = 2; __VA_ARGS__; } break;    \
    case 3:                                                  \
    case 4: { constexpr int MQ = 4; __VA_ARGS__; } break;    \
    case 5: { constexpr int MQ = 5; __VA_ARGS__; } break;    \
    default: { constexpr int MQ = kMaxQ; __VA_ARGS__; } break; \
  }

// The backward's 64 KiB ring of dynamic shared memory is above the default 48 KiB a launch may ask for.
template <class Kernel>
void allow_ring(Kernel kernel) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes));
}

// Messages are single strings (messages.h says why); each names the argument and what was expected.
void check_pool_inputs(const at::Tensor& lnb, const at::Tensor& q) {
  using namespace perception_msg;
  TORCH_CHECK(lnb.is_cuda() && q.is_cuda(), "attention_pool: lnb and q must be CUDA tensors");
  TORCH_CHECK(lnb.device() == q.device(), "attention_pool: lnb and q must be on one device");
  TORCH_CHECK(lnb.scalar_type() == at::kFloat && q.scalar_type() == at::kFloat,
              "attention_pool: kernels take float32, got lnb " + dtype(lnb) + " and q " + dtype(q) +
                  " (use model.ops=ref for other dtypes)");
  TORCH_CHECK(lnb.dim() == 3, "attention_pool: lnb must be (B, K, D), got shape " + shape(lnb.sizes()));
  TORCH_CHECK(q.dim() == 2 && q.size(1) == lnb.size(2),
              "attention_pool: q must be (Q, D) with D = " + num(lnb.size(2)) + ", got shape " + shape(q.sizes()));
  const int64_t D = lnb.size(2);
  TORCH_CHECK(kernel_width_ok(D), std::string("attention_pool: kernels take D in ") + kKernelWidths + ", got D = " +
                                      num(D) + " (use model.ops=ref)");
  TORCH_CHECK(lnb.size(1) >= 1 && q.size(0) >= 1, "attention_pool: K and Q must be >= 1, got lnb " +
                                                      shape(lnb.sizes()) + " and q " + shape(q.sizes()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_pool_cuda(const at::Tensor& lnb_in, const at::Tensor& q_in) {
  check_pool_inputs(lnb_in, q_in);
  const c10::cuda::CUDAGuard guard(lnb_in.device());
  const at::Tensor lnb = aligned_contiguous(lnb_in), q = aligned_contiguous(q_in);  // float4 loads
  const int64_t B = lnb.size(0), K = lnb.size(1), D = lnb.size(2), Q = q.size(0);
  at::Tensor ctx = at::empty({B, Q, D}, lnb.options());
  at::Tensor stats = at::empty({B, Q, 2}, lnb.options());  // softmax max, sum
  at::Tensor scores = at::empty({B, K, Q}, lnb.options());
  poison_if_asked(ctx);
  poison_if_asked(stats);
  poison_if_asked(scores);
  if (B == 0) return {ctx, stats, scores};
  const KSplit sp = split_k(B, K);
  auto stream = c10::cuda::getCurrentCUDAStream();
  for (int64_t q0 = 0; q0 < Q; q0 += kMaxQ) {  // independent softmaxes: query groups never interact
    const int nq = static_cast<int>(std::min<int64_t>(kMaxQ, Q - q0));
    at::Tensor part_acc = at::empty({B, sp.splits, nq, D}, lnb.options());
    at::Tensor part_ml = at::empty({B, sp.splits, nq, 2}, lnb.options());
    const dim3 grid(sp.splits, B);
    PERCEPTION_DISPATCH_MQ(nq, PERCEPTION_DISPATCH_WIDTH(D, {
      constexpr int NV = kD / 16;
      attention_pool_fwd<MQ, NV><<<grid, kThreads, 0, stream>>>(
          lnb.data_ptr<float>(), q.data_ptr<float>() + q0 * D, part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
          scores.data_ptr<float>(), static_cast<int>(K), sp.rows, nq, static_cast<int>(Q), static_cast<int>(q0));
    }));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    attention_pool_combine<<<B * nq, D, 0, stream>>>(part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
                                                    ctx.data_ptr<float>(), stats.data_ptr<float>(), sp.splits, nq,
                                                    static_cast<int>(D), static_cast<int>(Q), static_cast<int>(q0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {ctx, stats, scores};
}

std::tuple<at::Tensor, at::Tensor> attention_pool_bwd_cuda(const at::Tensor& grad_in, const at::Tensor& lnb_in,
                                                          const at::Tensor& q_in, const at::Tensor& ctx_in,
                                                          const at::Tensor& stats_in, const at::Tensor& scores_in) {
  check_pool_inputs(lnb_in, q_in);
  const int64_t B = lnb_in.size(0), K = lnb_in.size(1), D = lnb_in.size(2), Q = q_in.size(0);
  {
    using namespace perception_msg;
    TORCH_CHECK(grad_in.sizes() == ctx_in.sizes() && ctx_in.dim() == 3 && ctx_in.size(0) == B &&
                    ctx_in.size(1) == Q && ctx_in.size(2) == D,
                "attention_pool_bwd: grad_ctx and ctx must be (B, Q, D) = " + shape({B, Q, D}) + ", got " +
                    shape(grad_in.sizes()) + " and " + shape(ctx_in.sizes()));
    TORCH_CHECK(stats_in.dim() == 3 && stats_in.size(0) == B && stats_in.size(1) == Q && stats_in.size(2) == 2,
                "attention_pool_bwd: stats must be (B, Q, 2) = " + shape({B, Q, 2}) + ", got " +
                    shape(stats_in.sizes()));
    TORCH_CHECK(scores_in.dim() == 3 && scores_in.size(0) == B && scores_in.size(1) == K && scores_in.size(2) == Q,
                "attention_pool_bwd: scores must be (B, K, Q) = " + shape({B, K, Q}) + ", got " +
                    shape(scores_in.sizes()));
    TORCH_CHECK(grad_in.scalar_type() == at::kFloat && ctx_in.scalar_type() == at::kFloat &&
                    stats_in.scalar_type() == at::kFloat && scores_in.scalar_type() == at::kFloat,
                "attention_pool_bwd: grad_ctx, ctx, stats and scores must be float32, got " + dtype(grad_in) + ", " +
                    dtype(ctx_in) + ", " + dtype(stats_in) + " and " + dtype(scores_in));
    TORCH_CHECK(grad_in.is_cuda() && ctx_in.is_cuda() && stats_in.is_cuda() && scores_in.is_cuda() &&
                    grad_in.device() == lnb_in.device() && ctx_in.device() == lnb_in.device() &&
                    stats_in.device() == lnb_in.device() && scores_in.device() == lnb_in.device(),
                "attention_pool_bwd: grad_ctx, ctx, stats and scores must be CUDA tensors on lnb's device");
  }
  const c10::cuda::CUDAGuard guard(lnb_in.device());
  // lnb, q, grad_ctx and ctx are read as float4, stats and scores as floats.
  const at::Tensor lnb = aligned_contiguous(lnb_in), q = aligned_contiguous(q_in), g = aligned_contiguous(grad_in);
  const at::Tensor ctx = aligned_contiguous(ctx_in), stats = stats_in.contiguous(), scores = scores_in.contiguous();
  at::Tensor d_lnb = at::empty_like(lnb);
  at::Tensor d_q = at::empty_like(q);
  poison_if_asked(d_lnb);
  poison_if_asked(d_q);
  if (B == 0) return {d_lnb.zero_(), d_q.zero_()};
  const KSplit sp = split_k(B, K);
  auto stream = c10::cuda::getCurrentCUDAStream();
  for (int64_t q0 = 0; q0 < Q; q0 += kMaxQ) {
    const int nq = static_cast<int>(std::min<int64_t>(kMaxQ, Q - q0));
    at::Tensor part_dq = at::empty({B, sp.splits, nq, D}, lnb.options());
    const dim3 grid(sp.splits, B);
    PERCEPTION_DISPATCH_MQ(nq, PERCEPTION_DISPATCH_WIDTH(D, {
      constexpr int NV = kD / 16;
      const auto kernel = attention_pool_bwd<MQ, NV>;
      allow_ring(kernel);
      kernel<<<grid, kThreads, kRingBytes, stream>>>(
          lnb.data_ptr<float>(), q.data_ptr<float>() + q0 * D, g.data_ptr<float>(), ctx.data_ptr<float>(),
          stats.data_ptr<float>(), scores.data_ptr<float>(), d_lnb.data_ptr<float>(), part_dq.data_ptr<float>(),
          static_cast<int>(K), sp.rows, nq, static_cast<int>(Q), static_cast<int>(q0), q0 > 0);
    }));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const dim3 rgrid(nq, (D + 31) / 32);
    attention_pool_reduce_dq<<<rgrid, 256, 0, stream>>>(part_dq.data_ptr<float>(), d_q.data_ptr<float>(),
                                                        static_cast<int>(B) * sp.splits, nq, static_cast<int>(D),
                                                        static_cast<int>(q0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {d_lnb, d_q};
}

}  // namespace

TORCH_LIBRARY_IMPL(perception, CUDA, m) {
  m.impl("attention_pool", &attention_pool_cuda);
  m.impl("attention_pool_bwd", &attention_pool_bwd_cuda);
}
