"""Errors every command maps to exit codes (DESIGN §7): usage/config errors exit 2, failed work 1."""


class PerceptionError(Exception):
    """Base class: the message is complete and meant for the user (no traceback needed)."""


class ConfigError(PerceptionError, ValueError):
    """A bad configuration value: names the key, the value and what was expected. Exit code 2."""


class DataError(PerceptionError, ValueError):
    """Unusable input data: names the file and the problem. Exit code 1 from the commands."""


class CheckpointError(PerceptionError, ValueError):
    """An unreadable or incompatible checkpoint: names the file and the tensor or key."""
