"""corral.api.streams: a stream that ends with the credential behind it, also while
its source waits for the next item."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from corral.api.streams import until_revoked


def test_a_waiting_stream_ends_once_its_credential_is_gone() -> None:
    async def run() -> tuple[list[int | None], bool]:
        closed = asyncio.Event()
        alive = {"yes": True}

        async def source() -> AsyncIterator[int]:
            try:
                yield 1
                yield 2
                await asyncio.Event().wait()  # a job that writes nothing more
                yield 3
            finally:
                closed.set()

        async def check() -> bool:
            return alive["yes"]

        got: list[int | None] = []
        async for item in until_revoked(source(), check, every=0.01):
            got.append(item)
            if item == 2:
                alive["yes"] = False
        return got, closed.is_set()

    got, closed = asyncio.run(run())
    assert got == [1, 2, None] and closed


def test_a_stream_whose_credential_holds_ends_with_its_source() -> None:
    async def run() -> list[int | None]:
        async def source() -> AsyncIterator[int]:
            for i in range(3):
                await asyncio.sleep(0.02)
                yield i

        async def check() -> bool:
            return True

        return [item async for item in until_revoked(source(), check, every=0.005)]

    assert asyncio.run(run()) == [0, 1, 2]
