"""PerceptionModel: shapes for both variants, seeded initialisation, op dispatch, the inverted
path, Δt scaling, the masked loss, and that both variants can fit a small batch."""

from __future__ import annotations

import pytest
import torch

import perception.ops as ops
from perception.errors import ConfigError, DataError
from perception.model import AttentionPoolVariant, PerceptionModel, masked_bce
from perception.ops.extension import ExtensionUnavailable

from tests.model.helpers import HORIZONS, N_FEATURES, tiny_config

B, K = 3, 12


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: more threads only contend for the 2 shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(seed=0, b=B, k=K):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, k, N_FEATURES, generator=g), torch.rand(b, k, generator=g) + 0.5


def build(variant="shared", inverted_pool=False, seed=0, **kw):
    return PerceptionModel(tiny_config(variant, inverted_pool, **kw), N_FEATURES, HORIZONS, seed)


@pytest.mark.parametrize("variant", ["shared", "per_horizon"])
@pytest.mark.parametrize("inverted_pool", [False, True])
def test_shapes_and_finiteness(variant, inverted_pool):
    model = build(variant, inverted_pool)
    x, dt = batch()
    logits, attn = model(x, dt, return_attention=True)
    q = 1 if variant == "shared" else len(HORIZONS)
    assert model.variant is AttentionPoolVariant(variant) and model.n_queries == q
    assert logits.shape == (B, len(HORIZONS)) and attn.shape == (B, q, K)
    assert torch.isfinite(logits).all() and torch.isfinite(attn).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones(B, q))
    torch.testing.assert_close(model(x, dt), logits)
    masked_bce(logits, torch.ones_like(logits), torch.ones_like(logits, dtype=torch.bool)).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_trunk_starts_identical_in_both_variants():
    shared_model = build("shared", seed=7)
    shared, per_h = shared_model.state_dict(), build("per_horizon", seed=7).state_dict()
    trunk = [n for n in shared if n.startswith(shared_model.trunk_prefixes)]
    assert {n.split(".")[0] for n in trunk} == {"vsn", "mamba", "ln_b", "cfc"}
    for name in trunk:
        torch.testing.assert_close(shared[name], per_h[name], rtol=0, atol=0, msg=name)
    assert "pool.q" in shared and "pool.q_h" in per_h
    assert shared["pool.q"].shape == (1, 16) and per_h["pool.q_h"].shape == (len(HORIZONS), 16)
    other = build("shared", seed=8).state_dict()
    assert not torch.equal(shared["cfc.w_rec"], other["cfc.w_rec"])
    assert not torch.equal(shared["vsn.out.weight"], other["vsn.out.weight"])


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build("per_horizon", inverted_pool=True)
    torch.testing.assert_close(torch.rand(3), expected)


