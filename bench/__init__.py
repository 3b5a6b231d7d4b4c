"""Benchmarks that print their numbers and ratios in one run (`make bench` runs them)."""
