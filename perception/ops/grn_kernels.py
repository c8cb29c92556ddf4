"""Triton kernels of the grn family (perception/ops/grn.py): the VSN's per-variable GRNs, weighted by the
selection weights, in one pass forward and one backward (DESIGN §3, the VSN).

One program owns one variable f and a contiguous range of rows, so f's weights (d² + 2d² + 6d scalars) are
loaded once and stay in registers while it walks its rows in blocks of BLOCK_N. Every intermediate lives in
registers: the forward reads e and v and writes the weighted output; the backward recomputes the forward and
writes de and dv. The weight gradients are summed per program in a fixed order and written to a
(programs, F, ...) buffer that the caller sums over its first dim, so no atomics: the bits do not depend on
scheduling. Imported only where Triton is (CUDA machines); the interpreter runs them on CPU tensors."""

from __future__ import annotations

import triton
import triton.language as tl

LN_EPS = tl.constexpr(1e-5)  # F.layer_norm's default, as the reference uses (a global a kernel reads is a constexpr)


@triton.jit
def _load_weights(w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, lnb_ptr, f, D: tl.constexpr):
    """f's weights: W1 (D, D), the GLU's value and gate halves of W2 (D, D) each, and the (D,) vectors."""
    rows = tl.arange(0, D)[:, None]
    cols = tl.arange(0, D)[None, :]
    j = tl.arange(0, D)
    w1 = tl.load(w1_ptr + f * D * D + rows * D + cols).to(tl.float32)  # (D, D): [out, in]
    w2a = tl.load(w2_ptr + f * 2 * D * D + rows * D + cols).to(tl.float32)  # (D, D): value half
    w2b = tl.load(w2_ptr + f * 2 * D * D + (rows + D) * D + cols).to(tl.float32)  # (D, D): gate half
    b1 = tl.load(b1_ptr + f * D + j).to(tl.float32)
    b2a = tl.load(b2_ptr + f * 2 * D + j).to(tl.float32)
    b2b = tl.load(b2_ptr + f * 2 * D + D + j).to(tl.float32)
    lnw = tl.load(lnw_ptr + f * D + j).to(tl.float32)
    lnb = tl.load(lnb_ptr + f * D + j).to(tl.float32)
    return w1, w2a, w2b, b1, b2a, b2b, lnw, lnb


@triton.jit
def _grn(e, w1, w2a, w2b, b1, b2a, b2b, D: tl.constexpr):
    """e: (BN, D) -> the GRN's intermediates: pre-ELU, ELU, GLU value and gate, normalised z and 1/σ."""
    pre1 = tl.sum(e[:, None, :] * w1[None, :, :], axis=2) + b1[None, :]  # (BN, D)
    h1 = tl.where(pre1 > 0, pre1, tl.exp(pre1) - 1.0)
    a = tl.sum(h1[:, None, :] * w2a[None, :, :], axis=2) + b2a[None, :]  # (BN, D)
    sg = tl.sigmoid(tl.sum(h1[:, None, :] * w2b[None, :, :], axis=2) + b2b[None, :])  # (BN, D)
    z = e + a * sg
    zc = z - (tl.sum(z, axis=1) / D)[:, None]
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=1) / D + LN_EPS)  # (BN,)
    zhat = zc * rstd[:, None]
    return pre1, h1, a, sg, zhat, rstd


