"""Diagnosis of a cluster and its jobs: the link matrix (:mod:`corral.diagnose.links`)."""
