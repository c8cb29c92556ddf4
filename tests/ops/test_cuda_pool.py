"""Pool kernels (attention_pool, inverted_pool, inv_pool_merge) against the fp64 references.

CUDA tests carry @pytest.mark.cuda and skip without a GPU; CPU tests guard the `model.ops=cuda` message on
machines without kernels and the CPU path (the sources' checks are in test_dispatch_and_build.py)."""

from __future__ import annotations

import pytest
import torch

from perception.ops import (
    attention_pool,
    attention_pool_ref,
    extension,
    inv_pool_merge,
    inv_pool_merge_ref,
    inverted_pool,
    inverted_pool_ref,
)

FP32_EPS = 2.0**-23


# ---------------------------------------------------------------- CPU -------------------------------


def test_cuda_backend_without_kernels_says_what_to_do(monkeypatch, tmp_path):
    lnb, q = torch.randn(2, 5, 16), torch.randn(3, 16)
    extension._load.cache_clear()
    try:
        # No usable GPU (forced, so the check runs the same on GPU machines).
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert extension.available() is False
        with pytest.raises(extension.ExtensionUnavailable, match=r"model\.ops=cuda.*no CUDA GPU.*model\.ops=ref"):
            attention_pool(lnb, q, backend="cuda")
        # A GPU but neither a prebuilt library nor nvcc: the message names the build command.
        extension._load.cache_clear()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(extension, "LIB_DIR", tmp_path / "lib")
        monkeypatch.setattr(extension, "nvcc_path", lambda: None)
        with pytest.raises(extension.ExtensionUnavailable, match=r"python -m perception\.ops\.build"):
            inverted_pool(lnb, backend="cuda")
        # auto never raises and falls back to the reference.
        out = attention_pool(lnb, q, backend="auto")
        torch.testing.assert_close(out, attention_pool_ref(lnb, q))
    finally:
        extension._load.cache_clear()


def test_reference_backend_runs_on_cpu():
    lnb, q = torch.randn(2, 7, 16), torch.randn(5, 16)
    ctx = attention_pool(lnb, q, backend="ref")
    merged = inv_pool_merge(ctx, inverted_pool(lnb, backend="ref"), backend="ref")
    assert merged.shape == (2, 5, 16) and torch.isfinite(merged).all()


# ---------------------------------------------------------------- CUDA ------------------------------

cuda = pytest.mark.cuda


@pytest.fixture(scope="module")
def dev():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    extension.require()  # a GPU without loadable kernels is a failure, with the reason
    torch.backends.cuda.matmul.allow_tf32 = False  # the eager fp32 baseline must be true fp32
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda")


def kernel_pool(lnb, q):
    return attention_pool(lnb, q, backend="cuda")


def kernel_inverted(lnb):
    return inverted_pool(lnb, backend="cuda")


def kernel_merge(ctx, inv):
    return inv_pool_merge(ctx, inv, backend="cuda")


OPS = {
    "attention_pool": (kernel_pool, attention_pool_ref),
    "inverted_pool": (kernel_inverted, inverted_pool_ref),
    "inv_pool_merge": (kernel_merge, inv_pool_merge_ref),
}


