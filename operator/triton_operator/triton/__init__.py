"""triton layer."""
