"""Benchmarks of hf-tpu-ext, run by hand (not in CI): ``python -m benchmarks.train_throughput --preset small``."""