def make_inputs(op: str, B: int, K: int, D: int, Q: int, seed: int, device) -> list[torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if op == "attention_pool":
        lnb = torch.randn(B, K, D, generator=gen)
        q = torch.randn(Q, D, generator=gen) * 2.0 / D**0.5  # sharper than N(0, 1/D): a real softmax
        return [lnb.to(device), q.to(device)]
    if op == "inverted_pool":
        return [torch.randn(B, K, D, generator=gen).to(device)]
    return [torch.randn(B, Q, D, generator=gen).to(device), torch.randn(B, D, generator=gen).to(device)]


def forward_backward(fn, inputs, grad_seed: int):
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*xs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(out.device, out.dtype)
    grads = torch.autograd.grad(out, xs, g)
    return [out.detach(), *grads]


def rel_err(x: torch.Tensor, exact: torch.Tensor) -> float:
    return ((x.double() - exact).norm() / exact.norm().clamp_min(1e-300)).item()


def assert_as_accurate_as_eager(op: str, inputs, label: str):
    kernel, ref = OPS[op]
    got = forward_backward(kernel, inputs, grad_seed=7)
    eager = forward_backward(ref, inputs, grad_seed=7)
    exact = forward_backward(ref, [x.double() for x in inputs], grad_seed=7)
    names = ["out"] + [f"d_input{i}" for i in range(len(inputs))]
    for name, k, e, x in zip(names, got, eager, exact):
        assert k.dtype == torch.float32 and k.shape == x.shape, f"{label} {name}: {k.dtype} {tuple(k.shape)}"
        if x.norm() <= 1e-9 * x.numel() ** 0.5:  # e.g. d_q at K = 1 (softmax constant): exactly zero
            assert k.abs().max().item() <= 1e-5, f"{label} {name}: exact zero, kernel gives {k.abs().max():.3g}"
            continue
        err_k, err_e = rel_err(k, x), rel_err(e, x)
        assert err_k <= 2 * err_e + FP32_EPS, f"{label} {name}: kernel rel err {err_k:.3g} vs eager {err_e:.3g}"


@cuda
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("Q", [1, 5])
def test_matches_fp64_reference_as_well_as_eager(dev, op, Q):
    for seed in range(3):  # fresh inputs per seed
        assert_as_accurate_as_eager(op, make_inputs(op, 4, 1000, 128, Q, seed, dev), f"{op} Q={Q} seed={seed}")


@cuda
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("B", [1, 3, 64])
@pytest.mark.parametrize("K", [1, 7, 6000, 6001])
def test_sizes_off_every_block_size(dev, op, B, K):
    for Q in (1, 5):
        assert_as_accurate_as_eager(op, make_inputs(op, B, K, 128, Q, 100 + K + B, dev), f"{op} B={B} K={K} Q={Q}")


@cuda
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("D", [16, 32, 64])
def test_model_widths_of_the_small_experiments(dev, op, D):
    assert_as_accurate_as_eager(op, make_inputs(op, 3, 333, D, 5, D, dev), f"{op} D={D}")


@cuda
@pytest.mark.parametrize("Q", [8, 9, 17])
def test_attention_pool_any_query_count(dev, Q):
    assert_as_accurate_as_eager("attention_pool", make_inputs("attention_pool", 3, 777, 64, Q, Q, dev), f"Q={Q}")


@cuda
@pytest.mark.parametrize("op", list(OPS))
def test_opcheck(dev, op):
    inputs = [x.requires_grad_(True) for x in make_inputs(op, 2, 70, 32, 5, 3, dev)]
    torch.library.opcheck(getattr(torch.ops.perception, op).default, tuple(inputs))


@cuda
@pytest.mark.parametrize("op", list(OPS))
def test_central_differences_of_the_cuda_forward(dev, op):
    kernel, _ = OPS[op]
    inputs = make_inputs(op, 2, 8, 128, 5, 11, dev)
    analytic = forward_backward(kernel, inputs, grad_seed=5)
    out = analytic[0]
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dev)
    eps = 1e-2
    gen = torch.Generator().manual_seed(13)
    for i, x in enumerate(inputs):
        for flat in torch.randint(0, x.numel(), (24,), generator=gen).tolist():
            plus, minus = [t.clone() for t in inputs], [t.clone() for t in inputs]
            plus[i].view(-1)[flat] += eps
            minus[i].view(-1)[flat] -= eps
            with torch.no_grad():
                numeric = ((kernel(*plus) - kernel(*minus)) * g).sum().item() / (2 * eps)
            got = analytic[1 + i].view(-1)[flat].item()
            err = abs(got - numeric)
            assert err <= 5e-3 or err <= 5e-2 * abs(numeric), f"{op} input {i} [{flat}]: {got} vs {numeric}"


@cuda
@pytest.mark.parametrize("op", list(OPS))
def test_every_output_element_written(dev, op, monkeypatch):
    monkeypatch.setenv("PERCEPTION_OPS_POISON", "1")  # outputs are NaN-filled before every launch
    for B, K, D in [(3, 6001, 128), (1, 7, 32), (2, 65, 16)]:
        results = forward_backward(OPS[op][0], make_inputs(op, B, K, D, 5, K, dev), grad_seed=1)
        for r in results:
            assert torch.isfinite(r).all(), f"{op} B={B} K={K} D={D}: unwritten (NaN) elements"
    monkeypatch.delenv("PERCEPTION_OPS_POISON")


@cuda
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("Q", [1, 5])
def test_gradients_bitwise_identical_run_to_run(dev, op, Q):
    inputs = make_inputs(op, 64, 6000, 128, Q, 21, dev)
    first = forward_backward(OPS[op][0], inputs, grad_seed=2)
    second = forward_backward(OPS[op][0], inputs, grad_seed=2)
    for a, b in zip(first, second):
        assert torch.equal(a, b), f"{op} Q={Q}: results differ between two identical runs"


