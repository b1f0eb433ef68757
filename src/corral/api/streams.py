"""Live answers that end with the credential behind them: a stream (Server-Sent
Events) re-checks its request's token or web session every :data:`RECHECK_S`
seconds and ends, with one ``revoked`` event, once it no longer holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from corral.api.auth import credential_alive

T = TypeVar("T")
#: How often a stream asks whether its credential still holds (seconds).
RECHECK_S = 1.0
REVOKED_EVENT = {
    "event": "revoked",
    "data": json.dumps(
        {"kind": "revoked", "message": "the token or session of this stream was revoked"}
    ),
}


async def until_revoked(
    source: AsyncIterator[T],
    alive: Callable[[], Awaitable[bool]],
    every: float = RECHECK_S,
) -> AsyncIterator[T | None]:
    """The items of ``source`` while ``alive()`` says so (asked at least every
    ``every`` seconds, also while ``source`` waits); a last ``None`` when it stopped
    saying so. ``source`` is closed either way."""
    ended = object()

    async def step() -> T | object:
        try:
            return await source.__anext__()
        except StopAsyncIteration:
            return ended

    pending: asyncio.Task[T | object] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.create_task(step())
            done, _ = await asyncio.wait({pending}, timeout=every)
            if done:
                item = pending.result()
                if item is ended:
                    return
                pending = None
                yield item  # type: ignore[misc]
            if not await alive():
                yield None
                return
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


def revocable(request: Request, source: AsyncIterator[T]) -> AsyncIterator[T | None]:
    """``source`` until the request's token or web session is revoked (then ``None``)."""

    async def alive() -> bool:
        return await asyncio.to_thread(credential_alive, request)

    return until_revoked(source, alive)