def test_ops_dispatch_with_the_configured_backend(monkeypatch):
    calls = []
    for name in ("attention_pool", "inverted_pool", "inv_pool_merge", "cfc_scan"):
        real = getattr(ops, name)

        def spy(*args, _real=real, _name=name, backend, **kw):
            calls.append((_name, backend))
            return _real(*args, backend=backend, **kw)

        monkeypatch.setattr(ops, name, spy)
    build("per_horizon", inverted_pool=True, ops="auto")(*batch())
    assert sorted(calls) == sorted(
        [("attention_pool", "auto"), ("inverted_pool", "auto"), ("inv_pool_merge", "auto"), ("cfc_scan", "auto")]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_backend_on_cpu_is_a_clear_error():
    with pytest.raises((ExtensionUnavailable, ValueError), match="model.ops=cuda"):
        build(ops="cuda")(*batch())


def test_bad_variant_names_the_allowed_values():
    with pytest.raises(ConfigError, match="model.attention_pool='bogus'.*shared, per_horizon"):
        build("bogus")


def test_bad_input_shape_is_a_clear_error():
    x, dt = batch()
    with pytest.raises(ValueError, match=r"x \(B, K, 5\)"):
        build()(x[..., :4], dt)
    with pytest.raises(ValueError, match="dt"):
        build()(x, dt[:, :-1])


def test_dt_scale_is_a_persistent_buffer_that_scales_time_spans():
    model = build()
    x, dt = batch()
    base = model(x, dt)
    model.set_dt_scale(2.0)
    assert model.state_dict()["dt_scale"].item() == 2.0
    torch.testing.assert_close(model(x, 2.0 * dt), base)  # ts = Δt / median Δt
    assert (model(x, dt) - base).abs().max() > 1e-5
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(DataError, match="median Δt"):
            model.set_dt_scale(bad)


@pytest.mark.parametrize("variant", ["shared", "per_horizon"])
def test_inverted_path_reaches_the_logits_and_ln_b(variant):
    """A short window: in the shared variant the context reaches the logits only through h_0,
    which the CfC forgets within a few dozen steps at initialisation."""
    model = build(variant, inverted_pool=True).double()
    x, dt = (t.double() for t in batch(k=4))
    seen = {}

    def capture(name):
        def hook(module, args, out):
            seen[name] = out

        return hook

    model.inv_pool.register_forward_hook(capture("inv"))
    model.ln_b.register_forward_hook(capture("lnb"))
    logits = model(x, dt)
    (d_inv,) = torch.autograd.grad(logits.sum(), seen["inv"], retain_graph=True)
    assert d_inv.abs().max() > 1e-6  # the merged value reaches the logits
    (d_lnb,) = torch.autograd.grad(seen["inv"].sum(), seen["lnb"])
    assert d_lnb.abs().max() > 1e-6  # and its gradient reaches LN_b

    handle = model.inv_pool.register_forward_hook(lambda m, a, out: out + 0.1)
    assert (model(x, dt) - logits).abs().max() > 1e-4  # perturbing its output moves the logits
    handle.remove()
    torch.testing.assert_close(model(x, dt), logits)


def test_masked_bce_is_the_mean_over_valid_entries():
    logits = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.0, -0.3]], requires_grad=True)
    y = torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.uint8)
    mask = torch.tensor([[True, False, True], [True, True, False]])
    full = torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float(), reduction="none")
    assert masked_bce(logits, y, mask).item() == pytest.approx(full[mask].mean().item(), rel=1e-6)
    w = torch.tensor([1.0, 2.0, 0.5])
    expected = (full * mask * w).sum() / (mask * w).sum()
    assert masked_bce(logits, y, mask, w).item() == pytest.approx(expected.item(), rel=1e-6)
    masked_bce(logits, y, mask).backward()
    assert torch.all(logits.grad[~mask] == 0)  # masked entries never teach anything
    none = masked_bce(logits, y, torch.zeros_like(mask))
    assert none.item() == 0.0 and none.requires_grad
    with pytest.raises(ValueError, match="same"):
        masked_bce(logits, y[:, :2], mask)
    with pytest.raises(ValueError, match="one value per horizon"):
        masked_bce(logits, y, mask, torch.ones(2))


@pytest.mark.parametrize("variant", ["shared", "per_horizon"])
def test_overfits_one_small_batch(variant):
    torch.manual_seed(0)
    model = build(variant)
    x, dt = batch(seed=1, b=8, k=16)
    g = torch.Generator().manual_seed(2)
    y = (torch.rand(8, len(HORIZONS), generator=g) > 0.5).float()
    mask = torch.rand(8, len(HORIZONS), generator=g) > 0.2
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(200):
        loss = masked_bce(model(x, dt), y, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] <= 0.5 * losses[0], (losses[0], losses[-1])


def test_activation_checkpointing_changes_memory_not_results():
    x, dt = (t.double() for t in batch())
    plain = build("per_horizon").double()
    cfg = tiny_config("per_horizon")
    cfg.activation_checkpointing = True
    recomputed = PerceptionModel(cfg, N_FEATURES, HORIZONS, 0).double()
    outs = []
    for model in (plain, recomputed):
        logits = model(x, dt)
        logits.square().sum().backward()
        outs.append((logits.detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-12)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_shared_context_to_heads_ablation_feeds_the_one_context_to_path_a_heads():
    cfg = tiny_config("shared")
    cfg.shared_context_to_heads = True
    model = PerceptionModel(cfg, N_FEATURES, HORIZONS, 0).double()
    assert model.n_queries == 1 and model.head.weight.shape == (len(HORIZONS), 32)
    x, dt = (t.double() for t in batch(k=40))  # long enough for the CfC to forget h_0
    seen = {}
    model.pool.register_forward_hook(lambda m, a, out: seen.update(ctx=out))
    logits = model(x, dt)
    (d_ctx,) = torch.autograd.grad(logits.sum(), seen["ctx"])
    expected = (1 - cfg.head_aux_weight) * model.head.weight[:, :16].sum(0)  # the skip's share
    torch.testing.assert_close(d_ctx[:, 0], expected.expand(B, -1).detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(
        build("shared", seed=0).state_dict()["vsn.out.weight"], model.state_dict()["vsn.out.weight"].float()
    )
