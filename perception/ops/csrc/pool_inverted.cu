// Inverted (cross-variate) pool, DESIGN §3: X = LNb^T (B, D, K), s = X X^T / sqrt(K), a = softmax_j(s),
// inv = a @ mean_k X. Backward: d_s[h,j] = g[h] a[h,j] (m[j] - inv[h]), d_m[j] = sum_h a[h,j] g[h],
// d_LNb[k,:] = LNb[k,:] @ (d_s + d_s^T) / sqrt(K) + d_m / K.
// The two GEMMs (Gram forward, (K,D)x(D,D) backward) are our own kernels: cuBLAS would honour a global
// TF32 switch and leaves the Gram's split-K order to its heuristics, while these keep fp32 accuracy and a
// fixed summation order. Default: tensor cores (mma.sync TF32, sm_80+) with the 3xTF32 split x = big + small,
// x*y ~= big*big' + big*small' + small*big', summed in short fp32 chunks. PERCEPTION_INVERTED_SIMT=1 selects
// the fp32 SIMT kernels instead (read per call). fp32; D in {16, 32, 64, 128}.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common.cuh"
#include "messages.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

using namespace perception_common;

constexpr int kThreads = 256;  // 16 x 16 threads, each a TM x TM (D = 16 TM) micro-tile
constexpr int kGramRows = 16;  // K rows per Gram step
constexpr int kGemmRows = 128; // K rows per backward block (8 per thread)
constexpr int kGemmInner = 16; // inner (channel) step of the backward GEMM

// Micro-tile element i of thread t: float4 groups 16 apart (bank-conflict-free reads) once TM >= 4.
template <int TM>
__device__ __forceinline__ int tile_index(int t, int i) {
  if constexpr (TM >= 4) {
    return (t + 16 * (i / 4)) * 4 + (i % 4);
  } else {
    return t + 16 * i;
  }
}

// K splits of the Gram from the shapes only (about 528 blocks: 4 per SM on a 132-SM GPU).
int gram_rows_per_split(int64_t B, int64_t K) {
  const int64_t steps = (K + kGramRows - 1) / kGramRows;
  const int64_t want = std::min(steps, std::max<int64_t>(1, (528 + B - 1) / B));
  return static_cast<int>((steps + want - 1) / want * kGramRows);
}

// Gram partials: grid (S, B), 256 threads. Block (s, b) sums X X^T and the channel sums over its K range.
// Bytes: reads LNb once (B*K*D*4); writes (B, S, D, D+1) partials. Deterministic: fixed row order per
// thread; splits are combined in order by inverted_pool_softmax.
template <int NV>
__global__ void __launch_bounds__(kThreads) inverted_pool_gram(const float* __restrict__ lnb,  // (B, K, D)
                                                              float* __restrict__ part_g,     // (B, S, D, D)
                                                              float* __restrict__ part_sum,   // (B, S, D)
                                                              int K, int rows_per_split) {
  constexpr int D = 16 * NV, TM = NV;
  __shared__ __align__(16) float xs[kGramRows][D];
  const int b = blockIdx.y, split = blockIdx.x, S = gridDim.x, tid = threadIdx.x;
  const int ty = tid / 16, tx = tid % 16;
  const int k_begin = split * rows_per_split, k_end = min(K, k_begin + rows_per_split);
  const float* x_b = lnb + static_cast<size_t>(b) * K * D;
  float acc[TM][TM] = {};
  float cs[TM] = {};
  for (int k0 = k_begin; k0 < k_end; k0 += kGramRows) {
    for (int f = tid; f < kGramRows * D / 4; f += kThreads) {
      const int row = f / (D / 4), c4 = f % (D / 4), k = k0 + row;
      const float4 v = k < k_end ? __ldg(reinterpret_cast<const float4*>(x_b + static_cast<size_t>(k) * D) + c4)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(&xs[row][c4 * 4]) = v;
    }
    __syncthreads();
    // Two-level sum (16 rows, then the running total) keeps the fp32 error of K ~ 6000-term dot
    // products at eager cuBLAS's level; one running sum over a whole split was 4x worse.
    float step[TM][TM] = {};
    float step_cs[TM] = {};
#pragma unroll 4
    for (int kk = 0; kk < kGramRows; ++kk) {
      float av[TM], bv[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = xs[kk][tile_index<TM>(ty, i)], bv[i] = xs[kk][tile_index<TM>(tx, i)];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TM; ++j) step[i][j] = fmaf(av[i], bv[j], step[i][j]);
      if (ty == 0) {
#pragma unroll
        for (int j = 0; j < TM; ++j) step_cs[j] += bv[j];
      }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      cs[i] += step_cs[i];
#pragma unroll
      for (int j = 0; j < TM; ++j) acc[i][j] += step[i][j];
    }
    __syncthreads();
  }
  float* g_out = part_g + (static_cast<size_t>(b) * S + split) * D * D;
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j) g_out[tile_index<TM>(ty, i) * D + tile_index<TM>(tx, j)] = acc[i][j];
  if (ty == 0) {
#pragma unroll
    for (int j = 0; j < TM; ++j) part_sum[(static_cast<size_t>(b) * S + split) * D + tile_index<TM>(tx, j)] = cs[j];
  }
}

