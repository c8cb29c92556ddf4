"""model.vsn.fold_embed: the linears that read the embedding, folded into it, compute the unfolded VSN's
function (fp64) and its gradients, eager and compiled, under the same parameter names."""

from __future__ import annotations

import pytest
import torch

from perception.model.vsn import VSN, fold_embedding


def _vsn(fold: bool, fused_grn: bool = False) -> VSN:
    vsn = VSN(6, 4, 16, fused_grn=fused_grn, fold_embed=fold, backend="ref")
    vsn.reset_parameters(torch.Generator().manual_seed(0))
    return vsn


def _run(vsn: VSN, x: torch.Tensor):
    out, v = vsn(x)
    (out.square().sum() + (v * torch.arange(v.shape[-1], dtype=v.dtype, device=v.device)).sum()).backward()
    return out.detach(), v.detach(), {n: p.grad.clone() for n, p in vsn.named_parameters()}


def test_a_folded_linear_of_the_embedding_is_the_linear_of_the_embedding():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, 6, generator=g, dtype=torch.float64)
    ew, eb = (torch.randn(6, 4, generator=g, dtype=torch.float64) for _ in range(2))
    w, b = torch.randn(9, 24, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64)
    e = (x.unsqueeze(-1) * ew + eb).flatten(-2)  # (5, 7, 24)
    folded_w, folded_b = fold_embedding(w, b, ew, eb)
    assert folded_w.shape == (9, 6)
    torch.testing.assert_close(x @ folded_w.T + folded_b, e @ w.T + b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow(seconds=20))])
def test_the_folded_vsn_gives_the_unfolded_outputs_and_gradients(compiled):
    x = torch.randn(3, 11, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    plain, folded = _vsn(False).double(), _vsn(True).double()
    if compiled:
        folded.compile_regions()
    assert list(folded.state_dict()) == list(plain.state_dict())
    want, got = _run(plain, x), _run(folded, x)
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-9, atol=1e-11, msg=name)
    assert not torch.equal(got[2]["embed_w"], torch.zeros_like(got[2]["embed_w"]))


def test_the_folded_selection_beside_the_fused_grns_gives_the_unfolded_vsn():
    """fused_grn with fold_embed: grn_select reads the embedding, the selection GRN reads x (reference ops)."""
    x = torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want, got = _run(_vsn(False).double(), x), _run(_vsn(True, fused_grn=True).double(), x)
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_folded_vsn_matches_the_unfolded_at_production_size_on_cuda():
    """F = 65, d_v = 8, D = 128, K = 6000, compiled, fp32 (tf32 off): the two roundings agree closely."""
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(2, 6000, 65, generator=torch.Generator().manual_seed(2)).cuda()
    runs = []
    for fold in (False, True):
        vsn = VSN(65, 8, 128, fold_embed=fold)
        vsn.reset_parameters(torch.Generator().manual_seed(0))
        vsn.compile_regions()
        runs.append(_run(vsn.cuda(), x))
    (want_out, want_v, want_grads), (got_out, got_v, got_grads) = runs
    torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_v, want_v, rtol=1e-4, atol=1e-6)
    for name in want_grads:
        scale = want_grads[name].abs().max()
        assert (got_grads[name] - want_grads[name]).abs().max() <= 1e-4 * scale, name
