"""perception: SharedQuery vs PerHorizon attention pools on limit-order-book data."""

__version__ = "0.1.0"
