"""CPU checks of the kernel plumbing: the sources follow one template per op family (schemas in
csrc/<family>.cpp, shared helpers in csrc/common.cuh, no atomics), the widths Python sends to the kernels are
the ones compiled, the fakes check what the kernels check, which inputs `auto` sends to the kernels, and
the mode of the library manifest that `python -m perception.ops.build` writes."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import perception.ops as ops
from perception.ops import (
    attention_pool_ref,
    build,
    cfc,
    cfc_scan_ref,
    extension,
    inv_pool_merge_ref,
    inverted_pool_ref,
    pool,
)

CSRC = extension.CSRC_DIR
REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("pool", "cfc")


# ------------------------------------------------------------- sources ------------------------------


def kernel_sources() -> list[Path]:
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".cpp", ".h"))


def test_no_atomics_in_kernel_sources():
    sources = kernel_sources()
    names = {p.name for p in sources}
    assert {"common.cuh", "pool.cu", "cfc_scan.cu"} <= names, f"kernel sources missing from {CSRC}: {sorted(names)}"
    # \bred: the PTX reduction `red.global`, not the `shared.global` of cp.async.
    offenders = [p.name for p in sources if re.search(r"atomicAdd|atomic_add|\bred\.global", p.read_text())]
    assert offenders == [], f"atomics in {offenders}: cross-block sums must be partials + fixed-order reduce"


def test_no_flag_trades_the_activations_accuracy_for_speed():
    # the CfC kernels' tanh_acc is tanhf: within 2 ulp only while nvcc keeps its accurate math library
    flags = extension.compile_flags()["extra_cuda_cflags"]
    fast = [f for f in flags if re.search(r"fast.math|ftz|prec.div|prec.sqrt", f)]
    assert fast == [], f"extension.compile_flags() extra_cuda_cflags {fast}: the CfC activations assume accurate math"


def test_every_family_follows_the_template():
    """Schema csrc/<family>.cpp, kernels csrc/<family>*.cu on common.cuh; one module ops/<family>.py with the
    wrapper's "can the kernel take this?" check, the references, the fakes and autograd and the register()
    that extension.py calls; tests/ops/test_cuda_<family>.py and benchmarks/ops_<family>.py."""
    for family in FAMILIES:
        assert "m.def(" in (CSRC / f"{family}.cpp").read_text(), f"csrc/{family}.cpp holds no schema"
        kernels = sorted(CSRC.glob(f"{family}*.cu"))
        assert kernels, f"no csrc/{family}*.cu"
        for cu in kernels:
            assert '#include "common.cuh"' in cu.read_text(), f"{cu.name} does not build on common.cuh"
        module = (CSRC.parent / f"{family}.py").read_text()
        for part in (f"_{family}_kernel_takes(", "_ref(", "register_fake(", "register_autograd(", "def register()"):
            assert part in module, f"ops/{family}.py holds no {part}"
        assert (REPO / "tests" / "ops" / f"test_cuda_{family}.py").exists()
        assert (REPO / "benchmarks" / f"ops_{family}.py").exists()
    assert sorted(p.stem for p in CSRC.glob("*.cpp")) == sorted(FAMILIES), "one schema file per family"
    assert set(extension.REGISTRATION_MODULES) == {f"perception.ops.{f}" for f in FAMILIES}


def test_shared_helpers_live_only_in_common_cuh():
    common = (CSRC / "common.cuh").read_text()
    helpers = {
        "poison_if_asked": r"void\s+poison_if_asked\s*\(",
        "cp_async16": r"void\s+cp_async16\s*\(",
        "cp_async_commit": r"void\s+cp_async_commit\s*\(",
        "aligned_contiguous": r"Tensor\s+aligned_contiguous\s*\(",
        "width dispatch": r"case\s+128\s*:",
    }
    for name, pattern in helpers.items():
        assert re.search(pattern, common), f"common.cuh lacks {name}"
        copies = [p.name for p in kernel_sources() if p.name != "common.cuh" and re.search(pattern, p.read_text())]
        assert copies == [], f"{name} is defined again in {copies}: use the one in common.cuh"


def test_python_widths_are_the_compiled_widths():
    common = (CSRC / "common.cuh").read_text()
    compiled = tuple(int(d) for d in re.findall(r"case (\d+): \{ constexpr int kD = \1;", common))
    assert compiled == ops.KERNEL_WIDTHS
    listed = re.search(r'kKernelWidths = "\{([\d, ]+)\}"', common).group(1)
    assert tuple(int(d) for d in listed.split(",")) == ops.KERNEL_WIDTHS
    ok = re.search(r"kernel_width_ok\(int64_t d\) \{ return ([^;]+);", common).group(1)
    assert tuple(int(d) for d in re.findall(r"d == (\d+)", ok)) == ops.KERNEL_WIDTHS


# ------------------------------------------------------------- fakes --------------------------------

# Runs in its own process: it defines the `perception` namespace from the schema files, which must not
# clash with a loaded library. Prints one line per check that failed.
FAKES = textwrap.dedent(r"""
    import re, sys
    from pathlib import Path
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    lib = torch.library.Library("perception", "DEF")
    for cpp in sorted(Path(sys.argv[1]).glob("*.cpp")):
        for m in re.finditer(r'm\.def\(((?:\s*"[^"]*")+)\s*\)', cpp.read_text()):
            lib.define("".join(re.findall(r'"([^"]*)"', m.group(1))))
    from perception.ops import extension
    extension.register_families()

    ops, e = torch.ops.perception, torch.empty
    B, K, D, Q = 2, 70, 32, 5
    valid = {
        "attention_pool": ((e(B, K, D), e(Q, D)), [(B, Q, D), (B, Q, 2), (B, K, Q)]),
        "attention_pool_bwd": ((e(B, Q, D), e(K, B, D).transpose(0, 1), e(Q, D), e(B, Q, D), e(B, Q, 2), e(B, K, Q)),
                               [(B, K, D), (Q, D)]),
        "inverted_pool": ((e(B, K, D),), [(B, D), (B, D, D), (B, D)]),
        "inverted_pool_bwd": ((e(B, D), e(K, B, D).transpose(0, 1), e(B, D, D), e(B, D), e(B, D)), [(B, K, D)]),
        "inv_pool_merge": ((e(Q, B, D).transpose(0, 1), e(B, D)), [(B, Q, D)]),
        "inv_pool_merge_bwd": ((e(B, Q, D),), [(B, D)]),
        "cfc_scan": ((e(B, K, D), e(B, K), e(B, D), e(D, D), e(4 * D, D), e(4 * D)), [(B, K, D)]),
        "cfc_scan_bwd": ((e(B, K, D), e(B, K, 4 * D), e(B, K, D), e(B, K), e(D, D), e(4 * D, D)),
                         [(B, K, D), (B, K, 4 * D), (B, D)]),
    }
    invalid = {
        "attention_pool width": ("attention_pool", (e(B, K, 24), e(Q, 24)), "D in {16, 32, 64, 128}, got D = 24"),
        "attention_pool dtype": ("attention_pool", (e(B, K, D, dtype=torch.float64), e(Q, D)), "float32"),
        "attention_pool q": ("attention_pool", (e(B, K, D), e(Q, 16)), "q must be"),
        "attention_pool_bwd scores": ("attention_pool_bwd", valid["attention_pool_bwd"][0][:5] + (e(B, K, Q + 1),),
                                      "scores must have shape"),
        "inverted_pool rank": ("inverted_pool", (e(K, D),), "lnb must be"),
        "inverted_pool_bwd attn": ("inverted_pool_bwd", (e(B, D), e(B, K, D), e(B, D, 16), e(B, D), e(B, D)),
                                   "attn must have shape"),
        "inv_pool_merge inv": ("inv_pool_merge", (e(B, Q, D), e(B, 16)), "inv must have shape"),
        "cfc_scan width": ("cfc_scan", (e(B, K, 48), e(B, K), e(B, 48), e(48, 48), e(192, 48), e(192)), "got D = 48"),
        "cfc_scan w_out": ("cfc_scan", (e(B, K, D), e(B, K), e(B, D), e(D, D), e(D, D), e(4 * D)), "w_out must"),
        "cfc_scan_bwd gates": ("cfc_scan_bwd", (e(B, K, D), e(B, K, D), e(B, K, D), e(B, K), e(D, D), e(4 * D, D)),
                               "gates must"),
    }
    with FakeTensorMode(allow_non_fake_inputs=True):
        for name, (args, shapes) in valid.items():
            out = getattr(ops, name)(*args)
            out = out if isinstance(out, tuple) else (out,)
            got = [tuple(t.shape) for t in out]
            if got != shapes or not all(t.is_contiguous() for t in out):
                print(f"{name}: fake gives {got} (contiguous {[t.is_contiguous() for t in out]}), kernel {shapes}")
        for case, (name, args, message) in invalid.items():
            try:
                getattr(ops, name)(*args)
                print(f"{case}: the fake accepted what the kernel rejects")
            except RuntimeError as exc:
                if message not in str(exc):
                    print(f"{case}: {str(exc)[:200]!r} does not name {message!r}")
    # Symbolic shapes (torch.compile's tracing): the checks become guards, not errors.
    for name in ("attention_pool", "inverted_pool", "cfc_scan"):
        args = [torch.randn(t.shape) for t in valid[name][0]]
        make_fx(getattr(ops, name), tracing_mode="symbolic")(*args)
    print("done")
