"""Shipping standard-library helper programs to hosts (``python -c``)."""
