"""validate layer."""
