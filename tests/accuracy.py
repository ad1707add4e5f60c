"""Test-side name for the accuracy rule (it lives in the package: polytile.accuracy)."""
from polytile.accuracy import assert_accurate, check_accuracy, fp64_reference, rmse  # noqa: F401
