"""Unit tests and tests against a real tritonserver (a package, so helpers import as `tests.triton_helpers`)."""
