"""Render and drive corral jobs on the engines users grow into: Kubernetes and Slurm."""
