"""Order-book data: MBP-10 reader, synthetic books, features, labels, purged folds, windows, cache.

Importable without hydra (the GPU image has none); `perception-data` (perception/train/data_cli.py) composes
the Hydra config around it. The names below load on first use, so that a process importing only the
reader does not pay for torch.
"""

from importlib import import_module

_WHERE = {
    "check_data_config": "checks", "Dataset": "dataset", "data_hash": "dataset",
    "load_dataset": "dataset", "FoldSplit": "folds", "purged_split": "folds", "Batch": "loader",
    "Normalizer": "loader", "WindowLoader": "loader", "median_dt": "loader", "prefetched": "prefetch",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'perception.data' has no attribute {name!r}")
    value = getattr(import_module(f"perception.data.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
