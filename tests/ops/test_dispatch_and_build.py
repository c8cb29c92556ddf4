"""CPU checks of the kernel plumbing: which inputs `auto` sends to the CfC kernel, and the mode of the
library manifest that `python -m perception.ops.build` writes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

import perception.ops as ops
from perception.ops import build, extension
from perception.ops.reference import cfc_scan_ref


def cfc_inputs(d: int, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(d)
    shapes = [(2, 3, d), (2, 3), (2, d), (d, d), (4 * d, d), (4 * d,)]
    return [(0.3 * torch.randn(s, generator=g)).to(dtype) for s in shapes]


@pytest.fixture
def kernels_claimed(monkeypatch):
    """Pretend the extension is usable for these (CPU) tensors; the op itself is replaced by a marker."""
    calls = []

    def fake_kernel(*args):
        calls.append(args)
        return torch.zeros(args[0].shape[:2] + (args[2].shape[1],), dtype=args[0].dtype)

    monkeypatch.setattr(ops, "use_kernels", lambda backend, *tensors: True)
    monkeypatch.setattr(torch.ops, "perception", type("Ns", (), {"cfc_scan": staticmethod(fake_kernel)}), raising=False)
    return calls


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
