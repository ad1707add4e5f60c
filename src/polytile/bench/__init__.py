"""Benchmark and coverage suites (model zoo, side-by-side timing, reports)."""