// Combine the splits in order, softmax over channels, pool the means: grid (B, ceil(D/8)), warp per row h.
// Bytes: reads (S, D+1) partials per row; writes attn (B, D, D), mean (B, D), inv (B, D).
template <int D>
__global__ void inverted_pool_softmax(const float* __restrict__ part_g, const float* __restrict__ part_sum,
                                      float* __restrict__ attn, float* __restrict__ mean, float* __restrict__ inv,
                                      int S, int K) {
  constexpr int C = (D + 31) / 32;
  const int b = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y * 8 + w;
  if (h >= D) return;
  const float inv_sqrt_k = 1.f / sqrtf(static_cast<float>(K));
  float m[C], sc[C];
  float mx = -INFINITY;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int j = lane + 32 * c;
    float tm = 0.f, ts = 0.f;
    if (j < D) {
      for (int s = 0; s < S; ++s) {
        const size_t base = static_cast<size_t>(b) * S + s;
        tm += part_sum[base * D + j];
        ts += part_g[(base * D + h) * D + j];
      }
    }
    m[c] = tm / static_cast<float>(K);  // as torch.mean: divide, not multiply by a rounded 1/K
    sc[c] = j < D ? ts * inv_sqrt_k : -INFINITY;
    mx = fmaxf(mx, sc[c]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float den = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    sc[c] = lane + 32 * c < D ? expf(sc[c] - mx) : 0.f;
    den += sc[c];
  }
  for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
  float t = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int j = lane + 32 * c;
    if (j < D) {
      const float a = sc[c] / den;
      attn[(static_cast<size_t>(b) * D + h) * D + j] = a;
      t = fmaf(a, m[c], t);
      if (h == 0) mean[static_cast<size_t>(b) * D + j] = m[c];
    }
  }
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  if (lane == 0) inv[static_cast<size_t>(b) * D + h] = t;
}

// Backward prep: grid ((D/16)^2, B), 256 threads, one element per thread. Block (tile, b) writes the
// 16 x 16 tile (j0.., d0..) of sym[b] = (d_s + d_s^T) / sqrt(K), reading attn's tile and its transpose
// tile (the latter through shared memory, so both reads are coalesced); blocks of the first tile row also
// write dm[b] = d_m / K for their 16 columns. Bytes: reads attn twice (B*D*D*4*2); writes B*D*(D+1)*4.
// One writer per element; dm's sums run in a fixed order (16 strided partials, then in index order).
__global__ void __launch_bounds__(256) inverted_pool_bwd_prep(const float* __restrict__ g,
                                                              const float* __restrict__ attn,
                                                              const float* __restrict__ mean,
                                                              const float* __restrict__ inv, float* __restrict__ sym,
                                                              float* __restrict__ dm, int D, int K) {
  __shared__ float at[16][17];  // at[c][r] = attn[b, d0 + c, j0 + r]
  __shared__ float part[16][17];
  const int b = blockIdx.y, tiles = D / 16, j0 = (blockIdx.x / tiles) * 16, d0 = (blockIdx.x % tiles) * 16;
  const int r = threadIdx.x / 16, c = threadIdx.x % 16;
  const float* a = attn + static_cast<size_t>(b) * D * D;
  const float* gb = g + static_cast<size_t>(b) * D;
  const float* mb = mean + static_cast<size_t>(b) * D;
  const float* ib = inv + static_cast<size_t>(b) * D;
  const float inv_sqrt_k = 1.f / sqrtf(static_cast<float>(K)), inv_k = 1.f / static_cast<float>(K);
  at[r][c] = a[(d0 + r) * D + j0 + c];
  __syncthreads();
  const int j = j0 + r, d = d0 + c;
  const float ds_jd = gb[j] * a[j * D + d] * (mb[d] - ib[j]);
  const float ds_dj = gb[d] * at[c][r] * (mb[j] - ib[d]);
  sym[static_cast<size_t>(b) * D * D + j * D + d] = (ds_jd + ds_dj) * inv_sqrt_k;
  if (j0 == 0) {  // dm[d] = sum_h a[h, d] g[h]: thread (r, c) sums h = r, r + 16, ...
    float t = 0.f;
    for (int h = r; h < D; h += 16) t = fmaf(a[h * D + d], gb[h], t);
    part[r][c] = t;
    __syncthreads();
    if (r == 0) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) s += part[i][c];
      dm[static_cast<size_t>(b) * D + d] = s * inv_k;
    }
  }
}

