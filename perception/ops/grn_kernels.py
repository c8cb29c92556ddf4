"""Triton kernels of the grn family (perception/ops/grn.py): the VSN's per-variable embeddings and GRNs, weighted
by the selection weights, in one pass forward and one backward (DESIGN §3, the VSN).

One program owns one variable f and a contiguous range of rows, which it walks in blocks of BLOCK_N. Every
tile is (d, BLOCK_N), rows last, and the launch gives one row to each lane (BLOCK_N = 32 · warps): a thread
holds its row's d values, so the embedding, the GRN's matrix-vector products, ELU, GLU and LayerNorm are its
own multiply-adds, with no shuffles or shared memory (the weights are read one column or row at a time, so a
thread holds d of them, not d²). The kernels read the scalar feature x[n, f] and form its embedding
e = x · ew + eb themselves: the (N, F, d) embedding and its gradient never reach memory. The forward reads x
and v and writes the weighted output; it takes W1 and W2 transposed, so a column is contiguous (vector loads),
and stores each row's output through one layout change in shared memory as vectors (a memory transaction a
row, not a value). The backward recomputes the forward and writes dx and dv. Its GRN weight gradients are
sums over rows, three dots over each block's rows (three TF32 products per product, `tf32x3`: fp32's
accuracy on tensor cores) whose right operands carry a row of ones for the bias sums; the embedding's are
per-lane sums. Each program keeps its own and writes them to a (programs, F, ...) buffer that the caller sums
over its first dim. No atomics: the bits do not depend on scheduling. Imported only where Triton is (CUDA
machines); the interpreter runs them on CPU tensors, and `triton.compile` for sm_89/sm_90 runs without a GPU
(docs/performance.md says what it showed)."""

from __future__ import annotations

import triton
import triton.language as tl

LN_EPS = tl.constexpr(1e-5)  # F.layer_norm's default, as the reference uses (a global a kernel reads is a constexpr)
DOT_PRECISION = tl.constexpr("tf32x3")


@triton.jit
def _vector(ptr, at, D: tl.constexpr):
    return tl.load(ptr + at + tl.arange(0, D)).to(tl.float32)


@triton.jit
def _row(x, i, D: tl.constexpr):
    """Row i of x (D, BN) as (BN,): a select within each thread, which holds its rows' D values."""
    return tl.sum(tl.where(tl.arange(0, D)[:, None] == i, x, 0.0), axis=0)


@triton.jit
def _matvec(w_ptr, row0, x, OUT: tl.constexpr, D: tl.constexpr, TRANSPOSED: tl.constexpr):
    """W x for W rows row0 .. row0 + D of a (OUT, D) matrix [out, in], x: (D, BN) -> (D, BN). W's columns are
    loaded one at a time, so a thread holds D of its weights, not D². W comes row-major, or `TRANSPOSED` (as
    Wᵀ, row-major (D, OUT)): then a column is contiguous, vector loads (the forward's; the backward, whose
    registers are at the limit, hoists its weights out of its loop and takes W as it is)."""
    out = tl.zeros(x.shape, tl.float32)
    for i in tl.static_range(D):
        if TRANSPOSED:
            column = tl.load(w_ptr + i * OUT + row0 + tl.arange(0, D)).to(tl.float32)  # (D,): W[rows, i]
        else:
            column = tl.load(w_ptr + (row0 + tl.arange(0, D)) * D + i).to(tl.float32)
        out += column[:, None] * _row(x, i, D)[None, :]
    return out


@triton.jit
def _matvec_t(w_ptr, row0, y, D: tl.constexpr):
    """Wᵀ y for the same W, y: (D, BN) -> (D, BN); W's rows one at a time."""
    out = tl.zeros(y.shape, tl.float32)
    for o in tl.static_range(D):
        row = tl.load(w_ptr + (row0 + o) * D + tl.arange(0, D)).to(tl.float32)  # (D,): W[o, :]
        out += row[:, None] * _row(y, o, D)[None, :]
    return out


@triton.jit
def _embed_t(x_ptr, ew_ptr, eb_ptr, n, F, f, live, D: tl.constexpr):
    """x[n, f] for the block's rows (BN,), and its embedding x · ew + eb as (D, BN): each lane its own row."""
    x = tl.load(x_ptr + n * F + f, mask=live, other=0.0).to(tl.float32)  # (BN,)
    return x, _vector(ew_ptr, f * D, D)[:, None] * x[None, :] + _vector(eb_ptr, f * D, D)[:, None]


@triton.jit
def _store_t(ptr, x, n, F, f, live, D: tl.constexpr):
    """x (D, BN) to x[n, f, :] as (BN, D) rows: a layout change through shared memory, then a row's D values
    in vector stores (one memory transaction a row; the forward's, where registers are spare)."""
    at = ((n * F + f) * D)[:, None] + tl.arange(0, D)[None, :]  # (BN, D)
    tl.store(ptr + at, tl.trans(x).to(ptr.dtype.element_ty), mask=live[:, None])