@cuda
def test_auto_takes_kernels_on_cuda_and_falls_back_for_other_dtypes(dev):
    lnb, q = make_inputs("attention_pool", 2, 50, 32, 5, 1, dev)
    assert extension.available()
    torch.testing.assert_close(attention_pool(lnb, q, backend="auto"), kernel_pool(lnb, q), rtol=0, atol=0)
    lnb64, q64 = lnb.double(), q.double()
    torch.testing.assert_close(attention_pool(lnb64, q64, backend="auto"), attention_pool_ref(lnb64, q64))
    with pytest.raises(RuntimeError, match="float32"):
        attention_pool(lnb64, q64, backend="cuda")


@cuda
def test_merged_inverted_pool_reaches_the_output(dev):
    lnb, q = make_inputs("attention_pool", 2, 40, 32, 5, 2, dev)
    base = inv_pool_merge(kernel_pool(lnb, q), kernel_inverted(lnb), backend="cuda")
    inv = kernel_inverted(lnb) + 0.5
    moved = inv_pool_merge(kernel_pool(lnb, q), inv, backend="cuda")
    torch.testing.assert_close(moved - base, torch.full_like(base, 0.5))


POOL_BAD_INPUTS = {
    "pool dtype": (lambda x, q: attention_pool(x.double(), q, "cuda"), "float32, got lnb Double and q Float"),
    "pool rank": (lambda x, q: attention_pool(x[0], q, "cuda"), r"lnb must be \(B, K, D\), got shape \[40, 32\]"),
    "pool q width": (
        lambda x, q: attention_pool(x, q[:, :16], "cuda"),
        r"q must be \(Q, D\) with D = 32, got shape \[5, 16\]",
    ),
    "pool width": (
        lambda x, q: attention_pool(x[..., :24], q[:, :24], "cuda"),
        r"D in \{16, 32, 64, 128\}, got D = 24",
    ),
    "inverted rank": (
        lambda x, q: inverted_pool(x[0], "cuda"),
        r"inverted_pool: lnb must be \(B, K, D\), got shape \[40, 32\]",
    ),
    "inverted width": (
        lambda x, q: inverted_pool(x[..., :24], "cuda"),
        r"inverted_pool: kernels take D in .*got D = 24",
    ),
    "merge shapes": (
        lambda x, q: inv_pool_merge(x[:, :5], x[:, 0, :16], "cuda"),
        r"got ctx \[2, 5, 32\] and inv \[2, 16\]",
    ),
}


@cuda
@pytest.mark.parametrize("case", sorted(POOL_BAD_INPUTS))
def test_bad_inputs_name_the_argument_and_the_expectation(dev, case):
    call, message = POOL_BAD_INPUTS[case]
    lnb, q = make_inputs("attention_pool", 2, 40, 32, 5, 3, dev)
    with pytest.raises(RuntimeError, match=message):
        call(lnb, q)
    assert torch.isfinite(attention_pool(lnb, q, "cuda")).all()  # the process and the library still work


@cuda
def test_inverted_pool_simt_fallback_as_accurate_as_eager(dev, monkeypatch):
    # The default path runs the GEMMs on tensor cores; the fp32 SIMT kernels stay selectable per call.
    monkeypatch.setenv("PERCEPTION_INVERTED_SIMT", "1")
    for B, K, D in [(3, 6001, 128), (2, 7, 16)]:
        inputs = make_inputs("inverted_pool", B, K, D, 5, K + D, dev)
        assert_as_accurate_as_eager("inverted_pool", inputs, f"SIMT B={B} K={K} D={D}")


@cuda
@pytest.mark.parametrize("op", ["attention_pool", "inverted_pool"])
def test_inputs_at_an_odd_offset_are_copied_to_aligned_rows(dev, op):
    """Contiguous views 4 bytes past a 16-byte boundary (the kernels read rows as float4 and with cp.async)
    give the same bits as aligned copies, forward and backward."""
    inputs = make_inputs(op, 3, 65, 32, 5, 4, dev)
    shifted = []
    for x in inputs:
        view = torch.empty(x.numel() + 1, device=dev)[1:].view(x.shape)
        view.copy_(x)
        shifted.append(view.requires_grad_(True))
    assert all(v.data_ptr() % 16 != 0 for v in shifted)
    aligned = [x.clone().requires_grad_(True) for x in inputs]
    results = []
    for xs in (aligned, shifted):
        out = OPS[op][0](*xs)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dev)
        results.append([out.detach(), *torch.autograd.grad(out, xs, g)])
    for a, s in zip(*results):
        assert torch.equal(a, s), f"{op}: an input at an odd offset changed the result"
