"""Are two builds of the CfC kernels the same function, bit for bit? Runs `perception::cfc_scan` forward and
its backward kernel on fixed inputs (ops_cfc.make_inputs) for every kernel width, on each path this GPU has
(cluster on sm_90, portable everywhere), and records a sha256 of every output. A kernel edit that keeps the
arithmetic and its order (a new thread layout, fewer barriers) must give the same digests as the build
before it; run this once in each tree on one GPU, then compare.

    PYTHONPATH=. python3 benchmarks/cfc_bits.py --out A.json           # in each tree
    python3 benchmarks/cfc_bits.py --compare A.json B.json             # exit 1 where a digest differs

Needs a GPU and the built extension (python -m perception.ops.build) for the first form; the second reads
two files only."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(1, 1), (3, 17), (5, 300), (64, 600)]  # (B, K): one step, odd sizes, a production batch's width


def digest(t) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


def run() -> dict[str, str]:
    import torch

    from benchmarks.ops_cfc import make_inputs
    from perception.ops import extension
    from perception.ops.cfc import recompute

    extension.require()
    paths = ["cluster", "portable"] if torch.cuda.get_device_capability()[0] >= 9 else ["portable"]
    out = {}
    for path in paths:
        os.environ["PERCEPTION_CFC_PATH"] = path
        for d in (16, 32, 64, 128):
            for b, k in SHAPES:
                inputs = [t.detach() for t in make_inputs(b, k, d)]
                x_proj, ts, h0, w_rec, w_out, b_out = inputs
                with torch.no_grad():
                    h_seq = torch.ops.perception.cfc_scan(*inputs)
                    _, z, gates = recompute(x_proj, h0, h_seq, w_rec, w_out, b_out)
                    cot = torch.randn(h_seq.shape, generator=torch.Generator().manual_seed(b * k + d)).cuda()
                    grads = torch.ops.perception.cfc_scan_bwd(cot, gates.contiguous(), z.contiguous(), ts, w_rec, w_out)
                key = f"{path} D={d} B={b} K={k}"
                out[f"{key} h_seq"] = digest(h_seq)
                for name, g in zip(("d_pre", "d_gates", "d_h0"), grads):
                    out[f"{key} {name}"] = digest(g)
        print(f"  {path}: {sum(k.startswith(path) for k in out)} digests", flush=True)
    out["gpu"] = torch.cuda.get_device_name()
    return out


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    keys = sorted(k for k in a.keys() | b.keys() if k != "gpu")
    if a.get("gpu") != b.get("gpu"):
        print(f"warning: {a_path} is from {a.get('gpu')}, {b_path} from {b.get('gpu')}: bits may differ by GPU")
    differ = [k for k in keys if a.get(k) != b.get(k)]
    for k in differ:
        print(f"  differs: {k}: {a.get(k)} vs {b.get(k)}")
    print(f"{len(keys) - len(differ)} of {len(keys)} outputs bit for bit equal ({a_path.name} vs {b_path.name})")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the digests here (JSON)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="compare two digest files")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give --out FILE (run the kernels) or --compare A B")
    args.out.write_text(json.dumps(run(), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