@triton.jit
def _load_t(ptr, n, F, f, live, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """x[n, f, :] for the block's rows as (D, BN), one column load at a time: each lane reads its own row,
    so a thread holds its row's D values (the layout every op below keeps)."""
    x = tl.zeros((D, BLOCK_N), tl.float32)
    for i in tl.static_range(D):
        column = tl.load(ptr + (n * F + f) * D + i, mask=live, other=0.0).to(tl.float32)  # (BN,)
        x = tl.where(tl.arange(0, D)[:, None] == i, column[None, :], x)
    return x


@triton.jit
def _over_ones(x, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """x (D, BN) above a row of ones and D - 1 rows of zeros: (2D, BN). A dot with it as the right operand sums
    the left operand over rows in its column D."""
    ones = tl.where(tl.arange(0, D)[:, None] == 0, 1.0, 0.0) + tl.zeros_like(x)
    return tl.reshape(tl.permute(tl.join(x, ones), (2, 0, 1)), (2 * D, BLOCK_N))


@triton.jit
def _over_ones_x(e, x, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """e (D, BN) above a row of ones, the row x (BN,) and D - 2 rows of zeros: (2D, BN). A dot with it as the
    right operand sums the left operand over rows in its column D, and its products with x in column D + 1."""
    i = tl.arange(0, D)[:, None]
    below = tl.where(i == 0, 1.0, tl.where(i == 1, x[None, :], 0.0)) + tl.zeros_like(e)
    return tl.reshape(tl.permute(tl.join(e, below), (2, 0, 1)), (2 * D, BLOCK_N))


@triton.jit
def _grn_t(e, w1_ptr, b1_ptr, w2_ptr, b2_ptr, f, D: tl.constexpr, TRANSPOSED: tl.constexpr):
    """e: (D, BN), rows last -> the GRN's intermediates, each (D, BN), and 1/σ (BN,). W1 (F, D, D) and W2
    (F, 2D, D), or with `TRANSPOSED` each variable's transposed."""
    w1 = w1_ptr + f * D * D
    w2 = w2_ptr + f * 2 * D * D
    pre1 = _matvec(w1, 0, e, D, D, TRANSPOSED) + _vector(b1_ptr, f * D, D)[:, None]
    h1 = tl.where(pre1 > 0, pre1, tl.exp(pre1) - 1.0)
    a = _matvec(w2, 0, h1, 2 * D, D, TRANSPOSED) + _vector(b2_ptr, f * 2 * D, D)[:, None]
    gate = _matvec(w2, D, h1, 2 * D, D, TRANSPOSED) + _vector(b2_ptr, f * 2 * D + D, D)[:, None]
    sg = tl.sigmoid(gate)
    z = e + a * sg
    zc = z - (tl.sum(z, axis=0) / D)[None, :]
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=0) / D + LN_EPS)
    return pre1, h1, a, sg, zc * rstd[None, :], rstd


@triton.jit
def grn_select_fwd_kernel(
    x_ptr, v_ptr, ew_ptr, eb_ptr, w1t_ptr, b1_ptr, w2t_ptr, b2_ptr, lnw_ptr, lnb_ptr, out_ptr,
    N, F, rows_per_program,
    D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[n, f] = v[n, f] · (LN(e + GLU(W2 · ELU(W1 · e + b1) + b2)) · lnw + lnb), e = x[n, f] · ew + eb; W1, W2
    given transposed."""
    f = tl.program_id(0)
    start = tl.program_id(1) * rows_per_program
    for block in range(0, rows_per_program, BLOCK_N):
        n = start + block + tl.arange(0, BLOCK_N)
        live = (n < N) & (n < start + rows_per_program)
        _, e = _embed_t(x_ptr, ew_ptr, eb_ptr, n, F, f, live, D)
        v = tl.load(v_ptr + n * F + f, mask=live, other=0.0).to(tl.float32)
        _, _, _, _, zhat, _ = _grn_t(e, w1t_ptr, b1_ptr, w2t_ptr, b2_ptr, f, D, True)
        xi = zhat * _vector(lnw_ptr, f * D, D)[:, None] + _vector(lnb_ptr, f * D, D)[:, None]
        _store_t(out_ptr, v[None, :] * xi, n, F, f, live, D)


@triton.jit
def grn_select_bwd_kernel(
    grad_ptr, x_ptr, v_ptr, ew_ptr, eb_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, lnb_ptr,
    dx_ptr, dv_ptr, partial_ptr,
    N, F, rows_per_program,
    D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dx, dv for every row, and this program's sums of the weight gradients in partial[program, f, :], laid
    out as W1 (D·D), b1 (D), W2 (2D·D: value rows then gate rows), b2 (2D), lnw (D), lnb (D), ew (D), eb (D)."""
    f = tl.program_id(0)
    program = tl.program_id(1)
    start = program * rows_per_program
    # this program's weight gradients as three dots over each block's rows, each right operand with a row of
    # ones below it, so the same dot sums the biases: [dW1 | db1], [dW2 | db2] (value rows, then gate rows),
    # [dlnw on the diagonal | dlnb]; the first's left operand also carries de, and its right one x below the
    # ones, so it sums the embedding's too: [dW1 | db1 | ·] above [· | deb | dew]
    acc1 = tl.zeros((2 * D, 2 * D), tl.float32)
    acc2 = tl.zeros((2 * D, 2 * D), tl.float32)
    acc3 = tl.zeros((D, 2 * D), tl.float32)
    for block in range(0, rows_per_program, BLOCK_N):
        n = start + block + tl.arange(0, BLOCK_N)
        live = (n < N) & (n < start + rows_per_program)
        x, e = _embed_t(x_ptr, ew_ptr, eb_ptr, n, F, f, live, D)
        v = tl.load(v_ptr + n * F + f, mask=live, other=0.0).to(tl.float32)
        g = _load_t(grad_ptr, n, F, f, live, D, BLOCK_N)
        pre1, h1, a, sg, zhat, rstd = _grn_t(e, w1_ptr, b1_ptr, w2_ptr, b2_ptr, f, D, False)
        lnw = _vector(lnw_ptr, f * D, D)
        xi = zhat * lnw[:, None] + _vector(lnb_ptr, f * D, D)[:, None]
        tl.store(dv_ptr + n * F + f, tl.sum(g * xi, axis=0).to(dv_ptr.dtype.element_ty), mask=live)
        dxi = g * v[None, :]  # masked rows: g = 0, so they add nothing below
        acc3 = tl.dot(dxi, tl.trans(_over_ones(zhat, D, BLOCK_N)), acc3, input_precision=DOT_PRECISION)
        dzhat = dxi * lnw[:, None]
        dz = rstd[None, :] * (
            dzhat - (tl.sum(dzhat, axis=0) / D)[None, :] - zhat * (tl.sum(dzhat * zhat, axis=0) / D)[None, :]
        )
        da = dz * sg
        dgate = dz * a * sg * (1.0 - sg)
        value_gate = tl.reshape(tl.permute(tl.join(da, dgate), (2, 0, 1)), (2 * D, BLOCK_N))
        acc2 = tl.dot(value_gate, tl.trans(_over_ones(h1, D, BLOCK_N)), acc2, input_precision=DOT_PRECISION)
        dh1 = _matvec_t(w2_ptr, f * 2 * D, da, D) + _matvec_t(w2_ptr, f * 2 * D + D, dgate, D)
        dpre1 = dh1 * tl.where(pre1 > 0, 1.0, tl.exp(pre1))
        de = dz + _matvec_t(w1_ptr, f * D, dpre1, D)
        dx = tl.sum(de * _vector(ew_ptr, f * D, D)[:, None], axis=0)
        tl.store(dx_ptr + n * F + f, dx.to(dx_ptr.dtype.element_ty), mask=live)
        pre1_de = tl.reshape(tl.permute(tl.join(dpre1, de), (2, 0, 1)), (2 * D, BLOCK_N))
        acc1 = tl.dot(pre1_de, tl.trans(_over_ones_x(e, x, D, BLOCK_N)), acc1, input_precision=DOT_PRECISION)
    # partial[program, f]: W1, b1, W2 (value then gate), b2 (value then gate), lnw, lnb, ew, eb
    base = partial_ptr + (program * F + f) * (3 * D * D + 7 * D)
    r = tl.arange(0, D)[:, None]
    c = tl.arange(0, 2 * D)[None, :]
    r2 = tl.arange(0, 2 * D)[:, None]
    w1_at = tl.where(c < D, r2 * D + c, D * D + r2)  # rows < D: W1 and b1; rows >= D: eb (column D), ew (D + 1)
    embed_at = 3 * D * D + 5 * D + (r2 - D) + tl.where(c == D, D, 0)
    tl.store(base + tl.where(r2 < D, w1_at, embed_at), acc1, mask=tl.where(r2 < D, c <= D, (c == D) | (c == D + 1)))
    tl.store(base + 3 * D * D + 3 * D + r + 0 * c, acc3, mask=c == r)
    tl.store(base + 3 * D * D + 4 * D + r + 0 * c, acc3, mask=c == D)
    w2_at = D * D + D + r2 * D + c  # value rows, then gate rows: contiguous (2D, D)
    b2_at = 3 * D * D + D + r2 + 0 * c  # b2a, then b2b: contiguous (2D,)
    tl.store(base + tl.where(c < D, w2_at, b2_at), acc2, mask=c <= D)
