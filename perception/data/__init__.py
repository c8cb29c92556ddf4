"""Order-book data: MBP-10 reader, synthetic books, features, labels, purged folds, windows, cache.

Importable without hydra (the GPU image has none); `perception-data` (perception/train/data_cli.py) composes
the Hydra config around it. The names below load on first use, so that a process importing only the
reader does not pay for torch.
"""

from perception.lazy import lazy_names

_WHERE = {
    "check_data_config": "checks",
    "Dataset": "dataset",
    "data_hash": "dataset",
    "load_dataset": "dataset",
    "FoldSplit": "folds",
    "purged_split": "folds",
    "Batch": "loader",
    "Normalizer": "loader",
    "WindowLoader": "loader",
    "median_dt": "loader",
    "prefetched": "prefetch",
}
__all__ = sorted(_WHERE)
__getattr__ = lazy_names(__name__, _WHERE)
