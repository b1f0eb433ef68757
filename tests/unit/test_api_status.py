"""The HTTP status of a service refusal is decided in api/, never by the error tree."""

from __future__ import annotations

import pytest

from corral.api.errors import corral_error, status_of
from corral.errors import Conflict, Forbidden, Invalid, NotFound, ServerFailed, ServiceError


class _Busy(Conflict):
    """A refusal the table does not name: its nearest base's status."""


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (NotFound("no job j"), 404),
        (Forbidden("outside the run dir"), 403),
        (Conflict("busy"), 409),
        (_Busy("busy with j"), 409),
        (Invalid("cannot"), 422),
        (ServiceError("bad"), 400),
        (ServerFailed("odd"), 400),
    ],
)
def test_each_refusal_has_its_status(exc: ServiceError, status: int) -> None:
    assert status_of(exc) == status
    assert corral_error(exc).status_code == status


def test_the_error_tree_carries_no_status() -> None:
    assert not any(hasattr(cls, "status") for cls in (ServiceError, NotFound, Conflict, Invalid))
