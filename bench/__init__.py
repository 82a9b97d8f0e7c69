"""Benchmarks: every lane's speed and quality, side by side, measured in one run."""