// Backward GEMM: d_LNb[b, k, :] = LNb[b, k, :] @ sym[b] + dm[b]. Grid (ceil(K/128), B), 256 threads,
// each 8 rows x TN columns. Bytes: reads LNb once, writes d_LNb once (2*B*K*D*4) plus sym per block.
// One writer per output element, fixed inner order: deterministic.
template <int NV>
__global__ void __launch_bounds__(kThreads) inverted_pool_bwd_gemm(const float* __restrict__ lnb,
                                                                  const float* __restrict__ sym,
                                                                  const float* __restrict__ dm,
                                                                  float* __restrict__ d_lnb, int K) {
  constexpr int D = 16 * NV, TN = NV, TR = kGemmRows / 16;
  __shared__ float xT[kGemmInner][kGemmRows + 4];
  __shared__ __align__(16) float ss[kGemmInner][D];
  const int b = blockIdx.y, k0 = blockIdx.x * kGemmRows, tid = threadIdx.x;
  const int ty = tid / 16, tx = tid % 16;
  const float* x_b = lnb + static_cast<size_t>(b) * K * D;
  const float* s_b = sym + static_cast<size_t>(b) * D * D;
  float acc[TR][TN] = {};
  for (int j0 = 0; j0 < D; j0 += kGemmInner) {
    for (int f = tid; f < kGemmRows * kGemmInner / 4; f += kThreads) {
      const int r = f / (kGemmInner / 4), c4 = f % (kGemmInner / 4), k = k0 + r;
      const float4 v = k < K ? __ldg(reinterpret_cast<const float4*>(x_b + static_cast<size_t>(k) * D + j0) + c4)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
      xT[c4 * 4 + 0][r] = v.x;
      xT[c4 * 4 + 1][r] = v.y;
      xT[c4 * 4 + 2][r] = v.z;
      xT[c4 * 4 + 3][r] = v.w;
    }
    for (int f = tid; f < kGemmInner * D / 4; f += kThreads) {
      const int jj = f / (D / 4), c4 = f % (D / 4);
      *reinterpret_cast<float4*>(&ss[jj][c4 * 4]) =
          __ldg(reinterpret_cast<const float4*>(s_b + static_cast<size_t>(j0 + jj) * D) + c4);
    }
    __syncthreads();
#pragma unroll 4
    for (int jj = 0; jj < kGemmInner; ++jj) {
      float av[TR], bv[TN];
#pragma unroll
      for (int i = 0; i < TR; ++i) av[i] = xT[jj][ty + 16 * i];
#pragma unroll
      for (int c = 0; c < TN; ++c) bv[c] = ss[jj][tile_index<TN>(tx, c)];
#pragma unroll
      for (int i = 0; i < TR; ++i)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[i][c] = fmaf(av[i], bv[c], acc[i][c]);
    }
    __syncthreads();
  }
  float dmv[TN];
#pragma unroll
  for (int c = 0; c < TN; ++c) dmv[c] = dm[static_cast<size_t>(b) * D + tile_index<TN>(tx, c)];
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int k = k0 + ty + 16 * i;
    if (k < K) {
      float* out = d_lnb + (static_cast<size_t>(b) * K + k) * D;
#pragma unroll
      for (int c = 0; c < TN; ++c) out[tile_index<TN>(tx, c)] = acc[i][c] + dmv[c];
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Tensor-core path: mma.sync.m16n8k8 TF32 (sm_80+, so sm_89 and sm_90 alike). Fragments, with
// g = lane / 4 and t = lane % 4: A (16x8, row) a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4);
// B (8x8, col) b0 (k=t, n=g) b1 (k=t+4, n=g); C (16x8) c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1).
// The tensor core truncates as it accumulates, so each chain is kept short (3-6 mma) and then added into
// fp32 running sums with round-to-nearest; the small*big terms go first so the big*big sum rounds last.

constexpr int kTcStageRows = 64;  // LNb rows per Gram pipeline stage (8 k-steps)
constexpr int kTcGemmRows = 128;  // LNb rows per backward block

// TF32 conversion and mma need sm_80 (as cp.async, common.cuh); a build that also targets older GPUs compiles
// them as traps there, and the host never launches the tensor-core kernels on such a GPU (use_simt).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define PERCEPTION_INV_NO_TF32 1
#endif

// x = big + small, both TF32 (x - big is exact in fp32); the pair carries 22 of fp32's 24 bits.
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
#ifdef PERCEPTION_INV_NO_TF32
  big = small = 0u;
  __trap();
#else
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(big) : "f"(x));
  const float rest = x - __uint_as_float(big);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(small) : "f"(rest));
