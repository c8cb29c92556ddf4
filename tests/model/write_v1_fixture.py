"""The V1 checkpoint writer: a SharedQuery model's state_dict in safetensors with no metadata
(V1 predates `format_version`). `PYTHONPATH=. python tests/model/write_v1_fixture.py` rewrites the fixture."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from perception.model import PerceptionModel
from tests.model.helpers import HORIZONS, N_FEATURES, tiny_config

FIXTURE = Path(__file__).parent / "fixtures" / "v1_shared.safetensors"
V1_SEED = 11
V1_DT_SCALE = 0.5


def v1_model() -> PerceptionModel:
    model = PerceptionModel(tiny_config("shared"), N_FEATURES, HORIZONS, V1_SEED)
    model.set_dt_scale(V1_DT_SCALE)
    return model


def write_v1(path: Path) -> None:
    save_file({name: t.contiguous() for name, t in v1_model().state_dict().items()}, str(path))


if __name__ == "__main__":
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    write_v1(FIXTURE)
    print(f"wrote {FIXTURE}")
