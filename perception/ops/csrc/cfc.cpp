// Schemas of the CfC family (DESIGN §3 cell, §5 signature). CUDA kernels in cfc_scan.cu, on common.cuh;
// public op, reference, fakes and autograd in perception/ops/cfc.py.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(perception, m) {
  // x_proj (B,K,U), ts (B,K), h0 (B,D), w_rec (U,D), w_out (4D,U), b_out (4D) -> h_seq (B,K,D)
  m.def("cfc_scan(Tensor x_proj, Tensor ts, Tensor h0, Tensor w_rec, Tensor w_out, Tensor b_out) -> Tensor");
  // Backward through time. grad_h (B,K,D); gates (B,K,4D) = W_out z + b_out and z (B,K,U), both recomputed
  // from h_seq by two GEMMs -> d_pre (B,K,U) (= d x_proj), d_gates (B,K,4D), d_h0 (B,D).
  m.def(
      "cfc_scan_bwd(Tensor grad_h, Tensor gates, Tensor z, Tensor ts, Tensor w_rec, Tensor w_out)"
      " -> (Tensor, Tensor, Tensor)");
}
