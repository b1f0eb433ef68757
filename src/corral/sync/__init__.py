"""Code sync (rsync over SSH) and code-tree fingerprints."""
