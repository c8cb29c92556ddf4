"""CUDA CfC scan (`perception::cfc_scan`) against the fp64 reference loop, on both kernel paths:
`cluster` (sm_90, two blocks per batch row) and `portable` (one block per row, forced by
PERCEPTION_CFC_PATH). Skips without a GPU; imports cleanly on CPU."""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import pytest
import torch

from perception.ops import cfc_scan_ref

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NAMES = ("x_proj", "ts", "h0", "w_rec", "w_out", "b_out")


@pytest.fixture(scope="module")
def op():
    from perception.ops import extension

    extension.require()
    return torch.ops.perception.cfc_scan


def _paths():
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        return ["cluster", "portable"]
    return ["portable"]


@pytest.fixture(params=_paths())
def path(request, monkeypatch):
    monkeypatch.setenv("PERCEPTION_CFC_PATH", request.param)
    return request.param


def make_inputs(b: int, k: int, d: int, seed: int) -> list[torch.Tensor]:
    """Realistic scales: xavier weights as CfC.reset_parameters draws them, LayerNorm-like inputs,
    log-normal time spans around the median (1) with rare long gaps."""
    g = torch.Generator().manual_seed(seed)

    def uni(shape, bound):
        return (torch.rand(shape, generator=g) * 2 - 1) * bound

    x_proj = torch.randn(b, k, d, generator=g)  # (B, K, U)
    ts = torch.exp(0.7 * torch.randn(b, k, generator=g))  # (B, K)
    ts[torch.rand(b, k, generator=g) < 0.01] *= 30.0
    h0 = 0.5 * torch.randn(b, d, generator=g)  # (B, D)
    w_rec = uni((d, d), math.sqrt(6.0 / (2 * d)))
    w_out = uni((4 * d, d), math.sqrt(6.0 / (5 * d)))
    b_out = uni((4 * d,), 0.1)
    return [t.cuda() for t in (x_proj, ts, h0, w_rec, w_out, b_out)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


_REF: dict = {}


def reference(b, k, d, seed, grads: bool):
    """fp64 reference h_seq (and gradients of sum(h_seq * G)), cached across paths."""
    key = (b, k, d, seed, grads)
    if key not in _REF:
        inputs = [t.double().requires_grad_(grads) for t in make_inputs(b, k, d, seed)]
        with torch.set_grad_enabled(grads):
            out = cfc_scan_ref(*inputs)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64).cuda()
        gr = torch.autograd.grad(out, inputs, cot) if grads else None
        _REF[key] = (out.detach(), cot, gr)
    return _REF[key]


def run_op(op, inputs, cot=None):
    inputs = [t.detach().clone().requires_grad_(cot is not None) for t in inputs]
    out = op(*inputs)
    if cot is None:
        return out, None
    return out, torch.autograd.grad(out, inputs, cot.float())


@pytest.mark.parametrize("k", [1, 2, 17, 256, 6000])
@pytest.mark.parametrize("b", [1, 3, 64])
def test_forward_matches_reference(op, path, b, k):
    ref, _, _ = reference(b, k, 128, seed=10 * b + k, grads=False)
    out, _ = run_op(op, make_inputs(b, k, 128, seed=10 * b + k))
    assert out.shape == (b, k, 128)
    assert rel(out, ref) < (1e-3 if k > 256 else 1e-4)


@pytest.mark.parametrize(("b", "k", "tol"), [(3, 256, 5e-3), (64, 256, 5e-3), (64, 6000, 2e-2)])
def test_gradients_match_fp64_reference(op, path, b, k, tol):
    ref_out, cot, ref_grads = reference(b, k, 128, seed=7 + b + k, grads=True)
    out, grads = run_op(op, make_inputs(b, k, 128, seed=7 + b + k), cot)
    assert rel(out, ref_out) < tol
    for name, g, r in zip(NAMES, grads, ref_grads):
        assert g.shape == r.shape, name
        assert rel(g, r) < tol, f"d_{name}: relative error {rel(g, r):.2e} >= {tol}"


@pytest.mark.parametrize("d", [16, 32, 64])
def test_other_widths_and_odd_sizes(op, path, d):
    ref_out, cot, ref_grads = reference(3, 17, d, seed=d, grads=True)
    out, grads = run_op(op, make_inputs(3, 17, d, seed=d), cot)
    assert rel(out, ref_out) < 1e-4
    for name, g, r in zip(NAMES, grads, ref_grads):
        assert rel(g, r) < 5e-3, name