""")


def test_fakes_check_what_the_kernels_check_and_return_their_outputs():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", FAKES, str(CSRC)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "done", run.stdout


# ------------------------------------------------------------- dispatch -----------------------------


def cfc_inputs(d: int, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(d)
    shapes = [(2, 3, d), (2, 3), (2, d), (d, d), (4 * d, d), (4 * d,)]
    return [(0.3 * torch.randn(s, generator=g)).to(dtype) for s in shapes]


@pytest.fixture
def kernels_claimed(monkeypatch):
    """Pretend the extension is usable for these (CPU) tensors; each op is replaced by a marker that records
    its name and answers with the reference's output."""
    calls = []

    def marker(name, answer):
        def kernel(*args):
            calls.append(name)
            return answer(*args)

        return staticmethod(kernel)

    namespace = {
        "cfc_scan": marker("cfc_scan", cfc_scan_ref),
        "attention_pool": marker("attention_pool", lambda lnb, q: (attention_pool_ref(lnb, q), None, None)),
        "inverted_pool": marker("inverted_pool", lambda lnb: (inverted_pool_ref(lnb), None, None)),
        "inv_pool_merge": marker("inv_pool_merge", inv_pool_merge_ref),
    }
    for family in (pool, cfc):  # each family module calls use_kernels from its own namespace
        monkeypatch.setattr(family, "use_kernels", lambda backend, *tensors: True)
    monkeypatch.setattr(torch.ops, "perception", type("Ns", (), namespace), raising=False)
    return calls


