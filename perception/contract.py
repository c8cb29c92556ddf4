"""The MLflow contract (DESIGN §6), declared once: what a training run logs and the gate reads. The
training writes every field here; a field a run lacks because it was made before the field existed
reads as its default below, so such runs are gated as they always were.

Imports nothing: the gate (MLflow only) and the training share it."""

from __future__ import annotations

from typing import Mapping, Optional

# Tags. Every training run: sweep_id, variant (its arm), fold, replicate and role=train, nested under the
# sweep's parent run (role=sweep); the gate's own run is role=gate.
ROLE, ROLE_TRAIN, ROLE_SWEEP, ROLE_GATE = "role", "train", "sweep", "gate"
SWEEP_ID, VARIANT, FOLD, REPLICATE = "sweep_id", "variant", "fold", "replicate"

# Metrics every run logs per epoch (step = epoch; the final epoch has the largest step), and MLflow's own
# system metric of a training pod's one GPU, which the gate reports beside them.
SAMPLES_PER_S = "samples_per_s"
GPU_UTILIZATION = "system/gpu_0_utilization_percentage"


def val_auc(horizon: int) -> str:
    return f"val_auc_h{horizon}"


# Params every run must carry and all runs must agree on (DESIGN §4 "Config keys"); `seed` must agree
# between the arms of a replicate only (replicate r trains with seed + r).
AGREED_PARAMS = (
    "data_hash",
    "git_sha",
    "trainer.epochs",
    "data.n_folds",
    "data.window",
    "data.window_stride",
    "data.horizons",
    "model.mamba.chunk",  # every run has logged it; its bits depend on it (the SSD's sums)
)
SEED = "seed"

# Optional fields with the value a run made before the field existed reads as.
TAG_DEFAULTS = {REPLICATE: "0"}
PARAM_DEFAULTS = {
    "trainer.precision": "fp32",
    "model.mamba.ssd": "chunked",
    "model.vsn.fold_embed": "False",
    "model.vsn.fused_grn": "False",
}
# Per-epoch learning-signal diagnostics (the final epoch's value counts); a run without one: NOT_MEASURED.
QUERY_DIAGNOSTICS = ("query_divergence", "attention_entropy_ratio", "query_drift")  # what the pool's queries did
DIAGNOSTICS = (
    "grad_norm_pool_query",
    "grad_norm_vsn",
    "grad_norm_mamba",
    "grad_norm_cfc",
    "grad_norm_heads",
    *QUERY_DIAGNOSTICS,
)
NOT_MEASURED = "not measured"

# Artifacts (path in the run, as the training writes them under its run directory).
PREDICTIONS = (
    "predictions/val_final.npz"  # probs (N, H) float32, labels (N, H) uint8, mask (N, H) bool, index (N,) int64
)
ATTENTION = "diagnostics/attention_by_lag.npz"  # optional: lag_edges, mass (Q, n_buckets), query_names
ATTENTION_PLOT = "diagnostics/attention_by_lag.png"


def tag(tags: Mapping[str, str], key: str) -> Optional[str]:
    """A run's tag, or the default of an optional one it lacks; None for a missing required tag."""
    return tags.get(key, TAG_DEFAULTS.get(key))


def param(params: Mapping[str, str], key: str) -> Optional[str]:
    """A run's param, or the default of an optional one it lacks; None for a missing required param."""
    return params.get(key, PARAM_DEFAULTS.get(key))