#endif
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef PERCEPTION_INV_NO_TF32
  __trap();
#else
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// d += A B in 3xTF32 for one 16x8x8 step, small terms first.
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const uint32_t (&a_big)[4], const uint32_t (&a_small)[4],
                                           const uint32_t (&b_big)[2], const uint32_t (&b_small)[2]) {
  mma_tf32(d, a_small, b_big[0], b_big[1]);
  mma_tf32(d, a_big, b_small[0], b_small[1]);
  mma_tf32(d, a_big, b_big[0], b_big[1]);
}

// Gram warp layout: WK groups of warps split each stage's k-steps, each group tiles the (D, D) output
// WM x WN, a warp MT 16-row x NT 8-column mma tiles. Small D has too few tiles for 8 warps, so it splits k.
template <int D> struct GramTc;
template <> struct GramTc<128> { static constexpr int WK = 1, WM = 2, WN = 4, MT = 4, NT = 4; };
template <> struct GramTc<64> { static constexpr int WK = 2, WM = 2, WN = 2, MT = 2, NT = 4; };
template <> struct GramTc<32> { static constexpr int WK = 8, WM = 1, WN = 1, MT = 2, NT = 4; };
template <> struct GramTc<16> { static constexpr int WK = 8, WM = 1, WN = 1, MT = 1, NT = 2; };

template <int D>
constexpr size_t gram_tc_smem_bytes() {
  using C = GramTc<D>;
  constexpr size_t stages = 2 * kTcStageRows * (D + 8), reduce = (C::WK - 1) * D * D;  // floats
  return 4 * (stages > reduce ? stages : reduce);
}

// K splits of the tensor-core Gram from the shapes only: about 256 blocks of one per SM, 64-row stages.
int gram_tc_rows_per_split(int64_t B, int64_t K) {
  const int64_t stages = (K + kTcStageRows - 1) / kTcStageRows;
  const int64_t want = std::min(stages, std::max<int64_t>(1, (256 + B - 1) / B));
  return static_cast<int>((stages + want - 1) / want * kTcStageRows);
}