def pool_call(op: str, d: int, dtype, backend: str):
    g = torch.Generator().manual_seed(d)
    lnb = torch.randn(2, 5, d, generator=g).to(dtype)
    if op == "attention_pool":
        return ops.attention_pool(lnb, torch.randn(3, d, generator=g).to(dtype), backend=backend)
    if op == "inverted_pool":
        return ops.inverted_pool(lnb, backend=backend)
    return ops.inv_pool_merge(lnb, torch.randn(2, d, generator=g).to(dtype), backend=backend)


POOL_OPS = ("attention_pool", "inverted_pool", "inv_pool_merge")


@pytest.mark.parametrize("op", POOL_OPS)
@pytest.mark.parametrize("d", [16, 32, 64, 128])
def test_auto_sends_supported_pool_inputs_to_the_kernel(kernels_claimed, op, d):
    pool_call(op, d, torch.float32, "auto")
    assert kernels_claimed == [op]


@pytest.mark.parametrize("op", POOL_OPS)
@pytest.mark.parametrize("d, dtype", [(48, torch.float32), (32, torch.float64), (8, torch.float32)])
def test_auto_falls_back_to_the_pool_references(kernels_claimed, op, d, dtype):
    pool_call(op, d, dtype, "auto")
    assert kernels_claimed == [], f"{op} D={d} {dtype} reached the kernel"


@pytest.mark.parametrize("op", POOL_OPS)
def test_cuda_backend_leaves_unsupported_pool_inputs_to_the_kernel_check(kernels_claimed, op):
    pool_call(op, 48, torch.float32, "cuda")  # the kernel's own TORCH_CHECK names D then
    assert kernels_claimed == [op]


def test_auto_sends_supported_cfc_inputs_to_the_kernel(kernels_claimed):
    ops.cfc_scan(*cfc_inputs(32), backend="auto")
    assert len(kernels_claimed) == 1


@pytest.mark.parametrize("d, dtype", [(48, torch.float32), (32, torch.float64), (8, torch.float32)])
def test_auto_falls_back_to_the_reference_cfc(kernels_claimed, d, dtype):
    inputs = cfc_inputs(d, dtype)
    out = ops.cfc_scan(*inputs, backend="auto")
    assert kernels_claimed == [], f"D={d} {dtype} reached the kernel"
    torch.testing.assert_close(out, cfc_scan_ref(*inputs), rtol=0, atol=0)


def test_cuda_backend_leaves_unsupported_cfc_inputs_to_the_kernel_check(kernels_claimed):
    ops.cfc_scan(*cfc_inputs(48), backend="cuda")  # the kernel's own TORCH_CHECK names D then
    assert len(kernels_claimed) == 1


def test_build_writes_a_world_readable_manifest(monkeypatch, tmp_path):
    def fake_load(name, build_directory, **_):  # stands in for nvcc: leaves a library where load() would
        (Path(build_directory) / f"{name}.so").write_bytes(b"\x7fELF")

    monkeypatch.setattr(extension, "LIB_DIR", tmp_path / "lib")
    monkeypatch.setattr(extension, "nvcc_path", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    old_umask = os.umask(0o077)  # a root shell with a strict umask, as in the image build
    try:
        target = build.build()
    finally:
        os.umask(old_umask)
    manifest = extension.manifest_path()
    assert target.exists() and json.loads(manifest.read_text())["torch"] == torch.__version__
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o644
