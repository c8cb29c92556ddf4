"""The reference ops against DESIGN §3's equations: fp64 gradcheck, SDPA, the attention pool's
hand-derived backward, the inverted pool and merge, and the CfC cell on hand-built inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from perception.ops import (
    attention_pool,
    attention_pool_ref,
    attention_weights_ref,
    cfc_scan,
    cfc_scan_ref,
    inv_pool_merge_ref,
    inverted_pool_ref,
)
from perception.ops.cfc import cfc_cell_ref, lecun_tanh

f64 = dict(dtype=torch.float64)


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, **f64) * scale).requires_grad_()


def cfc_inputs(b, k, d, seed=0):
    return (
        rand(b, k, d, seed=seed),  # x_proj (U = D)
        (torch.rand(b, k, generator=torch.Generator().manual_seed(seed + 1), **f64) + 0.5).requires_grad_(),
        rand(b, d, seed=seed + 2),  # h0
        rand(d, d, seed=seed + 3, scale=0.5),  # w_rec (U, D)
        rand(4 * d, d, seed=seed + 4, scale=0.5),  # w_out (4D, U)
        rand(4 * d, seed=seed + 5),  # b_out
    )


# --- fp64 gradcheck of every reference op --------------------------------------------------------


@pytest.mark.parametrize("n_queries", [1, 5])
def test_gradcheck_attention_ops(n_queries):
    lnb, q = rand(2, 6, 4), rand(n_queries, 4, seed=1)
    assert torch.autograd.gradcheck(attention_pool_ref, (lnb, q))
    assert torch.autograd.gradcheck(attention_weights_ref, (lnb, q))


def test_gradcheck_inverted_pool_and_merge():
    assert torch.autograd.gradcheck(inverted_pool_ref, (rand(2, 5, 4),))
    assert torch.autograd.gradcheck(inv_pool_merge_ref, (rand(2, 3, 4), rand(2, 4, seed=1)))


def test_gradcheck_cfc():
    x_proj, ts, h0, w_rec, w_out, b_out = cfc_inputs(2, 4, 3)
    assert torch.autograd.gradcheck(cfc_scan_ref, (x_proj, ts, h0, w_rec, w_out, b_out))
    assert torch.autograd.gradcheck(cfc_cell_ref, (x_proj[:, 0], ts[:, 0], h0, w_rec, w_out, b_out))
    assert torch.autograd.gradcheck(lecun_tanh, (rand(7),))


# --- attention pool ------------------------------------------------------------------------------


@given(b=st.integers(1, 3), k=st.integers(1, 9), d=st.integers(1, 6), n_queries=st.sampled_from([1, 5]))
def test_attention_pool_equals_sdpa(b, k, d, n_queries):
    lnb, q = rand(b, k, d, seed=k), rand(n_queries, d, seed=d)
    expected = F.scaled_dot_product_attention(q.expand(b, n_queries, d), lnb, lnb, scale=1.0)
    torch.testing.assert_close(attention_pool_ref(lnb, q), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attention_pool(lnb, q, backend="ref"), expected, rtol=1e-12, atol=1e-12)


@given(b=st.integers(1, 3), k=st.integers(1, 9), d=st.integers(1, 6), n_queries=st.sampled_from([1, 5]))
def test_attention_pool_backward_formulas_equal_autograd(b, k, d, n_queries):
    lnb, q = rand(b, k, d, seed=k), rand(n_queries, d, seed=d)
    g = rand(b, n_queries, d, seed=b + 10).detach()  # upstream d_ctx
    ctx = attention_pool_ref(lnb, q)
    d_lnb_auto, d_q_auto = torch.autograd.grad(ctx, (lnb, q), g)

    with torch.no_grad():
        a = attention_weights_ref(lnb, q)  # (B, Q, K)
        d_a = torch.einsum("bqd,bkd->bqk", g, lnb)
        d_s = a * (d_a - torch.einsum("bqd,bqd->bq", g, ctx).unsqueeze(-1))
        d_lnb = torch.einsum("bqk,bqd->bkd", a, g) + torch.einsum("bqk,qd->bkd", d_s, q)
        d_q = torch.einsum("bqk,bkd->qd", d_s, lnb)
    torch.testing.assert_close(d_lnb, d_lnb_auto, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(d_q, d_q_auto, rtol=1e-10, atol=1e-12)


def test_attention_weights_are_a_softmax_over_k():
    a = attention_weights_ref(rand(2, 7, 4), rand(5, 4, seed=1))
    assert a.shape == (2, 5, 7)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 5, **f64))


# --- inverted pool and merge ---------------------------------------------------------------------


def test_inverted_pool_matches_its_equation():
    lnb = rand(2, 5, 3).detach()
    x = lnb.numpy().transpose(0, 2, 1)  # (B, D, K)
    b_, d_, k_ = x.shape
    expected = np.zeros((b_, d_))
    for b in range(b_):
        for h in range(d_):
            s = np.array([x[b, h] @ x[b, j] / math.sqrt(k_) for j in range(d_)])
            a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            expected[b, h] = sum(a[j] * x[b, j].mean() for j in range(d_))
    np.testing.assert_allclose(inverted_pool_ref(lnb).numpy(), expected, rtol=1e-12)


def test_merge_adds_inv_to_every_query_and_sums_its_gradient():
    ctx, inv = rand(2, 5, 4), rand(2, 4, seed=1)
    out = inv_pool_merge_ref(ctx, inv)
    torch.testing.assert_close(out, ctx + inv[:, None, :])
    g = rand(2, 5, 4, seed=2).detach()
    (d_inv,) = torch.autograd.grad(out, inv, g)
    torch.testing.assert_close(d_inv, g.sum(dim=1))  # d_inv[b, d] = sum_q d_ctx[b, q, d]


# --- CfC -----------------------------------------------------------------------------------------


def cfc_numpy(x_proj, ts, h0, w_rec, w_out, b_out):
    """DESIGN §3's CfC written element by element: no broadcasting to get wrong."""
    x_proj, ts, h, w_rec, w_out, b_out = (t.detach().numpy() for t in (x_proj, ts, h0, w_rec, w_out, b_out))
    b_, k_, u_ = x_proj.shape
    d_ = h.shape[1]
    out = np.zeros((b_, k_, d_))
    for t in range(k_):
        new = np.zeros_like(h)
        for b in range(b_):
            z = [
                1.7159 * math.tanh(0.666 * (x_proj[b, t, u] + sum(w_rec[u, j] * h[b, j] for j in range(d_))))
                for u in range(u_)
            ]
            o = [b_out[r] + sum(w_out[r, u] * z[u] for u in range(u_)) for r in range(4 * d_)]
            for d in range(d_):
                f1, f2, ta, tb = o[d], o[d_ + d], o[2 * d_ + d], o[3 * d_ + d]
                sigma = 1.0 / (1.0 + math.exp(-(ta * ts[b, t] + tb)))
                new[b, d] = math.tanh(f1) * (1.0 - sigma) + sigma * math.tanh(f2)
        h = new
        out[:, t] = h
    return out


