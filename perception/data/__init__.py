"""Order-book data: MBP-10 reader, synthetic books, features, labels, purged folds, windows, cache.

Importable without hydra (the GPU image has none); `perception-data` (perception/train/data_cli.py) composes
the Hydra config around it.
"""

from perception.data.checks import check_data_config
from perception.data.dataset import Dataset, data_hash, load_dataset
from perception.data.folds import FoldSplit, purged_split
from perception.data.loader import Batch, Normalizer, WindowLoader, median_dt
from perception.data.prefetch import prefetched

__all__ = [
    "Batch", "Dataset", "FoldSplit", "Normalizer", "WindowLoader", "check_data_config",
    "data_hash", "load_dataset", "median_dt", "prefetched", "purged_split",
]
