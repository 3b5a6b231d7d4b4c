"""Benchmarks, the load generator and the peer servers they compare Flightdeck with: beside the product, not in it."""
