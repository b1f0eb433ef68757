"""The whole state through a heal: user state objects carried beside the model and
the optimizer, and a digest compared across the replica groups after every quorum
change (``sdk.fault_tolerant(..., state={...})``).

Anything with ``state_dict()`` / ``load_state_dict()`` is carried: an LR scheduler,
a grad scaler, a sampler's position, an RNG stream (:class:`RNGState`). A group that
heals loads them from the live peer together with the weights, at the start of the
step (the quorum is then synchronous, as ``ft.indices()`` makes it anyway), so it
holds what its peers hold at the same point of the step. After every quorum change
(a group joined, healed or left) every group hashes the model, the optimizer and
each carried object; the digests are exchanged in one small all-reduce, and any
object that differs between groups fails every group loudly, naming the object and
the groups (:class:`StateMismatch`): training on with a scheduler or a sampler that
was not healed is the silent error this turns into a named one.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Carried", "RNGState", "StateMismatch", "digest", "mismatches"]

#: Names the model's and the optimizer's digests go by (never a carried object's).
RESERVED = ("model", "optimizer")
_BITS = 48  # a digest as an int64 that sums exactly (one non-zero row per column)


class StateMismatch(RuntimeError):
    """Replica groups hold different states after a heal (names the objects)."""


def _feed(h: Any, value: Any) -> None:
    """Hash ``value`` deterministically (tensors by dtype, shape and bytes)."""
    if isinstance(value, Mapping):
        h.update(b"{")
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for item in value:
            _feed(h, item)
        h.update(b"]")
    elif hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor
        import torch

        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, float):
        h.update(struct.pack("<d", value))
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a numpy array
        h.update(f"N{value.dtype}{getattr(value, 'shape', ())}".encode() + value.tobytes())
    else:
        h.update(repr(value).encode())


def digest(state: Any) -> int:
    """A 48-bit digest of a state dict (equal states: equal digests)."""
    h = hashlib.blake2b(digest_size=8)
    _feed(h, state)
    return int.from_bytes(h.digest(), "big") >> (64 - _BITS)


def _state(obj: Any) -> Any:
    return obj.state_dict()


class Carried:
    """The user's named state objects (``state=`` of ``sdk.fault_tolerant``)."""

    def __init__(self, objects: Mapping[str, Any] | None) -> None:
        self.objects: dict[str, Any] = dict(objects or {})
        for name, obj in self.objects.items():
            if not isinstance(name, str) or not name or name in RESERVED:
                raise ValueError(
                    f"state: {name!r} cannot name a state object (a non-empty name other "
                    f"than {', '.join(RESERVED)}, which are always carried)"
                )
            if not callable(getattr(obj, "state_dict", None)) or not callable(
                getattr(obj, "load_state_dict", None)
            ):
                raise TypeError(
                    f"state[{name!r}]: a {type(obj).__name__} has no state_dict() and "
                    "load_state_dict(): it cannot be carried through a heal (wrap it in an "
                    "object that has them)"
                )

    def __bool__(self) -> bool:
        return bool(self.objects)

    def snapshot(self) -> dict[str, Any]:
        """Every object's state, copied (a peer reads it while this group trains on)."""
        return {name: copy.deepcopy(_state(obj)) for name, obj in self.objects.items()}

    def load(self, states: Mapping[str, Any]) -> None:
        """Restore each object from ``states`` (a snapshot); KeyError naming a missing one."""
        for name, obj in self.objects.items():
            if name not in states:
                raise KeyError(
                    f"state[{name!r}] is not in the state being loaded (a peer's, in a heal, "
                    "or a checkpoint's): every group must pass the same state= names, and a "
                    "checkpoint written without it lacks it"
                )
            obj.load_state_dict(copy.deepcopy(states[name]))

    def names(self) -> list[str]:
        """The digested objects, in order: the model, the optimizer, then the user's."""
        return [*RESERVED, *self.objects]

    def digests(self, model: Any, optimizer: Any) -> list[int]:
        """One digest per :meth:`names` entry."""
        return [
            digest(model.state_dict()),
            digest(optimizer.state_dict()),
            *(digest(_state(obj)) for obj in self.objects.values()),
        ]


def mismatches(names: Sequence[str], rows: Sequence[Sequence[int]]) -> list[str]:
    """``rows``: one per participating group, ``[group, digest...]`` (``names`` order).
    One phrase per object that differs: ``'scheduler' (group 0: 3fa2..., group 1:
    91c0...)``; empty when every group holds the same."""
    found = []
    for column, name in enumerate(names, start=1):
        values = {row[column] for row in rows}
        if len(values) > 1:
            held = ", ".join(
                f"group {row[0]}: {row[column]:012x}" for row in sorted(rows, key=lambda r: r[0])
            )
            found.append(f"{name!r} ({held})")
    return found


class RNGState:
    """An RNG stream as a state object: torch's generator (default: the global one),
    and with ``python=True`` Python's ``random`` too."""

    def __init__(self, generator: Any = None, *, python: bool = False) -> None:
        self.generator, self.python = generator, python

    def _gen(self) -> Any:
        if self.generator is not None:
            return self.generator
        import torch

        return torch.default_generator

    def state_dict(self) -> dict[str, Any]:
        """The generator's state (and ``random``'s)."""
        state: dict[str, Any] = {"torch": self._gen().get_state()}
        if self.python:
            import random

            state["python"] = random.getstate()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self._gen().set_state(state["torch"])
        if self.python and "python" in state:
            import random

            random.setstate(state["python"])
