"""Which tree on this machine the hosts' ``--workdir`` must match (the code check's
reference), resolved by default so that ``corral check`` and ``corral run``'s
pre-flight compare code without ``--code-dir`` in the natural flow:

1. ``--code-dir`` when given;
2. the current directory when the hosts run in the same place: no ``--workdir``,
   the same absolute path, or the same path under the home directory (``~/x``,
   or a relative ``x``, which the hosts read from their home);
3. the current directory when ``corral sync`` recorded pushing it to ``--workdir``
   on one of the hosts (``corral sync . --dest DIR``, then ``--workdir DIR``).

Otherwise there is nothing to compare, and :attr:`CodeReference.why_not` says why
and which option fixes it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from corral.cluster.model import Cluster
from corral.sync.state import SyncRecord, describe_age, records_for_dest


class ReferenceOptions(Protocol):
    """What :func:`resolve` reads of the checklist's options (``ChecklistOptions``)."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def code_dir(self) -> str | None: ...

    @property
    def workdir(self) -> str | None: ...

    @property
    def script(self) -> str | None: ...


@dataclass(frozen=True)
class CodeReference:
    """The code tree here (and the entry script here) that the hosts must match.

    ``how`` says why this tree was chosen; ``why_not`` (when ``code_dir`` is None)
    why nothing can be compared, naming the option that fixes it."""

    code_dir: str | None
    script: str | None = None
    how: str = ""
    why_not: str | None = None
    synced: SyncRecord | None = None


def _home_relative(path: str, home: str) -> str | None:
    """``path`` relative to ``home`` (POSIX), or None when it is not below it."""
    try:
        rel = Path(path).relative_to(home)
    except ValueError:
        return None
    return rel.as_posix()


def corresponds(workdir: str, cwd: str, home: str | None = None) -> bool:
    """Whether ``workdir`` on the hosts is the place ``cwd`` is here: the same
    absolute path, or the same path below the home directory."""
    home = home if home is not None else os.path.expanduser("~")
    wd = workdir.rstrip("/") or workdir
    if os.path.isabs(wd):
        return os.path.normpath(wd) == os.path.normpath(cwd)
    if wd == "~" or wd.startswith("~/"):
        wd = wd[1:].lstrip("/")
    if wd.startswith("~"):  # ~user/...: another user's home
        return False
    rel = _home_relative(os.path.normpath(cwd), os.path.normpath(home))
    return rel is not None and os.path.normpath(wd or ".") == os.path.normpath(rel)


def _script(script: str | None, code_dir: str | None) -> str | None:
    if script and not os.path.isabs(script):
        return os.path.join(code_dir, script) if code_dir else None
    return script


def resolve(
    opts: ReferenceOptions,
    *,
    cwd: str | None = None,
    home: str | None = None,
    state: Path | None = None,
) -> CodeReference:
    """The reference for ``opts`` (see the module docstring); none for ``local:N``."""
    if opts.cluster.is_local:
        return CodeReference(None, how="one filesystem (local nodes)")
    cwd = os.path.abspath(cwd or os.getcwd())
    if opts.code_dir:
        code_dir = os.path.abspath(os.path.expanduser(opts.code_dir))
        if not os.path.isdir(code_dir):
            why = f"cannot compare: --code-dir {opts.code_dir} is not a directory here"
            return CodeReference(None, why_not=why)
        return CodeReference(code_dir, _script(opts.script, code_dir), how="--code-dir")
    workdir = opts.workdir
    if workdir is None:
        return CodeReference(cwd, _script(opts.script, cwd), how="the current directory")
    if corresponds(workdir, cwd, home):
        return CodeReference(cwd, _script(opts.script, cwd), how=f"--workdir {workdir} is here")
    names = [h.name for h in opts.cluster.hosts]
    records = records_for_dest(names, workdir, path=state)
    mine = next((r for r in records if os.path.normpath(r.src) == cwd), None)
    if mine is not None:
        how = f"corral sync pushed it to {workdir} ({describe_age(mine.time)})"
        return CodeReference(cwd, _script(opts.script, cwd), how=how, synced=mine)
    script = opts.script if opts.script and os.path.isabs(opts.script) else None
    if records:
        other = records[0].src
        why = (
            f"cannot compare: corral sync last pushed {other} (not this directory, {cwd}) "
            f"to {workdir}; pass --code-dir {shlex.quote(other)}, or run from there"
        )
    else:
        why = (
            f"cannot compare: this directory ({cwd}) is not --workdir {workdir} and corral "
            f"sync has no record of pushing it there; pass --code-dir with this machine's "
            f"copy of {workdir}, or corral sync . --dest {shlex.quote(workdir)} first"
        )
    return CodeReference(None, script, why_not=why)
