"""perception.model and perception.ops import with torch and numpy alone: the GPU machine that runs
the benchmarks has no hydra, omegaconf or mlflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
for name in ("hydra", "omegaconf", "mlflow", "sklearn", "scipy", "databento_dbn", "tqdm", "matplotlib"):
    sys.modules[name] = None  # any import of these now fails
import torch
import perception.model, perception.ops
from perception.model import PerceptionModel, ModelConfig, masked_bce
m = PerceptionModel(ModelConfig(d_model=32), 3, [1, 2], 0)
print(tuple(m(torch.randn(2, 4, 3), torch.ones(2, 4)).shape))
"""


def test_model_and_ops_import_without_the_platform_dependencies():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(2, 2)"
