// Attention pool: ctx[b,q,:] = softmax_k(Qw[q] . LNb[b,k,:]) @ LNb[b] and its one-pass backward
// (DESIGN §3, §5). fp32; D in {16, 32, 64, 128}; up to 8 queries per launch (more are split on the host).
//
// Both kernels stream LNb once in tiles of 64 rows: 4 threads per row compute the row's dot products
// from registers (2 shuffles), the tile goes to shared memory, and a column pass (one thread per d)
// accumulates sum_k w[q,k] * LNb[k,d]. K is split across blocks by shape alone (never by the GPU), and
// every cross-block sum is written as per-block partials then combined in a fixed order: no atomics, so
// results are bitwise identical run to run.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "messages.h"

#include <cstdlib>
#include <limits>

namespace {

constexpr int kThreads = 256;
constexpr int kTileRows = 64;  // 4 threads per row
constexpr int kMaxQ = 8;
constexpr int kPad = 16;  // row stride = 16 mod 32 banks: the 4-thread float4 row stores do not conflict

struct KSplit {
  int splits;
  int rows;  // rows per split, a multiple of kTileRows; no split is empty
};

// About 1536 blocks in all (B = 64: 24 splits), from the shapes only, so every GPU sums in the same order.
KSplit split_k(int64_t B, int64_t K) {
  const int64_t tiles = (K + kTileRows - 1) / kTileRows;
  const int64_t want = std::max<int64_t>(1, (1536 + B - 1) / B);
  const int64_t per = (tiles + std::min(tiles, want) - 1) / std::min(tiles, want);
  return {static_cast<int>((tiles + per - 1) / per), static_cast<int>(per * kTileRows)};
}

void poison_if_asked(at::Tensor& t) {
  // PERCEPTION_OPS_POISON=1 fills outputs with NaN before the launch, so tests see unwritten elements.
  if (std::getenv("PERCEPTION_OPS_POISON") != nullptr) t.fill_(std::numeric_limits<float>::quiet_NaN());
}

// Rounding pinned with explicit intrinsics (no compiler contraction choices): the backward's
// c = sum_d g*ctx and every row's g.x use this same chain, so at K = 1 (ctx = x) they agree bit for bit
// and d_s is exactly 0.
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return __fmaf_rn(a.w, b.w, __fmaf_rn(a.z, b.z, __fmaf_rn(a.y, b.y, __fmul_rn(a.x, b.x))));
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Forward, one block per (K split, b). Grid (S, B), 256 threads.
// Bytes: reads its LNb rows once (B*K*D*4 in all); writes (B, S, nq, D+2) partials.
// Deterministic: fixed per-thread row order, fixed-order combine of row phases.
template <int MQ, int NV>
__global__ void __launch_bounds__(kThreads) attention_pool_fwd(
    const float* __restrict__ lnb,  // (B, K, D)
    const float* __restrict__ q,    // (nq, D), this launch's queries
    float* __restrict__ part_acc,   // (B, S, nq, D): sum_k exp(s - m) * LNb[k, d]
    float* __restrict__ part_ml,    // (B, S, nq, 2): running max m, sum_k exp(s - m)
    int K, int rows_per_split, int nq) {
  constexpr int D = 16 * NV;
  constexpr int LD = D + kPad;
  constexpr int H = kThreads / D;  // row phases of the column pass
  __shared__ __align__(16) float xs[kTileRows * LD];
  __shared__ __align__(16) float qs[MQ * D];
  __shared__ float ps[MQ][kTileRows];
  __shared__ float tmax[MQ];
  __shared__ float lred[H * MQ];

  const int b = blockIdx.y, split = blockIdx.x, S = gridDim.x, tid = threadIdx.x;
  const int r = tid >> 2, part = tid & 3;       // row pass
  const int col = tid % D, phase = tid / D;      // column pass
  const int warp = tid >> 5, lane = tid & 31;
  const int k_begin = split * rows_per_split;
  const int k_end = min(K, k_begin + rows_per_split);
  const float* x_b = lnb + static_cast<size_t>(b) * K * D;

  for (int i = tid; i < nq * D; i += kThreads) qs[i] = q[i];
  float m_run[MQ], acc[MQ], l[MQ];
#pragma unroll
  for (int j = 0; j < MQ; ++j) m_run[j] = -INFINITY, acc[j] = 0.f, l[j] = 0.f;
  __syncthreads();
  const float4* qs4 = reinterpret_cast<const float4*>(qs);

  for (int k0 = k_begin; k0 < k_end; k0 += kTileRows) {
    const int k = k0 + r;
    const bool valid = k < k_end;
    float4 xv[NV];
    const float4* row = reinterpret_cast<const float4*>(x_b + static_cast<size_t>(valid ? k : k_begin) * D);
#pragma unroll
    for (int i = 0; i < NV; ++i) xv[i] = valid ? __ldg(row + part + 4 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
    float s[MQ];
#pragma unroll
    for (int j = 0; j < MQ; ++j) if (j < nq) {
      float t = 0.f;
#pragma unroll
      for (int i = 0; i < NV; ++i) t += dot4(xv[i], qs4[j * (D / 4) + part + 4 * i]);
      t += __shfl_xor_sync(0xffffffffu, t, 1);
      s[j] = t + __shfl_xor_sync(0xffffffffu, t, 2);
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) *reinterpret_cast<float4*>(&xs[r * LD + (part + 4 * i) * 4]) = xv[i];
    if (part == 0) {
#pragma unroll
      for (int j = 0; j < MQ; ++j) if (j < nq) ps[j][r] = valid ? s[j] : -INFINITY;
    }
    __syncthreads();
    if (warp < nq) {
      const float v = warp_max(fmaxf(ps[warp][lane], ps[warp][lane + 32]));
      if (lane == 0) tmax[warp] = v;
    }
    __syncthreads();
    float scale[MQ];
#pragma unroll
    for (int j = 0; j < MQ; ++j) if (j < nq) {
      const float m_new = fmaxf(m_run[j], tmax[j]);
      scale[j] = expf(m_run[j] - m_new);  // 0 on the first tile (m_run = -inf)
      m_run[j] = m_new;
      acc[j] *= scale[j];
      l[j] *= scale[j];
    }
    if (part == 0) {
#pragma unroll
      for (int j = 0; j < MQ; ++j) if (j < nq) ps[j][r] = valid ? expf(s[j] - m_run[j]) : 0.f;
    }
    __syncthreads();
    for (int rr = phase; rr < kTileRows; rr += H) {
      const float x = xs[rr * LD + col];
#pragma unroll
      for (int j = 0; j < MQ; ++j) if (j < nq) {
        const float p = ps[j][rr];
        acc[j] = fmaf(p, x, acc[j]);
        l[j] += p;
      }
    }
    __syncthreads();
  }

  // Combine the H row phases in a fixed order (xs is free now).
#pragma unroll
  for (int j = 0; j < MQ; ++j) if (j < nq) xs[(phase * nq + j) * D + col] = acc[j];
  if (col == 0) {
#pragma unroll
    for (int j = 0; j < MQ; ++j) if (j < nq) lred[phase * nq + j] = l[j];
  }
  __syncthreads();
  if (phase == 0) {
    const size_t base = (static_cast<size_t>(b) * S + split) * nq;
#pragma unroll
    for (int j = 0; j < MQ; ++j) if (j < nq) {
      float a = 0.f, lt = 0.f;
      for (int h = 0; h < H; ++h) a += xs[(h * nq + j) * D + col], lt += lred[h * nq + j];
      part_acc[(base + j) * D + col] = a;
      if (col == 0) part_ml[(base + j) * 2] = m_run[j], part_ml[(base + j) * 2 + 1] = lt;
    }
  }
}

// Combine the K splits: one block per (b, q), D threads. Fixed split order.
// Bytes: reads (S, D+2) partials per (b, q); writes ctx (D) and lse.
__global__ void attention_pool_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                       float* __restrict__ ctx, float* __restrict__ lse, int S, int nq, int D,
                                       int Q, int q0) {
  const int b = blockIdx.x / nq, j = blockIdx.x % nq, d = threadIdx.x;
  float m = -INFINITY;
  for (int s = 0; s < S; ++s) m = fmaxf(m, part_ml[((static_cast<size_t>(b) * S + s) * nq + j) * 2]);
  float l = 0.f, a = 0.f;
  for (int s = 0; s < S; ++s) {
    const size_t base = (static_cast<size_t>(b) * S + s) * nq + j;
    const float w = expf(part_ml[base * 2] - m);
    l = fmaf(part_ml[base * 2 + 1], w, l);
    a = fmaf(part_acc[base * D + d], w, a);
  }
  ctx[(static_cast<size_t>(b) * Q + q0 + j) * D + d] = a / l;
  if (d == 0) lse[static_cast<size_t>(b) * Q + q0 + j] = m + logf(l);
}

// Backward, one block per (K split, b). Grid (S, B), 256 threads.
//   a = exp(Qw.x - lse), d_s = a * (g.x - sum_d g*ctx),
//   d_lnb[k] = sum_q a*g[q] + d_s*Qw[q]  (each row written by its own 4 threads, one pass),
//   d_Qw partials[b, split] = sum_k d_s * x.
// Bytes: reads LNb once, writes d_LNb once (2*B*K*D*4), plus (B, S, nq, D) partials.
// Deterministic: one writer per d_LNb element (accumulate adds the previous query group's value in a
// fixed launch order), fixed-order partial sums.
template <int MQ, int NV>
__global__ void __launch_bounds__(kThreads) attention_pool_bwd(
    const float* __restrict__ lnb,    // (B, K, D)
    const float* __restrict__ q,      // (nq, D)
    const float* __restrict__ g,      // (B, Q, D) grad of ctx
    const float* __restrict__ ctx,    // (B, Q, D)
    const float* __restrict__ lse,    // (B, Q)
    float* __restrict__ d_lnb,        // (B, K, D)
    float* __restrict__ part_dq,      // (B, S, nq, D)
    int K, int rows_per_split, int nq, int Q, int q0, bool accumulate) {
  constexpr int D = 16 * NV;
  constexpr int LD = D + kPad;
  constexpr int H = kThreads / D;
  __shared__ __align__(16) float xs[kTileRows * LD];
  __shared__ __align__(16) float qs[MQ * D];
  __shared__ __align__(16) float gs[MQ * D];
  __shared__ float dss[MQ][kTileRows];
  __shared__ float lse_s[MQ], c_s[MQ];

  const int b = blockIdx.y, split = blockIdx.x, S = gridDim.x, tid = threadIdx.x;
  const int r = tid >> 2, part = tid & 3;
  const int col = tid % D, phase = tid / D;
  const int warp = tid >> 5, lane = tid & 31;
  const int k_begin = split * rows_per_split;
  const int k_end = min(K, k_begin + rows_per_split);
  const size_t x_off = static_cast<size_t>(b) * K * D;

  for (int i = tid; i < nq * D; i += kThreads) {
    qs[i] = q[i];
    gs[i] = g[(static_cast<size_t>(b) * Q + q0) * D + i];
  }
  __syncthreads();
  const float4* qs4 = reinterpret_cast<const float4*>(qs);
  const float4* gs4 = reinterpret_cast<const float4*>(gs);
  if (warp == 0) {
    // c[q] = sum_d g * ctx (= sum_k a * d_a), 4 lanes per query (kMaxQ * 4 = 32). K = 1 (a = 1, ctx = x):
    // summed exactly as a row's g.x below (float4 groups part + 4i through dot4, the same two shuffles), so
    // d_s is exactly 0. K > 1: in fp64, since an error in c shifts every row's d_s alike and does not
    // average out over K in d_Qw.
    const int j = lane >> 2, p = lane & 3;
    float t = 0.f;
    double t64 = 0.0;
    if (j < nq) {
      const float* c_row = ctx + (static_cast<size_t>(b) * Q + q0 + j) * D;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int f = 4 * (p + 4 * i);
        const float4 cv = make_float4(c_row[f], c_row[f + 1], c_row[f + 2], c_row[f + 3]);
        const float4 gv = gs4[j * (D / 4) + p + 4 * i];
        t += dot4(cv, gv);
        t64 += static_cast<double>(cv.x) * gv.x + static_cast<double>(cv.y) * gv.y +
               static_cast<double>(cv.z) * gv.z + static_cast<double>(cv.w) * gv.w;
      }
    }
    t += __shfl_xor_sync(0xffffffffu, t, 1);
    t += __shfl_xor_sync(0xffffffffu, t, 2);
    t64 += __shfl_xor_sync(0xffffffffu, t64, 1);
    t64 += __shfl_xor_sync(0xffffffffu, t64, 2);
    if (j < nq && p == 0) {
      c_s[j] = K == 1 ? t : static_cast<float>(t64);
      lse_s[j] = lse[static_cast<size_t>(b) * Q + q0 + j];
    }
  }
  // d_Qw partial sums are compensated (Kahan): d_Qw = sum_k d_s * x cancels heavily (sum_k d_s = 0), so
  // plain fp32 accumulation loses more than eager's error; fp64 would be slow on sm_89.
  float dq[MQ], dq_c[MQ];
#pragma unroll
  for (int j = 0; j < MQ; ++j) dq[j] = dq_c[j] = 0.f;
  __syncthreads();

