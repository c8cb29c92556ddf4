"""What the tests, the benchmarks and the studies share to exercise the product as it runs: sweeps logged
to a real MLflow store exactly as trainings log them, and real MLflow and PostgreSQL servers on 127.0.0.1.
The top layer: it may use every other, and nothing in the product imports it."""
