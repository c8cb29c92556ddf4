"""The grn family (model.vsn.fused_grn): the reference against the VSN's own GRNs and weighting, the VSN's two
forms against each other, the kernels' argument checks; on a GPU the Triton kernels against the fp64
reference, their fakes (opcheck), bitwise repeats and a compiled VSN."""

from __future__ import annotations

import pytest
import torch

from perception.model.vsn import VSN, embed, select
from perception.ops.grn import (
    WEIGHT_NAMES,
    _kernels,
    grn_kernels_take,
    grn_select,
    grn_select_fwd,
    grn_select_ref,
)


def grn_inputs(n=64, f=5, d=8, device="cpu", dtype=torch.float64, seed=0):
    """x (n, f), v (n, f) softmax weights, the embedding's weights (f, d) and one variable GRN's weights stacked
    over f, nonzero biases."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    tensors = [r(n, f), torch.softmax(r(n, f), -1), r(f, d), r(f, d), r(f, d, d) / 3, r(f, d) / 3]
    tensors += [r(f, 2 * d, d) / 3, r(f, 2 * d) / 3, 1 + r(f, d) / 3, r(f, d) / 3]
    return [t.to(device=device, dtype=dtype) for t in tensors]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_the_reference_is_the_variable_grns_times_the_selection_weights():
    vsn = VSN(5, 8, 16).double()
    vsn.reset_parameters(torch.Generator().manual_seed(0))
    g = vsn.var_grn
    for p in (g.ln_w, g.ln_b):  # ones and zeros at init: perturb them so that they count
        p.data += torch.randn(p.shape, dtype=torch.float64) / 3
    x, logits = torch.randn(3, 7, 5, dtype=torch.float64), torch.randn(3, 7, 5, dtype=torch.float64)
    want, v = select(logits, g(embed(x, vsn.embed_w, vsn.embed_b)))  # the unfused VSN's GRNs, then its weighting
    weights = (vsn.embed_w, vsn.embed_b, g.fc1_w, g.fc1_b, g.fc2_w, g.fc2_b, g.ln_w, g.ln_b)
    got = grn_select_ref(x, v, *weights).flatten(-2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_fused_vsn_equals_the_unfused_one_with_gradients():
    torch.manual_seed(0)
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    results = []
    for fused in (False, True):
        vsn = VSN(6, 4, 16, fused_grn=fused, backend="ref").double()
        vsn.reset_parameters(torch.Generator().manual_seed(1))
        leaf = x.clone().requires_grad_()
        out, v = vsn(leaf)
        (out.square().sum() + (v * torch.arange(6.0, dtype=torch.float64)).sum()).backward()
        results.append([out, v, leaf.grad, *(p.grad for _, p in sorted(vsn.named_parameters()))])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_kernels_are_taken_only_for_cuda_tensors():
    x = torch.zeros(4, 3)
    assert not grn_kernels_take("auto", x, 8)  # CPU tensors
    assert not grn_kernels_take("ref", x, 8)
    with pytest.raises(ValueError, match=r"model.ops=cuda needs CUDA tensors; got a CPU tensor"):
        grn_kernels_take("cuda", x, 8)
    assert torch.equal(
        grn_select(*grn_inputs(n=4, f=3, dtype=torch.float32)),
        grn_select(*grn_inputs(n=4, f=3, dtype=torch.float32), backend="ref"),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t: t.__setitem__(1, t[1][:, :2]),
            r"grn_select_fwd: v must be \(N, F\) = \[16, 3\], got shape \[16, 2\]",
        ),
        (lambda t: t.__setitem__(4, t[4][:, :, :4]), r"fc1_w must be \[3, 8, 8\], got \[3, 8, 4\]"),
        (lambda t: t.__setitem__(3, t[3][:, :4]), r"embed_b must be \[3, 8\], got \[3, 4\]"),
        (lambda t: t.__setitem__(0, t[0].reshape(16, 3, 1)), r"x must be \(N, F\), got shape \[16, 3, 1\]"),
        (
            lambda t: t.__setitem__(9, t[9].to(torch.int64)),
            r"ln_b must be float32, bfloat16 or float16, got torch.int64",
        ),
    ],
)
def test_the_kernels_checks_name_the_argument_and_what_was_expected(change, message):
    tensors = [t.to("meta") for t in grn_inputs(n=16, f=3, dtype=torch.float32)]  # the fake runs the checks
    change(tensors)
    with pytest.raises(RuntimeError, match=message):
        grn_select_fwd(*tensors)


def test_a_width_the_kernels_do_not_take_says_so():
    tensors = [t.to("meta") for t in grn_inputs(n=16, f=3, d=16, dtype=torch.float32)]
    with pytest.raises(RuntimeError, match=r"kernels take d_var in \(2, 4, 8\), got 16 \(use model.ops=ref\)"):
        grn_select_fwd(*tensors)


cuda = pytest.mark.skipif(not torch.cuda.is_available() or _kernels() is None, reason="needs a CUDA GPU and Triton")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("n, f, d", [(4099, 65, 8), (1000, 7, 4), (33, 3, 4)])
def test_the_kernels_equal_the_fp64_reference_with_gradients(n, f, d):
    inputs = grn_inputs(n=n, f=f, d=d, device="cuda")
    leaves64 = [t.clone().requires_grad_() for t in inputs]
    out64 = grn_select_ref(*leaves64)
    grad = torch.randn(out64.shape, dtype=torch.float64, device="cuda")
    out64.backward(grad)
    leaves32 = [t.float().requires_grad_() for t in inputs]
    out32 = grn_select(*leaves32, backend="cuda")
    out32.backward(grad.float())
    assert relative(out32, out64) < 1e-5
    for name, a, b in zip(("x", "v", *WEIGHT_NAMES), leaves32, leaves64):
        assert relative(a.grad, b.grad) < 1e-5, name


@pytest.mark.cuda
@cuda
def test_bf16_features_give_the_reference_to_bf16_rounding():
    inputs = grn_inputs(n=2000, f=65, d=8, device="cuda")
    x16 = inputs[0].to(torch.bfloat16)
    want = grn_select_ref(x16.double(), *inputs[1:])
    got = grn_select(x16, *[t.float() for t in inputs[1:]], backend="cuda")
    assert got.dtype == torch.float32  # promoted with v's
    assert relative(got, want) < 1e-5


@pytest.mark.cuda
@cuda
def test_a_bf16_output_is_the_fp32_one_rounded_once_with_its_gradients():
    """out_dtype=bf16 (the VSN's under autocast): the kernels round their fp32 result once, as a cast after would,
    and take a bf16 gradient as its fp32 upcast: the gradients of the fp32 call with that upcast, to fp32 rounding
    (the backward compiled for a bf16 gradient contracts its multiply-adds differently: not bitwise)."""
    inputs = [t.float() for t in grn_inputs(n=3000, f=65, d=8, device="cuda")]
    grad16 = torch.randn(3000, 65, 8, device="cuda").to(torch.bfloat16)
    results = []
    for out_dtype, grad in ((None, grad16.float()), (torch.bfloat16, grad16)):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = grn_select(*leaves, out_dtype=out_dtype, backend="cuda")
        out.backward(grad)
        results.append((out, [leaf.grad for leaf in leaves]))
    (out32, grads32), (out16, grads16) = results
    assert out16.dtype == torch.bfloat16
    assert torch.equal(out16, out32.to(torch.bfloat16))
    for name, a, b in zip(("x", "v", *WEIGHT_NAMES), grads32, grads16):
        assert relative(b, a) < 1e-5, name


@pytest.mark.cuda
@cuda
def test_the_custom_ops_fakes_and_autograd_pass_opcheck():
    inputs = [t.float().requires_grad_() for t in grn_inputs(n=300, f=5, d=8, device="cuda")]
    torch.library.opcheck(
        grn_select_fwd, inputs, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    )


@pytest.mark.cuda
@cuda
def test_two_calls_give_the_same_bits():
    inputs = grn_inputs(n=20000, f=65, d=8, device="cuda", dtype=torch.float32)
    grad = torch.randn(20000, 65, 8, device="cuda")
    results = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        grn_select(*leaves, backend="cuda").backward(grad)
        results.append([leaf.grad for leaf in leaves])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.cuda
@cuda
def test_the_compiled_fused_vsn_matches_the_unfused_one_under_autocast():
    torch.manual_seed(0)
    x = torch.randn(2, 600, 65, device="cuda")
    results = []
    for fused in (False, True):
        vsn = VSN(65, 8, 128, fused_grn=fused)
        vsn.reset_parameters(torch.Generator().manual_seed(1))
        vsn.compile_regions()
        vsn = vsn.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, v = vsn(x)
        out.float().square().mean().backward()
        results.append([out.float(), v.float(), *(p.grad for _, p in sorted(vsn.named_parameters()))])
    for a, b in zip(*results):
        assert relative(a, b) < 3e-2  # bf16 GEMMs in the unfused form, fp32 in the kernels