  for (int k0 = k_begin; k0 < k_end; k0 += kTileRows) {
    const int k = k0 + r;
    const bool valid = k < k_end;
    const size_t row_off = x_off + static_cast<size_t>(valid ? k : k_begin) * D;
    const float4* row = reinterpret_cast<const float4*>(lnb + row_off);
    float4 xv[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) xv[i] = valid ? __ldg(row + part + 4 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
    float a[MQ], ds[MQ];
#pragma unroll
    for (int j = 0; j < MQ; ++j) if (j < nq) {
      float sx = 0.f, gx = 0.f;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        sx += dot4(xv[i], qs4[j * (D / 4) + part + 4 * i]);
        gx += dot4(xv[i], gs4[j * (D / 4) + part + 4 * i]);
      }
      sx += __shfl_xor_sync(0xffffffffu, sx, 1);
      gx += __shfl_xor_sync(0xffffffffu, gx, 1);
      sx += __shfl_xor_sync(0xffffffffu, sx, 2);
      gx += __shfl_xor_sync(0xffffffffu, gx, 2);
      a[j] = valid ? expf(sx - lse_s[j]) : 0.f;
      ds[j] = a[j] * (gx - c_s[j]);
    }
    if (valid) {
      float4* out = reinterpret_cast<float4*>(d_lnb + row_off);
#pragma unroll 1
      for (int i = 0; i < NV; ++i) {
        const int f = part + 4 * i;
        float4 o = accumulate ? out[f] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < MQ; ++j) if (j < nq) {
          const float4 gq = gs4[j * (D / 4) + f], qq = qs4[j * (D / 4) + f];
          o.x += a[j] * gq.x + ds[j] * qq.x;
          o.y += a[j] * gq.y + ds[j] * qq.y;
          o.z += a[j] * gq.z + ds[j] * qq.z;
          o.w += a[j] * gq.w + ds[j] * qq.w;
        }
        out[f] = o;
      }
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) *reinterpret_cast<float4*>(&xs[r * LD + (part + 4 * i) * 4]) = xv[i];
    if (part == 0) {
#pragma unroll
      for (int j = 0; j < MQ; ++j) if (j < nq) dss[j][r] = ds[j];  // 0 on rows past the end (a = 0)
    }
    __syncthreads();
    for (int rr = phase; rr < kTileRows; rr += H) {
      const float x = xs[rr * LD + col];
#pragma unroll
      for (int j = 0; j < MQ; ++j) if (j < nq) {
        const float y = fmaf(dss[j][rr], x, -dq_c[j]);
        const float t = dq[j] + y;
        dq_c[j] = (t - dq[j]) - y;
        dq[j] = t;
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int j = 0; j < MQ; ++j) if (j < nq) xs[(phase * nq + j) * D + col] = dq[j];
  __syncthreads();
  if (phase == 0) {
    const size_t base = (static_cast<size_t>(b) * S + split) * nq;
#pragma unroll
    for (int j = 0; j < MQ; ++j) if (j < nq) {
      double t = 0.0;
      for (int h = 0; h < H; ++h) t += xs[(h * nq + j) * D + col];
      part_dq[(base + j) * D + col] = static_cast<float>(t);
    }
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

#define PERCEPTION_DISPATCH_NV(D, ...)                      \
  switch (D) {                                             \
    case 16: { constexpr int NV = 1; __VA_ARGS__; } break; \
    case 32: { constexpr int NV = 2; __VA_ARGS__; } break; \
    case 64: { constexpr int NV = 4; __VA_ARGS__; } break; \
    case 128: { constexpr int NV = 8; __VA_ARGS__; } break; \
    default: TORCH_CHECK(false, "unreachable D"); \
  }

// Q = 1 (SharedQuery) gets its own kernel; any other group of up to 8 queries runs the 8-slot kernel
// with uniform branches on the live count.
#define PERCEPTION_DISPATCH_MQ(nq, ...)                                \
  if ((nq) == 1) {                                                     \
    constexpr int MQ = 1;                                              \
    __VA_ARGS__;                                                       \
  } else {                                                             \
    constexpr int MQ = kMaxQ;                                          \
    __VA_ARGS__;                                                       \
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
  TORCH_CHECK(D == 16 || D == 32 || D == 64 || D == 128,
              "attention_pool: kernels take D in {16, 32, 64, 128}, got D = " + num(D) + " (use model.ops=ref)");
  TORCH_CHECK(lnb.size(1) >= 1 && q.size(0) >= 1, "attention_pool: K and Q must be >= 1, got lnb " +
                                                      shape(lnb.sizes()) + " and q " + shape(q.sizes()));
}

std::tuple<at::Tensor, at::Tensor> attention_pool_cuda(const at::Tensor& lnb_in, const at::Tensor& q_in) {
  check_pool_inputs(lnb_in, q_in);
  const c10::cuda::CUDAGuard guard(lnb_in.device());
  const at::Tensor lnb = lnb_in.contiguous(), q = q_in.contiguous();
  const int64_t B = lnb.size(0), K = lnb.size(1), D = lnb.size(2), Q = q.size(0);
  at::Tensor ctx = at::empty({B, Q, D}, lnb.options());
  at::Tensor lse = at::empty({B, Q}, lnb.options());
  poison_if_asked(ctx);
  poison_if_asked(lse);
  if (B == 0) return {ctx, lse};
  const KSplit sp = split_k(B, K);
  auto stream = c10::cuda::getCurrentCUDAStream();
  for (int64_t q0 = 0; q0 < Q; q0 += kMaxQ) {  // independent softmaxes: query groups never interact
    const int nq = static_cast<int>(std::min<int64_t>(kMaxQ, Q - q0));
    at::Tensor part_acc = at::empty({B, sp.splits, nq, D}, lnb.options());
    at::Tensor part_ml = at::empty({B, sp.splits, nq, 2}, lnb.options());
    const dim3 grid(sp.splits, B);
    PERCEPTION_DISPATCH_MQ(nq, PERCEPTION_DISPATCH_NV(D, attention_pool_fwd<MQ, NV><<<grid, kThreads, 0, stream>>>(
                                                              lnb.data_ptr<float>(), q.data_ptr<float>() + q0 * D,
                                                              part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
                                                              static_cast<int>(K), sp.rows, nq)));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    attention_pool_combine<<<B * nq, D, 0, stream>>>(part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
                                                    ctx.data_ptr<float>(), lse.data_ptr<float>(), sp.splits, nq,
                                                    static_cast<int>(D), static_cast<int>(Q), static_cast<int>(q0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {ctx, lse};
}

std::tuple<at::Tensor, at::Tensor> attention_pool_bwd_cuda(const at::Tensor& grad_in, const at::Tensor& lnb_in,
                                                          const at::Tensor& q_in, const at::Tensor& ctx_in,
                                                          const at::Tensor& lse_in) {
  check_pool_inputs(lnb_in, q_in);
  const int64_t B = lnb_in.size(0), K = lnb_in.size(1), D = lnb_in.size(2), Q = q_in.size(0);
  {
    using namespace perception_msg;
    TORCH_CHECK(grad_in.sizes() == ctx_in.sizes() && ctx_in.dim() == 3 && ctx_in.size(0) == B &&
                    ctx_in.size(1) == Q && ctx_in.size(2) == D,
                "attention_pool_bwd: grad_ctx and ctx must be (B, Q, D) = " + shape({B, Q, D}) + ", got " +
                    shape(grad_in.sizes()) + " and " + shape(ctx_in.sizes()));
    TORCH_CHECK(lse_in.dim() == 2 && lse_in.size(0) == B && lse_in.size(1) == Q,
                "attention_pool_bwd: lse must be (B, Q) = " + shape({B, Q}) + ", got " + shape(lse_in.sizes()));
    TORCH_CHECK(grad_in.scalar_type() == at::kFloat && ctx_in.scalar_type() == at::kFloat &&
                    lse_in.scalar_type() == at::kFloat,
                "attention_pool_bwd: grad_ctx, ctx and lse must be float32, got " + dtype(grad_in) + ", " +
                    dtype(ctx_in) + " and " + dtype(lse_in));
    TORCH_CHECK(grad_in.is_cuda() && ctx_in.is_cuda() && lse_in.is_cuda() && grad_in.device() == lnb_in.device() &&
                    ctx_in.device() == lnb_in.device() && lse_in.device() == lnb_in.device(),
                "attention_pool_bwd: grad_ctx, ctx and lse must be CUDA tensors on lnb's device");
  }
  const c10::cuda::CUDAGuard guard(lnb_in.device());
  const at::Tensor lnb = lnb_in.contiguous(), q = q_in.contiguous(), g = grad_in.contiguous();
  const at::Tensor ctx = ctx_in.contiguous(), lse = lse_in.contiguous();
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
    PERCEPTION_DISPATCH_MQ(
        nq, PERCEPTION_DISPATCH_NV(D, attention_pool_bwd<MQ, NV><<<grid, kThreads, 0, stream>>>(
                                          lnb.data_ptr<float>(), q.data_ptr<float>() + q0 * D, g.data_ptr<float>(),
                                          ctx.data_ptr<float>(), lse.data_ptr<float>(), d_lnb.data_ptr<float>(),
                                          part_dq.data_ptr<float>(), static_cast<int>(K), sp.rows, nq,
                                          static_cast<int>(Q), static_cast<int>(q0), q0 > 0)));
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