def test_central_differences(op, path):
    """Directional derivatives of L = sum(h_seq * G) by central differences of the kernel itself,
    B=2, K=8, D=128, eps=1e-2, fresh random inputs and directions."""
    seed = int(torch.randint(0, 2**30, ()).item())
    inputs = make_inputs(2, 8, 128, seed)
    gen = torch.Generator().manual_seed(seed + 3)
    cot = torch.randn(2, 8, 128, generator=gen).cuda()
    _, grads = run_op(op, inputs, cot)
    eps = 1e-2
    for i, name in enumerate(NAMES):
        v = torch.randn(inputs[i].shape, generator=gen).cuda()
        v = v / v.norm()
        plus = [t.clone() for t in inputs]
        minus = [t.clone() for t in inputs]
        plus[i] += eps * v
        minus[i] -= eps * v
        with torch.no_grad():
            numeric = ((op(*plus).double() - op(*minus).double()) * cot.double()).sum().item() / (2 * eps)
        analytic = (grads[i].double() * v.double()).sum().item()
        err = abs(numeric - analytic)
        assert err <= 5e-3 or err <= 5e-2 * abs(numeric), f"d_{name}: numeric {numeric:.6g} analytic {analytic:.6g}"


def test_bitwise_deterministic(op, path):
    inputs = make_inputs(64, 256, 128, seed=99)
    cot = torch.randn(64, 256, 128, device="cuda")
    first_out, first = run_op(op, inputs, cot)
    for _ in range(2):
        out, grads = run_op(op, inputs, cot)
        assert torch.equal(out, first_out)
        for name, g, f in zip(NAMES, grads, first):
            assert torch.equal(g, f), f"d_{name} differs between runs"


