"""model.compile_trunk: the VSN and Mamba2 blocks compiled with static shapes give the eager model's
outputs and gradients, without graph breaks, under the same parameter names (checkpoints load)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig


def _model(compiled: bool) -> PerceptionModel:
    cfg = ModelConfig(d_model=16, ops="ref", compile_trunk=compiled, mamba=MambaConfig(n_layers=1, d_state=8, headdim=8, chunk=16))
    model = PerceptionModel(cfg, n_features=6, horizons=[2, 5], seed=0)
    model.set_dt_scale(1.0)
    return model


def test_the_compiled_trunk_matches_eager_without_graph_breaks():
    x, dt = torch.randn(3, 32, 6, generator=torch.Generator().manual_seed(1)), torch.ones(3, 32)
    counters.clear()
    runs = {}
    for compiled in (False, True):
        model = _model(compiled)
        logits = model(x, dt)
        logits.sum().backward()
        runs[compiled] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                          list(model.state_dict()))
    (eager, eager_grads, eager_names), (comp, comp_grads, comp_names) = runs[False], runs[True]
    assert comp_names == eager_names
    torch.testing.assert_close(comp, eager, rtol=1e-5, atol=1e-6)
    assert eager_grads.keys() == comp_grads.keys()
    for name in eager_grads:
        torch.testing.assert_close(comp_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("chunk", [64, 128])
def test_the_compiled_trunk_matches_eager_at_production_size_on_cuda(chunk):
    """Production widths and K (B small): each compiled module against its eager twin, in training
    (with gradients) and in evaluation (no_grad), fp32 without TF32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = dict(d_model=128, ops="ref", mamba=MambaConfig(chunk=chunk))
    eager = PerceptionModel(ModelConfig(**cfg), n_features=65, horizons=[30, 6000], seed=0).cuda()
    compiled = PerceptionModel(ModelConfig(**cfg, compile_trunk=True), n_features=65, horizons=[30, 6000], seed=0).cuda()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6000, 65, generator=g).cuda()
    h_in = torch.randn(4, 6000, 128, generator=g).cuda()
    report = []
    for name, inp, get in (("vsn", x, lambda m: m.vsn), ("mamba0", h_in, lambda m: m.mamba.layers[0])):
        outs = {}
        for label, model in (("eager", eager), ("compiled", compiled)):
            module = get(model)
            module.zero_grad(set_to_none=True)
            leaf = inp.clone().requires_grad_()
            out = module(leaf)
            out = out[0] if isinstance(out, tuple) else out
            out.square().mean().backward()
            with torch.no_grad():
                ev = module(inp)
                ev = ev[0] if isinstance(ev, tuple) else ev
            grads = [p.grad for _, p in sorted(module.named_parameters())]
            outs[label] = (out.detach(), leaf.grad, ev, *grads)
        names = ["train out", "input grad", "eval out"] + [f"grad {n}" for n, _ in sorted(get(eager).named_parameters())]
        for i, what in enumerate(names):
            a, b = outs["compiled"][i], outs["eager"][i]
            rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
            report.append(f"{name} {what}: max rel error {rel:.2e}")
    print("\n".join(report))
    assert all(float(line.rsplit(" ", 1)[1]) < 1e-3 for line in report), "\n".join(report)