// Gram partials on tensor cores: grid (S, B), 256 threads, dynamic smem gram_tc_smem_bytes<D>().
// Block (s, b) sums X X^T and the channel sums over its K range, in 64-row stages loaded by cp.async
// (double-buffered, rows past the range zero-filled). Bytes: reads LNb once (B*K*D*4); writes (B, S, D, D+1)
// partials. Deterministic: every output has one owner thread and a fixed order (16-row mma chunks, then the
// running sum; k-groups and thread groups combined in index order; splits in order by inverted_pool_softmax).
template <int D>
__global__ void __launch_bounds__(kThreads, 1) inverted_pool_gram_tc(const float* __restrict__ lnb,  // (B, K, D)
                                                                    float* __restrict__ part_g,  // (B, S, D, D)
                                                                    float* __restrict__ part_sum,  // (B, S, D)
                                                                    int K, int rows_per_split) {
  using C = GramTc<D>;
  constexpr int WK = C::WK, WM = C::WM, WN = C::WN, MT = C::MT, NT = C::NT;
  static_assert(WK * WM * WN * 32 == kThreads && WM * MT * 16 == D && WN * NT * 8 == D, "Gram warp tiling");
  constexpr int P = D + 8;                      // row pitch: fragment reads hit 32 distinct banks
  constexpr int kStage = kTcStageRows * P;      // floats per stage
  constexpr int kSteps = kTcStageRows / 8 / WK; // this warp's k-steps per stage
  constexpr int CK = kSteps < 2 ? kSteps : 2;   // k-steps per mma chain (16 rows)
  constexpr int G = kThreads / D;               // thread groups of the channel sums
  extern __shared__ __align__(16) float smem[];  // 2 x (64, P) stages; after the loop, the k-group partials
  __shared__ float cs_red[kThreads];
  const int b = blockIdx.y, split = blockIdx.x, S = gridDim.x, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int kg = warp / (WM * WN), wt = warp % (WM * WN);
  const int h0 = (wt / WN) * MT * 16, j0 = (wt % WN) * NT * 8;
  const int k_begin = split * rows_per_split, k_end = min(K, k_begin + rows_per_split);
  const int n_stages = (k_end - k_begin + kTcStageRows - 1) / kTcStageRows;
  const float* x_b = lnb + static_cast<size_t>(b) * K * D;

  auto load_stage = [&](int st) {
    float* dst = smem + (st & 1) * kStage;
    const int r0 = k_begin + st * kTcStageRows;
    for (int f = tid; f < kTcStageRows * D / 4; f += kThreads) {
      const int row = f / (D / 4), c4 = f % (D / 4), k = r0 + row;
      const bool in = k < k_end;
      cp_async16(dst + row * P + c4 * 4, x_b + static_cast<size_t>(in ? k : k_begin) * D + c4 * 4, in ? 16 : 0);
    }
    cp_async_commit();
  };

  float run[MT][NT][4] = {};
  float cs_run = 0.f;
  const int cs_col = tid % D, cs_grp = tid / D;
  load_stage(0);
  for (int st = 0; st < n_stages; ++st) {
    if (st + 1 < n_stages) {
      load_stage(st + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* xs = smem + (st & 1) * kStage;
    float cs_step = 0.f;  // channel sums: per stage, then the running total (as the Gram)
#pragma unroll
    for (int r = cs_grp; r < kTcStageRows; r += G) cs_step += xs[r * P + cs_col];
    cs_run += cs_step;
#pragma unroll 1
    for (int c = 0; c < kSteps; c += CK) {
      float acc[MT][NT][4] = {};
#pragma unroll
      for (int q = 0; q < CK; ++q) {
        const int kk = (kg + (c + q) * WK) * 8;
        const float* r_lo = xs + (kk + t) * P;  // X rows kk + t and kk + t + 4 of the stage
        const float* r_hi = r_lo + 4 * P;
        uint32_t bb[NT][2], bs[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const int j = j0 + n * 8 + g;
          split_tf32(r_lo[j], bb[n][0], bs[n][0]);
          split_tf32(r_hi[j], bb[n][1], bs[n][1]);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const int h = h0 + m * 16 + g;
          uint32_t ab[4], as[4];
          split_tf32(r_lo[h], ab[0], as[0]);
          split_tf32(r_lo[h + 8], ab[1], as[1]);
          split_tf32(r_hi[h], ab[2], as[2]);
          split_tf32(r_hi[h + 8], ab[3], as[3]);
#pragma unroll
          for (int n = 0; n < NT; ++n) mma_3xtf32(acc[m][n], ab, as, bb[n], bs[n]);
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) run[m][n][i] += acc[m][n][i];
    }
    __syncthreads();  // the buffer is refilled by the next iteration's load
  }

  if constexpr (WK > 1) {  // k-groups 1.. park their sums in fragment order; group 0 adds them in order
    constexpr int kFrag = MT * NT * 4 * 32;
    if (kg > 0) {
      float* red = smem + ((kg - 1) * WM * WN + wt) * kFrag + lane;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[((m * NT + n) * 4 + i) * 32] = run[m][n][i];
    }
    __syncthreads();
    if (kg == 0) {
      for (int o = 1; o < WK; ++o) {
        const float* red = smem + ((o - 1) * WM * WN + wt) * kFrag + lane;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) run[m][n][i] += red[((m * NT + n) * 4 + i) * 32];
      }
    }
  }
  if (kg == 0) {
    float* g_out = part_g + (static_cast<size_t>(b) * S + split) * D * D;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int h = h0 + m * 16 + g, j = j0 + n * 8 + 2 * t;
        *reinterpret_cast<float2*>(g_out + h * D + j) = make_float2(run[m][n][0], run[m][n][1]);
        *reinterpret_cast<float2*>(g_out + (h + 8) * D + j) = make_float2(run[m][n][2], run[m][n][3]);
      }
  }
  cs_red[tid] = cs_run;
  __syncthreads();
  if (tid < D) {
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < G; ++q) s += cs_red[q * D + tid];
    part_sum[(static_cast<size_t>(b) * S + split) * D + tid] = s;
  }
}

// Backward warp layout: 128 rows x D columns per block, WM x WN warps of MT x NT mma tiles; the inner
// (channel) dimension streams through shared memory JC channels at a time.
template <int D> struct GemmTc;
template <> struct GemmTc<128> { static constexpr int WM = 2, WN = 4, MT = 4, NT = 4, JC = 32; };
template <> struct GemmTc<64> { static constexpr int WM = 4, WN = 2, MT = 2, NT = 4, JC = 32; };
template <> struct GemmTc<32> { static constexpr int WM = 8, WN = 1, MT = 1, NT = 4, JC = 32; };
template <> struct GemmTc<16> { static constexpr int WM = 8, WN = 1, MT = 1, NT = 2, JC = 16; };

template <int D>
constexpr size_t gemm_tc_smem_bytes() {
  constexpr int JC = GemmTc<D>::JC;
  return 4 * 2 * (kTcGemmRows * (JC + 4) + JC * (D + 8));
}