def test_paths_agree(op, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cluster path needs sm_90")
    inputs = make_inputs(5, 300, 128, seed=5)
    cot = torch.randn(5, 300, 128, device="cuda")
    results = {}
    for p in ("cluster", "portable"):
        monkeypatch.setenv("PERCEPTION_CFC_PATH", p)
        results[p] = run_op(op, inputs, cot)
    assert rel(results["cluster"][0], results["portable"][0]) < 1e-5
    for name, a, b in zip(NAMES, results["cluster"][1], results["portable"][1]):
        assert rel(a, b) < 1e-4, name


def test_finite_at_production_length_with_model_init(op, path):
    """K=6000 through the model's own CfC module (its init, its input GEMM), long gaps included."""
    from perception.model.cfc import CfC
    from perception.model.init import module_generator

    cfc = CfC(128, "cuda")
    cfc.reset_parameters(module_generator(0, "cfc"))
    cfc = cfc.cuda()
    g = torch.Generator().manual_seed(4)
    lnb = torch.randn(64, 6000, 128, generator=g).cuda().requires_grad_()
    ts = torch.exp(torch.randn(64, 6000, generator=g)).cuda()
    ts[:, ::500] = 60.0
    h0 = torch.randn(64, 128, generator=g).cuda()
    h_seq = cfc(lnb, ts, h0)
    (h_seq[:, -1].sum() + h_seq.mean()).backward()
    assert torch.isfinite(h_seq).all()
    assert h_seq.abs().max() <= 1.0 + 1e-5  # a convex mix of two tanh values
    for name, p in [("lnb", lnb), *cfc.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_outputs_fully_written(op, path, monkeypatch):
    """Outputs NaN-filled before every launch (PERCEPTION_OPS_POISON), and the caching allocator's free blocks
    poisoned with NaN too: every output element must be written."""
    monkeypatch.setenv("PERCEPTION_OPS_POISON", "1")
    inputs = make_inputs(3, 33, 128, seed=3)
    cot = torch.randn(3, 33, 128, device="cuda")
    clean_out, clean = run_op(op, inputs, cot)
    poison = torch.full((64 << 20,), float("nan"), device="cuda")
    del poison
    out, grads = run_op(op, inputs, cot)
    assert torch.equal(out, clean_out)
    for name, g, c in zip(NAMES, grads, clean):
        assert torch.isfinite(g).all() and torch.equal(g, c), name


def test_public_wrapper_and_opcheck(op):
    from perception.ops import cfc_scan

    inputs = make_inputs(2, 8, 32, seed=1)
    torch.testing.assert_close(cfc_scan(*inputs, backend="cuda"), op(*inputs), rtol=0, atol=0)
    torch.testing.assert_close(
        cfc_scan(*inputs, backend="cuda"), cfc_scan(*inputs, backend="ref"), rtol=1e-4, atol=1e-5
    )
    args = [t.clone().requires_grad_() for t in inputs]
    torch.library.opcheck(torch.ops.perception.cfc_scan.default, args)
    gates = torch.randn(2, 8, 128, device="cuda")
    z = torch.tanh(torch.randn(2, 8, 32, device="cuda"))
    bwd_args = (torch.randn(2, 8, 32, device="cuda"), gates, z, inputs[1], inputs[3], inputs[4])
    torch.library.opcheck(torch.ops.perception.cfc_scan_bwd.default, bwd_args)


BAD_INPUTS = {
    "dtype": (lambda a: [a[0].double(), *a[1:]], "x_proj must be float32"),
    "shape": (lambda a: [*a[:4], a[4][:64], a[5]], r"w_out must have shape \[128, 32\], got \[64, 32\]"),
    "device": (lambda a: [a[0], a[1].cpu(), *a[2:]], "ts must be on cuda:0, got cpu"),
    "rank": (lambda a: [a[0][0], *a[1:]], r"x_proj must be \(B, K, U\), got \[4, 32\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_name_the_argument(op, case):
    change, message = BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match=message):
        op(*change(make_inputs(2, 4, 32, seed=2)))


def test_unsupported_width_and_path_are_named(op, monkeypatch):
    with pytest.raises(RuntimeError, match=r"D = U in \{16, 32, 64, 128\}, got D = 48"):
        op(*make_inputs(1, 3, 48, seed=2))
    monkeypatch.setenv("PERCEPTION_CFC_PATH", "fastest")
    with pytest.raises(RuntimeError, match="PERCEPTION_CFC_PATH=fastest: expected one of auto, cluster, portable"):
        op(*make_inputs(1, 3, 32, seed=2))


def test_library_carries_sm89_and_sm90_code(op):
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed")
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "perception_ops" in line and line.rstrip().endswith(".so")})
    assert libs, "the perception_ops library is not mapped into this process"
    listing = subprocess.run([cuobjdump, "--list-elf", libs[0]], capture_output=True, text=True, check=True).stdout
    archs = set(re.findall(r"sm_(\d+)", listing))
    assert {"89", "90"} <= archs, f"{libs[0]} carries {sorted(archs)}"


def test_auto_falls_back_to_the_reference_where_the_kernel_does_not_apply(op):
    from perception.ops import cfc_scan

    inputs = make_inputs(2, 5, 32, seed=4)
    torch.testing.assert_close(cfc_scan(*inputs, backend="auto"), op(*inputs), rtol=0, atol=0)
    wide = make_inputs(2, 5, 48, seed=4)  # D = 48: no kernel instance
    torch.testing.assert_close(cfc_scan(*wide, backend="auto"), cfc_scan_ref(*wide), rtol=0, atol=0)
    doubles = [t.double() for t in inputs]
    out = cfc_scan(*doubles, backend="auto")
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, cfc_scan_ref(*doubles), rtol=0, atol=0)


SM89_SHARED_BYTES = 99 * 1024  # the most shared memory one block may opt in to on sm_89 (the L40S)
SM89_REGISTERS_PER_BLOCK = 64 * 1024


@pytest.mark.parametrize("d", [16, 32, 64, 128])
def test_every_portable_kernel_fits_an_sm89_block(op, d):
    """The study's L40S run the portable kernels: each block's shared memory and registers, as built here,
    must fit sm_89's limits, which are below sm_90's (227 KiB)."""
    fwd_smem, bwd_smem, fwd_regs, bwd_regs, threads = torch.ops.perception.cfc_portable_resources(d)
    assert threads == 2 * d
    assert 0 < fwd_smem <= SM89_SHARED_BYTES and 0 < bwd_smem <= SM89_SHARED_BYTES, (fwd_smem, bwd_smem)
    assert 0 < fwd_regs * threads <= SM89_REGISTERS_PER_BLOCK, (fwd_regs, threads)
    assert 0 < bwd_regs * threads <= SM89_REGISTERS_PER_BLOCK, (bwd_regs, threads)