@triton.jit
def grn_select_fwd_kernel(
    e_ptr, v_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, lnb_ptr, out_ptr,
    N, F, rows_per_program,
    D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[n, f] = v[n, f] · (LN(e + GLU(W2 · ELU(W1 · e + b1) + b2)) · lnw + lnb), e = e[n, f]."""
    f = tl.program_id(0)
    start = tl.program_id(1) * rows_per_program
    w1, w2a, w2b, b1, b2a, b2b, lnw, lnb = _load_weights(w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, lnb_ptr, f, D)
    j = tl.arange(0, D)
    for block in range(0, rows_per_program, BLOCK_N):
        n = start + block + tl.arange(0, BLOCK_N)  # (BN,)
        live = (n < N) & (n < start + rows_per_program)
        at = (n[:, None] * F + f) * D + j[None, :]  # (BN, D)
        e = tl.load(e_ptr + at, mask=live[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + n * F + f, mask=live, other=0.0).to(tl.float32)
        _, _, _, _, zhat, _ = _grn(e, w1, w2a, w2b, b1, b2a, b2b, D)
        out = v[:, None] * (zhat * lnw[None, :] + lnb[None, :])
        tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=live[:, None])


@triton.jit
def grn_select_bwd_kernel(
    grad_ptr, e_ptr, v_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, lnb_ptr,
    de_ptr, dv_ptr, partial_ptr,
    N, F, rows_per_program,
    D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """de, dv for every row, and this program's sums of the weight gradients in partial[program, f, :], laid
    out as W1 (D·D), b1 (D), W2 (2D·D: value rows then gate rows), b2 (2D), lnw (D), lnb (D)."""
    f = tl.program_id(0)
    program = tl.program_id(1)
    start = program * rows_per_program
    w1, w2a, w2b, b1, b2a, b2b, lnw, lnb = _load_weights(w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, lnb_ptr, f, D)
    j = tl.arange(0, D)
    acc_w1 = tl.zeros((D, D), tl.float32)
    acc_w2a = tl.zeros((D, D), tl.float32)
    acc_w2b = tl.zeros((D, D), tl.float32)
    acc_b1 = tl.zeros((D,), tl.float32)
    acc_b2a = tl.zeros((D,), tl.float32)
    acc_b2b = tl.zeros((D,), tl.float32)
    acc_lnw = tl.zeros((D,), tl.float32)
    acc_lnb = tl.zeros((D,), tl.float32)
    for block in range(0, rows_per_program, BLOCK_N):
        n = start + block + tl.arange(0, BLOCK_N)  # (BN,)
        live = (n < N) & (n < start + rows_per_program)
        at = (n[:, None] * F + f) * D + j[None, :]  # (BN, D)
        e = tl.load(e_ptr + at, mask=live[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + n * F + f, mask=live, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + at, mask=live[:, None], other=0.0).to(tl.float32)
        pre1, h1, a, sg, zhat, rstd = _grn(e, w1, w2a, w2b, b1, b2a, b2b, D)
        xi = zhat * lnw[None, :] + lnb[None, :]
        tl.store(dv_ptr + n * F + f, tl.sum(g * xi, axis=1).to(dv_ptr.dtype.element_ty), mask=live)
        dxi = g * v[:, None]  # masked rows: g = 0, so they add nothing below
        acc_lnw += tl.sum(dxi * zhat, axis=0)
        acc_lnb += tl.sum(dxi, axis=0)
        dzhat = dxi * lnw[None, :]
        dz = rstd[:, None] * (
            dzhat - (tl.sum(dzhat, axis=1) / D)[:, None] - zhat * (tl.sum(dzhat * zhat, axis=1) / D)[:, None]
        )
        da = dz * sg  # (BN, D): the GLU's value
        dgate = dz * a * sg * (1.0 - sg)  # its gate, before the sigmoid
        acc_w2a += tl.sum(da[:, :, None] * h1[:, None, :], axis=0)
        acc_w2b += tl.sum(dgate[:, :, None] * h1[:, None, :], axis=0)
        acc_b2a += tl.sum(da, axis=0)
        acc_b2b += tl.sum(dgate, axis=0)
        dh1 = tl.sum(da[:, :, None] * w2a[None, :, :], axis=1) + tl.sum(dgate[:, :, None] * w2b[None, :, :], axis=1)
        dpre1 = dh1 * tl.where(pre1 > 0, 1.0, tl.exp(pre1))
        acc_w1 += tl.sum(dpre1[:, :, None] * e[:, None, :], axis=0)
        acc_b1 += tl.sum(dpre1, axis=0)
        de = dz + tl.sum(dpre1[:, :, None] * w1[None, :, :], axis=1)
        tl.store(de_ptr + at, de.to(de_ptr.dtype.element_ty), mask=live[:, None])
    # partial[program, f]: W1, b1, W2 (value then gate), b2 (value then gate), lnw, lnb
    base = partial_ptr + (program * F + f) * (3 * D * D + 5 * D)
    square = tl.arange(0, D)[:, None] * D + tl.arange(0, D)[None, :]
    tl.store(base + square, acc_w1)
    tl.store(base + D * D + j, acc_b1)
    tl.store(base + D * D + D + square, acc_w2a)
    tl.store(base + 2 * D * D + D + square, acc_w2b)
    tl.store(base + 3 * D * D + D + j, acc_b2a)
    tl.store(base + 3 * D * D + 2 * D + j, acc_b2b)
    tl.store(base + 3 * D * D + 3 * D + j, acc_lnw)
    tl.store(base + 3 * D * D + 4 * D + j, acc_lnb)
