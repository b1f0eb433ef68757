"""Kubernetes: render a corral job as an Indexed Job + headless Service, and apply,
follow and delete it with the official client (``corral k8s``)."""
