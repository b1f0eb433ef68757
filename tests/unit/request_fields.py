"""The fields of the API's job request, nested models' fields spelled ``outer.inner``:
what the parity tests (the web form, ``corral job submit``) check, each against its
own surface."""

from __future__ import annotations

from pydantic import BaseModel

from corral.service.models import ConfigScaling, JobRequest, ResourceRequirements

NESTED: dict[str, type[BaseModel]] = {
    "resource_requirements": ResourceRequirements,
    "config_scaling": ConfigScaling,
}


def field_paths() -> list[str]:
    """Every field of :class:`JobRequest`, the nested models' ones as ``outer.inner``."""
    paths = []
    for name in JobRequest.model_fields:
        if name in NESTED:
            paths += [f"{name}.{sub}" for sub in NESTED[name].model_fields]
        else:
            paths.append(name)
    return paths