// Backward GEMM on tensor cores: d_LNb[b, k, :] = LNb[b, k, :] @ sym[b] + dm[b]. Grid (ceil(K/128), B),
// 256 threads, dynamic smem gemm_tc_smem_bytes<D>(): per JC-channel step an LNb (128, JC) tile and a sym
// (JC, D) tile, cp.async double-buffered, rows past K zero-filled. Bytes: reads LNb once and writes d_LNb
// once (2*B*K*D*4), plus sym (D*D*4, from L2) per block. One writer per output element; each 8-channel
// k-step is a fresh 3-mma chain added into the fp32 sum in channel order: deterministic.
template <int D>
__global__ void __launch_bounds__(kThreads, 2) inverted_pool_bwd_gemm_tc(const float* __restrict__ lnb,  // (B, K, D)
                                                                        const float* __restrict__ sym,  // (B, D, D)
                                                                        const float* __restrict__ dm,   // (B, D)
                                                                        float* __restrict__ d_lnb,      // (B, K, D)
                                                                        int K) {
  using C = GemmTc<D>;
  constexpr int WM = C::WM, WN = C::WN, MT = C::MT, NT = C::NT, JC = C::JC;
  static_assert(WM * WN * 32 == kThreads && WM * MT * 16 == kTcGemmRows && WN * NT * 8 == D, "GEMM warp tiling");
  constexpr int PA = JC + 4;  // LNb tile pitch: A-fragment reads hit 32 distinct banks
  constexpr int PB = D + 8;   // sym tile pitch: B-fragment reads hit 32 distinct banks
  constexpr int kStage = kTcGemmRows * PA + JC * PB;
  extern __shared__ __align__(16) float smem[];  // 2 x [(128, PA) LNb, (JC, PB) sym]
  const int b = blockIdx.y, k0 = blockIdx.x * kTcGemmRows, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int r0 = (warp / WN) * MT * 16, n0 = (warp % WN) * NT * 8;
  const float* x_b = lnb + static_cast<size_t>(b) * K * D;
  const float* s_b = sym + static_cast<size_t>(b) * D * D;

  // Each thread copies fixed 16-byte pieces: LNb rows a_row + i * kARows, sym rows b_row + i * kBRows.
  constexpr int kARows = kThreads / (JC / 4), kBRows = kThreads / (D / 4);
  static_assert(kTcGemmRows % kARows == 0 && (JC % kBRows == 0 || kBRows > JC), "GEMM tile copy");
  const int a_row = tid / (JC / 4), b_row = tid / (D / 4);
  const float* a_src = x_b + static_cast<size_t>(k0 + a_row) * D + (tid % (JC / 4)) * 4;
  const float* b_src = s_b + static_cast<size_t>(b_row) * D + (tid % (D / 4)) * 4;
  const int a_dst = a_row * PA + (tid % (JC / 4)) * 4, b_dst = kTcGemmRows * PA + b_row * PB + (tid % (D / 4)) * 4;
  auto load_stage = [&](int step) {
    float* st = smem + (step & 1) * kStage;
    const int jc0 = step * JC;
#pragma unroll
    for (int i = 0; i < kTcGemmRows / kARows; ++i) {
      const bool in = k0 + a_row + i * kARows < K;  // rows past K: zero-fill from a valid address (sym)
      cp_async16(st + a_dst + i * kARows * PA, in ? a_src + i * kARows * D + jc0 : b_src, in ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < (JC + kBRows - 1) / kBRows; ++i)
      if (kBRows <= JC || b_row < JC) cp_async16(st + b_dst + i * kBRows * PB, b_src + (jc0 + i * kBRows) * D, 16);
    cp_async_commit();
  };

  constexpr int n_steps = D / JC;
  float run[MT][NT][4] = {};
  load_stage(0);
#pragma unroll 1
  for (int step = 0; step < n_steps; ++step) {
    if (step + 1 < n_steps) {
      load_stage(step + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* xa = smem + (step & 1) * kStage + (r0 + g) * PA + t;                     // LNb (row g, ch t)
    const float* xb = smem + (step & 1) * kStage + kTcGemmRows * PA + t * PB + n0 + g;  // sym (ch t, col g)
#pragma unroll 1
    for (int kk = 0; kk < JC; kk += 8) {
      uint32_t bb[NT][2], bs[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        split_tf32(xb[kk * PB + n * 8], bb[n][0], bs[n][0]);
        split_tf32(xb[(kk + 4) * PB + n * 8], bb[n][1], bs[n][1]);
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float* a_lo = xa + m * 16 * PA + kk;  // rows g and g + 8, channels t and t + 4
        const float* a_hi = a_lo + 8 * PA;
        uint32_t ab[4], as[4];
        split_tf32(a_lo[0], ab[0], as[0]);
        split_tf32(a_hi[0], ab[1], as[1]);
        split_tf32(a_lo[4], ab[2], as[2]);
        split_tf32(a_hi[4], ab[3], as[3]);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          float c[4] = {0.f, 0.f, 0.f, 0.f};
          mma_3xtf32(c, ab, as, bb[n], bs[n]);
#pragma unroll
          for (int i = 0; i < 4; ++i) run[m][n][i] += c[i];
        }
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration's load
  }

#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int col = n0 + n * 8 + 2 * t;
    const float2 dmv = *reinterpret_cast<const float2*>(dm + static_cast<size_t>(b) * D + col);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int k = k0 + r0 + m * 16 + g;
      if (k < K)
        *reinterpret_cast<float2*>(d_lnb + (static_cast<size_t>(b) * K + k) * D + col) =
            make_float2(run[m][n][0] + dmv.x, run[m][n][1] + dmv.y);
      if (k + 8 < K)
        *reinterpret_cast<float2*>(d_lnb + (static_cast<size_t>(b) * K + k + 8) * D + col) =
            make_float2(run[m][n][2] + dmv.x, run[m][n][3] + dmv.y);
    }
  }
}

// SIMT kernels when PERCEPTION_INVERTED_SIMT is set (not "0"), or on a GPU without TF32 mma (before sm_80).
bool use_simt() {
  const char* env = std::getenv("PERCEPTION_INVERTED_SIMT");
  if (env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0) return true;
  int dev = 0, major = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major < 8;
}

// Messages are single strings (messages.h says why); each names the argument and what was expected.
void check_lnb(const at::Tensor& lnb, const std::string& op) {
  using namespace perception_msg;
  TORCH_CHECK(lnb.is_cuda(), op + ": lnb must be a CUDA tensor");
  TORCH_CHECK(lnb.scalar_type() == at::kFloat,
              op + ": kernels take float32, got lnb " + dtype(lnb) + " (use model.ops=ref for other dtypes)");
  TORCH_CHECK(lnb.dim() == 3, op + ": lnb must be (B, K, D), got shape " + shape(lnb.sizes()));
  const int64_t D = lnb.size(2);
  TORCH_CHECK(kernel_width_ok(D),
              op + ": kernels take D in " + kKernelWidths + ", got D = " + num(D) + " (use model.ops=ref)");
  TORCH_CHECK(lnb.size(1) >= 1, op + ": K must be >= 1, got lnb " + shape(lnb.sizes()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> inverted_pool_cuda(const at::Tensor& lnb_in) {
  check_lnb(lnb_in, "inverted_pool");
  const c10::cuda::CUDAGuard guard(lnb_in.device());
  const at::Tensor lnb = aligned_contiguous(lnb_in);
  const int64_t B = lnb.size(0), K = lnb.size(1), D = lnb.size(2);
  at::Tensor inv = at::empty({B, D}, lnb.options());
  at::Tensor attn = at::empty({B, D, D}, lnb.options());
  at::Tensor mean = at::empty({B, D}, lnb.options());
  poison_if_asked(inv);
  poison_if_asked(attn);
  poison_if_asked(mean);
  if (B == 0) return {inv, attn, mean};
  const bool simt = use_simt();
  const int rows = simt ? gram_rows_per_split(B, K) : gram_tc_rows_per_split(B, K);
  const int S = static_cast<int>((K + rows - 1) / rows);
  at::Tensor part_g = at::empty({B, S, D, D}, lnb.options());
  at::Tensor part_sum = at::empty({B, S, D}, lnb.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (simt) {
    PERCEPTION_DISPATCH_WIDTH(D, inverted_pool_gram<kD / 16><<<dim3(S, B), kThreads, 0, stream>>>(
                                     lnb.data_ptr<float>(), part_g.data_ptr<float>(), part_sum.data_ptr<float>(),
                                     static_cast<int>(K), rows));
  } else {
    PERCEPTION_DISPATCH_WIDTH(D, {
      constexpr size_t smem = gram_tc_smem_bytes<kD>();
      C10_CUDA_CHECK(cudaFuncSetAttribute(inverted_pool_gram_tc<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
      inverted_pool_gram_tc<kD><<<dim3(S, B), kThreads, smem, stream>>>(
          lnb.data_ptr<float>(), part_g.data_ptr<float>(), part_sum.data_ptr<float>(), static_cast<int>(K), rows);
    });
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const dim3 sgrid(B, (D + 7) / 8);
  PERCEPTION_DISPATCH_WIDTH(D, inverted_pool_softmax<kD><<<sgrid, 256, 0, stream>>>(
                                   part_g.data_ptr<float>(), part_sum.data_ptr<float>(), attn.data_ptr<float>(),
                                   mean.data_ptr<float>(), inv.data_ptr<float>(), S, static_cast<int>(K)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {inv, attn, mean};
}

at::Tensor inverted_pool_bwd_cuda(const at::Tensor& grad_in, const at::Tensor& lnb_in, const at::Tensor& attn_in,
                                  const at::Tensor& mean_in, const at::Tensor& inv_in) {
  check_lnb(lnb_in, "inverted_pool_bwd");
  const int64_t B = lnb_in.size(0), K = lnb_in.size(1), D = lnb_in.size(2);
  {
    using namespace perception_msg;
    TORCH_CHECK(grad_in.dim() == 2 && grad_in.size(0) == B && grad_in.size(1) == D &&
                    grad_in.scalar_type() == at::kFloat,
                "inverted_pool_bwd: grad_inv must be float32 (B, D) = " + shape({B, D}) + ", got " + dtype(grad_in) +
                    " " + shape(grad_in.sizes()));
    TORCH_CHECK(attn_in.dim() == 3 && attn_in.size(0) == B && attn_in.size(1) == D && attn_in.size(2) == D,
                "inverted_pool_bwd: attn must be (B, D, D) = " + shape({B, D, D}) + ", got " + shape(attn_in.sizes()));
    TORCH_CHECK(mean_in.sizes() == grad_in.sizes() && inv_in.sizes() == grad_in.sizes(),
                "inverted_pool_bwd: mean and inv must be (B, D) = " + shape({B, D}) + ", got " +
                    shape(mean_in.sizes()) + " and " + shape(inv_in.sizes()));
    TORCH_CHECK(attn_in.scalar_type() == at::kFloat && mean_in.scalar_type() == at::kFloat &&
                    inv_in.scalar_type() == at::kFloat,
                "inverted_pool_bwd: attn, mean and inv must be float32, got " + dtype(attn_in) + ", " +
                    dtype(mean_in) + " and " + dtype(inv_in));
    TORCH_CHECK(grad_in.is_cuda() && attn_in.is_cuda() && mean_in.is_cuda() && inv_in.is_cuda(),
                "inverted_pool_bwd: grad_inv, attn, mean and inv must be CUDA tensors");
  }
  const c10::cuda::CUDAGuard guard(lnb_in.device());
  const at::Tensor lnb = aligned_contiguous(lnb_in), g = grad_in.contiguous(), attn = attn_in.contiguous();
  const at::Tensor mean = mean_in.contiguous(), inv = inv_in.contiguous();
  at::Tensor d_lnb = at::empty_like(lnb);
  poison_if_asked(d_lnb);
  if (B == 0) return d_lnb;
  at::Tensor sym = at::empty({B, D, D}, lnb.options());
  at::Tensor dm = at::empty({B, D}, lnb.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const dim3 pgrid(static_cast<unsigned>((D / 16) * (D / 16)), static_cast<unsigned>(B));
  inverted_pool_bwd_prep<<<pgrid, 256, 0, stream>>>(g.data_ptr<float>(), attn.data_ptr<float>(),
                                                    mean.data_ptr<float>(), inv.data_ptr<float>(),
                                                    sym.data_ptr<float>(), dm.data_ptr<float>(),
                                                    static_cast<int>(D), static_cast<int>(K));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (use_simt()) {
    const dim3 grid((K + kGemmRows - 1) / kGemmRows, B);
    PERCEPTION_DISPATCH_WIDTH(D, inverted_pool_bwd_gemm<kD / 16><<<grid, kThreads, 0, stream>>>(
                                     lnb.data_ptr<float>(), sym.data_ptr<float>(), dm.data_ptr<float>(),
                                     d_lnb.data_ptr<float>(), static_cast<int>(K)));
  } else {
    const dim3 grid((K + kTcGemmRows - 1) / kTcGemmRows, B);
    PERCEPTION_DISPATCH_WIDTH(D, {
      constexpr size_t smem = gemm_tc_smem_bytes<kD>();
      C10_CUDA_CHECK(cudaFuncSetAttribute(inverted_pool_bwd_gemm_tc<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
      inverted_pool_bwd_gemm_tc<kD><<<grid, kThreads, smem, stream>>>(
          lnb.data_ptr<float>(), sym.data_ptr<float>(), dm.data_ptr<float>(), d_lnb.data_ptr<float>(),
          static_cast<int>(K));
    });
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return d_lnb;
}

}  // namespace

TORCH_LIBRARY_IMPL(perception, CUDA, m) {
  m.impl("inverted_pool", &inverted_pool_cuda);
  m.impl("inverted_pool_bwd", &inverted_pool_bwd_cuda);
}
