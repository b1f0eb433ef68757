"""Pre-flight checks: one module per check, each returning a CheckResult."""
