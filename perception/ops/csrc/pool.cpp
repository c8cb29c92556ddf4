// Schemas of the pool family (DESIGN §5). CUDA kernels in pool.cu (attention pool), pool_inverted.cu and
// pool_merge.cu, on common.cuh; public ops, references, fakes and autograd in perception/ops/pool.py. This file
// opens the `perception` namespace; other families (cfc.cpp) add theirs with TORCH_LIBRARY_FRAGMENT.
#include <torch/library.h>

TORCH_LIBRARY(perception, m) {
  // lnb (B,K,D), q (Q,D) -> ctx (B,Q,D), stats (B,Q,2), scores (B,K,Q): softmax_k(q . lnb) @ lnb, the
  // softmax's max and sum, and its scores q . lnb, which the one-pass backward needs.
  m.def("attention_pool(Tensor lnb, Tensor q) -> (Tensor, Tensor, Tensor)");
  // grad_ctx (B,Q,D), lnb, q, ctx, stats, scores -> d_lnb (B,K,D), d_q (Q,D)
  m.def("attention_pool_bwd(Tensor grad_ctx, Tensor lnb, Tensor q, Tensor ctx, Tensor stats, Tensor scores) "
        "-> (Tensor, Tensor)");
  // lnb (B,K,D) -> inv (B,D), attn (B,D,D) softmax over channels, mean (B,D) over K
  m.def("inverted_pool(Tensor lnb) -> (Tensor, Tensor, Tensor)");
  // grad_inv (B,D), lnb, attn, mean, inv -> d_lnb (B,K,D)
  m.def("inverted_pool_bwd(Tensor grad_inv, Tensor lnb, Tensor attn, Tensor mean, Tensor inv) -> Tensor");
  // ctx (B,Q,D), inv (B,D) -> ctx + inv for every query
  m.def("inv_pool_merge(Tensor ctx, Tensor inv) -> Tensor");
  // grad (B,Q,D) -> d_inv (B,D) = sum over q
  m.def("inv_pool_merge_bwd(Tensor grad) -> Tensor");
}
