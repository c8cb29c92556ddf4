// Inverted (cross-variate) pool, DESIGN §3: X = LNb^T (B, D, K), s = X X^T / sqrt(K), a = softmax_j(s),
// inv = a @ mean_k X. Backward: d_s[h,j] = g[h] a[h,j] (m[j] - inv[h]), d_m[j] = sum_h a[h,j] g[h],
// d_LNb[k,:] = LNb[k,:] @ (d_s + d_s^T) / sqrt(K) + d_m / K.
// The two GEMMs (Gram forward, (K,D)x(D,D) backward) are fp32 SIMT register-tiled kernels: cuBLAS
// would honour a global TF32 switch and leaves the Gram's split-K order to its heuristics, while these
// keep fp32 accuracy and a fixed summation order. fp32; D in {16, 32, 64, 128}.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "messages.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace {

constexpr int kThreads = 256;  // 16 x 16 threads, each a TM x TM (D = 16 TM) micro-tile
constexpr int kGramRows = 16;  // K rows per Gram step
constexpr int kGemmRows = 128; // K rows per backward block (8 per thread)
constexpr int kGemmInner = 16; // inner (channel) step of the backward GEMM

void poison_if_asked(at::Tensor& t) {
  if (std::getenv("PERCEPTION_OPS_POISON") != nullptr) t.fill_(std::numeric_limits<float>::quiet_NaN());
}

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

// Backward prep: grid (B), 256 threads. sym[b] = (d_s + d_s^T) / sqrt(K) (D, D), dm[b] = d_m / K (D).
// Bytes: reads attn twice (B*D*D*4*2); writes B*D*(D+1)*4. One writer per element.
__global__ void inverted_pool_bwd_prep(const float* __restrict__ g, const float* __restrict__ attn,
                                       const float* __restrict__ mean, const float* __restrict__ inv,
                                       float* __restrict__ sym, float* __restrict__ dm, int D, int K) {
  const int b = blockIdx.x;
  const float* a = attn + static_cast<size_t>(b) * D * D;
  const float* gb = g + static_cast<size_t>(b) * D;
  const float* mb = mean + static_cast<size_t>(b) * D;
  const float* ib = inv + static_cast<size_t>(b) * D;
  const float inv_sqrt_k = 1.f / sqrtf(static_cast<float>(K)), inv_k = 1.f / static_cast<float>(K);
  for (int e = threadIdx.x; e < D * D; e += blockDim.x) {
    const int j = e / D, d = e % D;
    const float ds_jd = gb[j] * a[j * D + d] * (mb[d] - ib[j]);
    const float ds_dj = gb[d] * a[d * D + j] * (mb[j] - ib[d]);
    sym[static_cast<size_t>(b) * D * D + e] = (ds_jd + ds_dj) * inv_sqrt_k;
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float t = 0.f;
    for (int h = 0; h < D; ++h) t = fmaf(a[h * D + d], gb[h], t);
    dm[static_cast<size_t>(b) * D + d] = t * inv_k;
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

#define PERCEPTION_INV_DISPATCH(D, ...)                      \
  switch (D) {                                              \
    case 16: { constexpr int NV = 1; __VA_ARGS__; } break;  \
    case 32: { constexpr int NV = 2; __VA_ARGS__; } break;  \
    case 64: { constexpr int NV = 4; __VA_ARGS__; } break;  \
    case 128: { constexpr int NV = 8; __VA_ARGS__; } break; \
    default: TORCH_CHECK(false, "unreachable D");           \
  }

// Messages are single strings (messages.h says why); each names the argument and what was expected.
void check_lnb(const at::Tensor& lnb, const std::string& op) {
  using namespace perception_msg;
  TORCH_CHECK(lnb.is_cuda(), op + ": lnb must be a CUDA tensor");
  TORCH_CHECK(lnb.scalar_type() == at::kFloat,
              op + ": kernels take float32, got lnb " + dtype(lnb) + " (use model.ops=ref for other dtypes)");
  TORCH_CHECK(lnb.dim() == 3, op + ": lnb must be (B, K, D), got shape " + shape(lnb.sizes()));
  const int64_t D = lnb.size(2);
  TORCH_CHECK(D == 16 || D == 32 || D == 64 || D == 128,
              op + ": kernels take D in {16, 32, 64, 128}, got D = " + num(D) + " (use model.ops=ref)");
  TORCH_CHECK(lnb.size(1) >= 1, op + ": K must be >= 1, got lnb " + shape(lnb.sizes()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> inverted_pool_cuda(const at::Tensor& lnb_in) {
  check_lnb(lnb_in, "inverted_pool");
  const c10::cuda::CUDAGuard guard(lnb_in.device());
  const at::Tensor lnb = lnb_in.contiguous();
  const int64_t B = lnb.size(0), K = lnb.size(1), D = lnb.size(2);
  at::Tensor inv = at::empty({B, D}, lnb.options());
  at::Tensor attn = at::empty({B, D, D}, lnb.options());
  at::Tensor mean = at::empty({B, D}, lnb.options());
  poison_if_asked(inv);
  poison_if_asked(attn);
  poison_if_asked(mean);
  if (B == 0) return {inv, attn, mean};
  const int rows = gram_rows_per_split(B, K);
  const int S = static_cast<int>((K + rows - 1) / rows);
  at::Tensor part_g = at::empty({B, S, D, D}, lnb.options());
  at::Tensor part_sum = at::empty({B, S, D}, lnb.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  PERCEPTION_INV_DISPATCH(D, inverted_pool_gram<NV><<<dim3(S, B), kThreads, 0, stream>>>(
                                 lnb.data_ptr<float>(), part_g.data_ptr<float>(), part_sum.data_ptr<float>(),
                                 static_cast<int>(K), rows));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const dim3 sgrid(B, (D + 7) / 8);
  PERCEPTION_INV_DISPATCH(D, inverted_pool_softmax<16 * NV><<<sgrid, 256, 0, stream>>>(
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
  const at::Tensor lnb = lnb_in.contiguous(), g = grad_in.contiguous(), attn = attn_in.contiguous();
  const at::Tensor mean = mean_in.contiguous(), inv = inv_in.contiguous();
  at::Tensor d_lnb = at::empty_like(lnb);
  poison_if_asked(d_lnb);
  if (B == 0) return d_lnb;
  at::Tensor sym = at::empty({B, D, D}, lnb.options());
  at::Tensor dm = at::empty({B, D}, lnb.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  inverted_pool_bwd_prep<<<B, 256, 0, stream>>>(g.data_ptr<float>(), attn.data_ptr<float>(), mean.data_ptr<float>(),
                                                inv.data_ptr<float>(), sym.data_ptr<float>(), dm.data_ptr<float>(),
                                                static_cast<int>(D), static_cast<int>(K));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const dim3 grid((K + kGemmRows - 1) / kGemmRows, B);
  PERCEPTION_INV_DISPATCH(D, inverted_pool_bwd_gemm<NV><<<grid, kThreads, 0, stream>>>(
                                 lnb.data_ptr<float>(), sym.data_ptr<float>(), dm.data_ptr<float>(),
                                 d_lnb.data_ptr<float>(), static_cast<int>(K)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return d_lnb;
}

}  // namespace

TORCH_LIBRARY_IMPL(perception, CUDA, m) {
  m.impl("inverted_pool", &inverted_pool_cuda);
  m.impl("inverted_pool_bwd", &inverted_pool_bwd_cuda);
}