def test_cfc_cell_on_hand_built_numbers():
    """U = D = 1, w_rec = 0, w_out = 0: the gates are b_out, so h' is a closed form."""
    f1, f2, ta, tb, ts = 0.3, -1.2, 2.0, -0.5, 0.75
    h = cfc_scan_ref(
        torch.tensor([[[0.4]]], **f64),
        torch.tensor([[ts]], **f64),
        torch.tensor([[0.9]], **f64),
        torch.zeros(1, 1, **f64),
        torch.zeros(4, 1, **f64),
        torch.tensor([f1, f2, ta, tb], **f64),
    )
    sigma = 1.0 / (1.0 + math.exp(-(ta * ts + tb)))
    assert h.item() == pytest.approx(math.tanh(f1) * (1 - sigma) + sigma * math.tanh(f2), rel=1e-14)


@pytest.mark.parametrize("b,d", [(3, 4), (4, 4), (5, 2)])  # B != D and B == D
def test_cfc_scan_equals_the_equations(b, d):
    inputs = cfc_inputs(b, 3, d, seed=b * 10 + d)
    np.testing.assert_allclose(cfc_scan_ref(*inputs).detach().numpy(), cfc_numpy(*inputs), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(cfc_scan(*inputs, backend="ref"), cfc_scan_ref(*inputs))


@pytest.mark.parametrize("b,d", [(3, 4), (4, 4)])
def test_time_span_of_one_sample_moves_only_that_sample(b, d):
    """ts is per (sample, step) and scales every unit of that sample: with B == D a transposed
    broadcast would still run, so check the axis directly."""
    x_proj, ts, h0, w_rec, w_out, b_out = (t.detach() for t in cfc_inputs(b, 3, d))
    base = cfc_scan_ref(x_proj, ts, h0, w_rec, w_out, b_out)
    ts2 = ts.clone()
    ts2[1, 0] *= 3.0
    moved = (cfc_scan_ref(x_proj, ts2, h0, w_rec, w_out, b_out) - base).abs().amax(dim=(1, 2))  # (B,)
    assert moved[1] > 1e-6
    assert torch.all(moved[torch.arange(b) != 1] == 0)
    assert torch.all((cfc_scan_ref(x_proj, ts2, h0, w_rec, w_out, b_out) - base)[1, 0].abs() > 0)  # all D units


def test_half_inputs_upcast_to_fp32():
    lnb, q = torch.randn(2, 5, 4).half(), torch.randn(1, 4).half()
    assert attention_pool_ref(lnb, q).dtype == torch.float32
    assert inverted_pool_ref(lnb).dtype == torch.float32
