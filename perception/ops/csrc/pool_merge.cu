// Merge of the inverted pool into the context, DESIGN §3: out[b,q,d] = ctx[b,q,d] + inv[b,d];
// backward d_ctx = grad (no kernel), d_inv[b,d] = sum_q grad[b,q,d]. Launch-bound at model sizes
// (B*Q*D = 40960 floats), so each direction is one small grid-stride kernel.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common.cuh"
#include "messages.h"

namespace {

using namespace perception_common;

// Grid-stride over B*Q*D; bytes: reads ctx + inv, writes out. One writer per element.
__global__ void inv_pool_merge_fwd(const float* __restrict__ ctx, const float* __restrict__ inv,
                                   float* __restrict__ out, int64_t n, int Q, int D) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / (static_cast<int64_t>(Q) * D);
    out[i] = ctx[i] + inv[b * D + i % D];
  }
}

// Grid-stride over B*D; each thread sums its Q values in order: one writer, deterministic.
__global__ void inv_pool_merge_bwd(const float* __restrict__ grad, float* __restrict__ d_inv, int64_t n, int Q,
                                   int D) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / D, d = i % D;
    float t = 0.f;
    for (int q = 0; q < Q; ++q) t += grad[(b * Q + q) * D + d];
    d_inv[i] = t;
  }
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096)); }

at::Tensor inv_pool_merge_cuda(const at::Tensor& ctx_in, const at::Tensor& inv_in) {
  TORCH_CHECK(ctx_in.is_cuda() && inv_in.is_cuda(), "inv_pool_merge: ctx and inv must be CUDA tensors");
  // Messages are single strings (messages.h says why).
  using namespace perception_msg;
  TORCH_CHECK(ctx_in.device() == inv_in.device(), "inv_pool_merge: ctx and inv must be on one device");
  TORCH_CHECK(ctx_in.scalar_type() == at::kFloat && inv_in.scalar_type() == at::kFloat,
              "inv_pool_merge: kernels take float32, got ctx " + dtype(ctx_in) + " and inv " + dtype(inv_in) +
                  " (use model.ops=ref for other dtypes)");
  TORCH_CHECK(ctx_in.dim() == 3 && inv_in.dim() == 2 && inv_in.size(0) == ctx_in.size(0) &&
                  inv_in.size(1) == ctx_in.size(2),
              "inv_pool_merge: expected ctx (B, Q, D) and inv (B, D) with the same B and D, got ctx " +
                  shape(ctx_in.sizes()) + " and inv " + shape(inv_in.sizes()));
  const c10::cuda::CUDAGuard guard(ctx_in.device());
  const at::Tensor ctx = ctx_in.contiguous(), inv = inv_in.contiguous();
  at::Tensor out = at::empty_like(ctx);
  poison_if_asked(out);
  const int64_t n = ctx.numel();
  if (n == 0) return out;
  inv_pool_merge_fwd<<<blocks_for(n), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      ctx.data_ptr<float>(), inv.data_ptr<float>(), out.data_ptr<float>(), n, static_cast<int>(ctx.size(1)),
      static_cast<int>(ctx.size(2)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor inv_pool_merge_bwd_cuda(const at::Tensor& grad_in) {
  TORCH_CHECK(grad_in.is_cuda() && grad_in.scalar_type() == at::kFloat && grad_in.dim() == 3,
              "inv_pool_merge_bwd: grad must be a float32 CUDA (B, Q, D) tensor, got " +
                  perception_msg::dtype(grad_in) + " " + perception_msg::shape(grad_in.sizes()));
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const at::Tensor grad = grad_in.contiguous();
  const int64_t B = grad.size(0), Q = grad.size(1), D = grad.size(2);
  at::Tensor d_inv = at::empty({B, D}, grad.options());
  poison_if_asked(d_inv);
  if (B * D == 0) return d_inv;
  if (Q == 0) return d_inv.zero_();
  inv_pool_merge_bwd<<<blocks_for(B * D), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      grad.data_ptr<float>(), d_inv.data_ptr<float>(), B * D, static_cast<int>(Q), static_cast<int>(D));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return d_inv;
}

}  // namespace

TORCH_LIBRARY_IMPL(perception, CUDA, m) {
  m.impl("inv_pool_merge", &inv_pool_merge_cuda);
  m.impl("inv_pool_merge_bwd", &inv_pool_merge_bwd_cuda);
}
