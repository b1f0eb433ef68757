"""``python -m corral.diagnose.frtrace DIR PREFIX LAST``: torch's flight recorder
analyser over the per-rank dumps ``DIR/<PREFIX><rank>``, as one JSON line.

torch's analyser (``torch.distributed.flight_recorder.components``, the library
behind ``torchfrtrace``) is plain Python over the standard library, but importing
it through the ``torch`` package loads libtorch first: seconds of a busy
coordinator's CPU before the hang report can be written. So it is loaded from
torch's files without running ``torch/__init__.py`` (stand-in parent packages
pointing at torch's own directories), and through the real package only when that
does not work with this torch. It runs in its own process: the coordinator's
never holds a stand-in ``torch`` module, nor unpickles what the ranks sent, and
the reader's own switches (it turns the garbage collector off) die with it.

The line written: ``{"finding": {...} | null, "last": {rank: [entry, ...]}}`` or
``{"error": "why"}``; ``finding`` is the first collective not every rank of its
group entered (torch's ``Collective`` fields corral reports), ``last`` each rank's
``LAST`` newest entries, oldest first.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import logging
import pickle
import sys
import types
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["analyse", "main"]

_COMPONENTS = "torch.distributed.flight_recorder.components"
_PARENTS = ("torch", "torch.distributed", "torch.distributed.flight_recorder")


def _stand_ins() -> bool:
    """Put stand-in parent packages of the analyser in ``sys.modules`` (torch's own
    directories, its ``__init__`` files not run); False when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = next(iter(spec.submodule_search_locations))
    for name in _PARENTS:
        module = types.ModuleType(name)
        module.__path__ = [root + name.removeprefix("torch").replace(".", "/")]
        sys.modules[name] = module
    return True


class _DataOnly(pickle.Unpickler):
    """An unpickler of plain data: a dump is dicts, lists, strings and numbers (torch's
    recorder writes no global), and a rank -- code of whoever submitted the job -- may
    write any bytes there, so a pickle naming a class or function (how a pickle runs
    code) is refused, never loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"a flight recorder dump names {module}.{name}: not a dump, not loaded"
        )


def _load_data(file: IO[bytes]) -> Any:
    return _DataOnly(file).load()


def _data_only(loader: types.ModuleType) -> types.ModuleType:
    """torch's loader with its ``pickle.load`` the data-only one."""
    loader.pickle = types.SimpleNamespace(  # type: ignore[attr-defined]
        load=_load_data, UnpicklingError=pickle.UnpicklingError
    )
    return loader


def _analyser() -> tuple[Any, Any, Any]:
    """torch's ``build_db``, ``JobConfig`` and ``read_dir`` (its dumps read as plain
    data only: :class:`_DataOnly`); ImportError without torch."""
    logging.getLogger("Flight Recorder").disabled = True  # its notes are not the user's
    names = ("builder", "config_manager", "loader")
    if "torch" not in sys.modules and _stand_ins():
        try:
            builder, config, loader = (importlib.import_module(f"{_COMPONENTS}.{n}") for n in names)
            return builder.build_db, config.JobConfig, _data_only(loader).read_dir
        except Exception:  # this torch's analyser needs torch itself: import it for real
            for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
                del sys.modules[name]
    builder, config, loader = (importlib.import_module(f"{_COMPONENTS}.{n}") for n in names)
    return builder.build_db, config.JobConfig, _data_only(loader).read_dir


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One entry as the report shows it: op, seq, state, sizes, group."""
    group = entry.get("process_group") or ("", "")
    p2p = bool(entry.get("is_p2p"))
    seq = entry.get("p2p_seq_id" if p2p else "collective_seq_id")
    return {
        "op": str(entry.get("profiling_name") or "?"),
        "seq": seq if isinstance(seq, int) else None,
        "p2p": p2p,
        "state": str(entry.get("state") or "?"),
        "input_sizes": list(entry.get("input_sizes") or []),
        "output_sizes": list(entry.get("output_sizes") or []),
        "group": ":".join(str(part) for part in group),
    }


def _name_unnamed_groups(details: Mapping[str, Any]) -> None:
    """Give a dump's unnamed process group the name its entries use.

    gloo's recorder (torch 2.13) lists the default group under ``""`` in
    ``pg_config`` while its entries say ``("0", "default_pg")``, which torch's
    analyser cannot match; with exactly one such group the entry is renamed."""
    for dump in details.values():
        config = dump.get("pg_config")
        if not isinstance(config, dict) or "" not in config:
            continue
        unknown = {
            tuple(entry["process_group"])
            for entry in dump.get("entries") or []
            if isinstance(entry.get("process_group"), (list, tuple))
            and len(entry["process_group"]) == 2
            and str(entry["process_group"][0]) not in config
        }
        if len(unknown) == 1:
            name, desc = (str(part) for part in unknown.pop())
            config[name] = {**config.pop(""), "name": name, "desc": desc}


def _finding(collective: Any) -> dict[str, Any]:
    missing = sorted(collective.missing_ranks or ())
    others = getattr(collective, "mismatch_collectives", None) or {}
    return {
        "collective": str(collective.collective_name),
        "sequence": int(collective.collective_seq_id),
        "group": str(collective.pg_desc),
        "state": str(collective.collective_state),
        "missing_ranks": missing,
        "expected_ranks": sorted(collective.expected_ranks),
        "frames": [
            f"{f.get('name')} ({f.get('filename')}:{f.get('line')})"
            for f in (collective.collective_frames or [])[:5]
        ],
        "mismatched": [
            {"rank": int(rank), "collective": str(getattr(other, "collective_name", "?"))}
            for rank, other in sorted(others.items())
        ]
        if not missing
        else [],
    }


def analyse(directory: str, prefix: str = "rank_", last: int = 5) -> dict[str, Any]:
    """The analysis as JSON values (see the module doc); never raises."""
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            build_db, job_config, read_dir = _analyser()
    except ImportError as exc:
        return {"error": f"torch's flight recorder analyser is not available: {exc}"}
    try:
        args = job_config().parse_args([directory, "--allow-incomplete-ranks", "--prefix", prefix])
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            details, version = read_dir(args)
            _name_unnamed_groups(details)
            entries = {
                int(dump["rank"]): [_entry(e) for e in dump.get("entries") or []]
                for dump in details.values()
            }
            database = build_db(details, args, version)
    except BaseException as exc:  # torch's reader raises anything, SystemExit included
        return {"error": f"cannot analyse the flight recorder dumps in {directory}: {exc!r}"}
    found = next((c for c in database.collectives if c.missing_ranks or not c.pass_check), None)
    return {
        "finding": None if found is None else _finding(found),
        "last": {str(rank): rows[-last:] for rank, rows in sorted(entries.items())},
    }


def main(argv: list[str]) -> int:
    """Print :func:`analyse` of ``DIR [PREFIX [LAST]]`` as one JSON line."""
    if not argv:
        print("usage: python -m corral.diagnose.frtrace DIR [PREFIX [LAST]]", file=sys.stderr)
        return 2
    prefix = argv[1] if len(argv) > 1 else "rank_"
    last = int(argv[2]) if len(argv) > 2 else 5
    sys.stdout.write(json.dumps(analyse(argv[0], prefix, last)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
