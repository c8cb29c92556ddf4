"""Chunked SSD against the sequential recurrence, and the Mamba2 mixer's causality and init."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from perception.errors import ConfigError
from perception.model.init import module_generator
from perception.model.mamba2 import Mamba2Mixer, ssd_scan, ssd_scan_sequential


def ssd_inputs(k, b=2, h=3, p=4, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = r(b, k, h, p).requires_grad_()
    dt = F.softplus(r(b, k, h) - 1.0).requires_grad_()  # up to ~1: decays exp(-16) per step occur
    A = -torch.empty(h, dtype=torch.float64).uniform_(1.0, 16.0, generator=g)
    return x, dt, A.requires_grad_(), r(b, k, n).requires_grad_(), r(b, k, n).requires_grad_(), r(h).requires_grad_()


@pytest.mark.parametrize("from_cumsum", [False, True], ids=["masked-sums", "from-cumsum"])
@pytest.mark.parametrize("k,chunk", [(1, 1), (1, 4), (8, 4), (8, 8), (10, 4), (13, 5), (33, 8), (7, 16)])
def test_chunked_equals_sequential(k, chunk, from_cumsum):
    inputs = ssd_inputs(k, seed=k * 100 + chunk)
    y_chunk = ssd_scan(*inputs, chunk=chunk, decay_from_cumsum=from_cumsum)
    y_seq = ssd_scan_sequential(*inputs)
    assert y_chunk.shape == inputs[0].shape
    assert (y_chunk - y_seq).abs().max().item() <= 1e-10
    g = torch.randn_like(y_seq)
    for a, b in zip(torch.autograd.grad(y_chunk, inputs, g), torch.autograd.grad(y_seq, inputs, g)):
        assert (a - b).abs().max().item() <= 1e-10


def test_mixer_is_causal():
    mixer = Mamba2Mixer(d_model=8, d_state=4, headdim=4, expand=2, d_conv=4, chunk=4).double()
    mixer.reset_parameters(module_generator(0, "mamba"))
    u = torch.randn(2, 11, 8, dtype=torch.float64)
    u2 = u.clone()
    u2[:, 7:] += 1.0
    y, y2 = mixer(u), mixer(u2)
    torch.testing.assert_close(y[:, :7], y2[:, :7], rtol=0, atol=1e-12)
    assert (y[:, 7:] - y2[:, 7:]).abs().max() > 1e-3


def test_mixer_init_follows_reference_mamba2():
    mixer = Mamba2Mixer(d_model=32, d_state=8, headdim=4, expand=2, d_conv=4, chunk=8)
    mixer.reset_parameters(module_generator(3, "mamba"))
    dt = F.softplus(mixer.dt_bias)
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    a = torch.exp(mixer.A_log)
    assert a.min() >= 1.0 and a.max() <= 16.0
    assert torch.all(mixer.D == 1.0)
    assert mixer.n_heads == 16 and not math.isclose(dt.std().item(), 0.0)


def test_headdim_must_divide_inner_width():
    with pytest.raises(ConfigError, match="headdim=6"):
        Mamba2Mixer(d_model=16, d_state=8, headdim=6, expand=2, d_conv=4, chunk=8)


@pytest.mark.parametrize("from_cumsum", [False, True], ids=["masked-sums", "from-cumsum"])
def test_fp32_chunked_stays_close_to_the_fp64_recurrence(from_cumsum):
    """Production chunk length in fp32: both decay forms keep long decays accurate."""
    x, dt, A, B, C, D = (t.detach() for t in ssd_inputs(300, h=4, p=8, n=16, seed=9))
    dt = dt * 0.3
    ref = ssd_scan_sequential(x, dt, A, B, C, D)
    y32 = ssd_scan(*(t.float() for t in (x, dt, A, B, C, D)), chunk=128, decay_from_cumsum=from_cumsum).double()
    assert (y32 - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_decay_from_cumsum_has_finite_gradients_where_decays_underflow():
    """dt up to ~10 at A = -16: exp underflows to 0 within a chunk; the masked upper triangle must not turn
    exp(+large) = inf into inf * 0 = NaN in backward."""
    x, dt, A, B, C, D = ssd_inputs(64, seed=4)
    dt = (dt.detach() * 10).requires_grad_()
    y = ssd_scan(x, dt, A, B, C, D, chunk=64, decay_from_cumsum=True)
    grads = torch.autograd.grad(y.square().sum(), (x, dt, A, B, C, D))
    assert all(torch.isfinite(g).all() for g in grads)
    ref = ssd_scan_sequential(x, dt, A, B, C, D)
    assert (y - ref).abs().max().item() <= 1e-10
