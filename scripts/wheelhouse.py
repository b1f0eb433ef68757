"""``make wheelhouse``: corral and every runtime dependency as wheels, for a machine
that reaches no package registry (``make gpu-check WHEELHOUSE=DIR`` installs from it).

Built here, where PyPI answers: corral's own wheel (``pip wheel --no-deps .``), then
its dependencies and the ``[gpu]`` extra (NVML's bindings) for the target's Python
version and platform (``pip download --only-binary=:all: --python-version X
--platform P``: wheels only, so nothing has to be compiled there). torch is never
included: the target keeps its own (CUDA) build. Copy the directory over and run::

    make gpu-check WHEELHOUSE=DIR PYTHON=python3    # pip install --no-index --find-links DIR

    python scripts/wheelhouse.py [--dest wheelhouse] [--python-version 3.12]
        [--platform manylinux2014_x86_64 ...] [--extras gpu]

Without ``--python-version``/``--platform`` the wheels are for this machine's
interpreter. Exit 1 (with pip's own message) when a wheel is missing for the target.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What the target needs besides torch: the [gpu] extra (make gpu-check's NVML).
DEFAULT_EXTRAS = ("gpu",)
#: Distributions a wheelhouse never carries: the target's own torch build (and the
#: CUDA libraries a torch wheel pulls).
EXCLUDED = ("torch", "nvidia-cublas", "nvidia-cudnn", "nvidia-nccl", "triton")


def _pip(python: str, *args: str) -> None:
    argv = [python, "-m", "pip", *args]
    print(f"wheelhouse: {shlex.join(argv)}", flush=True)
    done = subprocess.run(argv, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"wheelhouse: pip failed (exit {done.returncode}): {shlex.join(argv)}")


def corral_wheel(python: str, dest: Path) -> Path:
    """Build corral's own wheel into ``dest`` (replacing an older one there)."""
    for old in dest.glob("corral-*.whl"):
        old.unlink()
    _pip(python, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(ROOT))
    (wheel,) = dest.glob("corral-*.whl")
    return wheel


def target_args(python_version: str | None, platforms: list[str]) -> list[str]:
    """``pip download``'s options that name the target interpreter and platform."""
    args = ["--only-binary=:all:"]
    if python_version:
        args += ["--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        args += ["--platform", platform]
    return args


def build(
    dest: Path,
    python_version: str | None = None,
    platforms: list[str] | None = None,
    extras: tuple[str, ...] = DEFAULT_EXTRAS,
    python: str = sys.executable,
) -> list[Path]:
    """Fill ``dest`` with corral's wheel and its dependencies' wheels; return them all."""
    dest.mkdir(parents=True, exist_ok=True)
    wheel = corral_wheel(python, dest)
    spec = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    _pip(
        python,
        "download",
        "--quiet",
        "--dest",
        str(dest),
        *target_args(python_version, platforms or []),
        spec,
    )
    wheels = sorted(dest.glob("*.whl"))
    carried = [w for w in wheels if w.name.lower().replace("_", "-").startswith(EXCLUDED)]
    if carried:
        names = ", ".join(w.name for w in carried)
        raise SystemExit(f"wheelhouse: torch must not be in a wheelhouse, found {names}")
    return wheels


def main(argv: list[str] | None = None) -> int:
    """Build the wheelhouse and say what to run on the target."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", type=Path, default=ROOT / "wheelhouse", help="the directory")
    p.add_argument("--python-version", help="the target's Python, e.g. 3.12 (default: this one)")
    p.add_argument(
        "--platform",
        action="append",
        default=[],
        help="a wheel platform tag of the target, e.g. manylinux2014_x86_64 (repeatable; "
        "default: this machine's)",
    )
    p.add_argument(
        "--extras",
        default=",".join(DEFAULT_EXTRAS),
        help="corral's extras to include (comma-separated; default: gpu)",
    )
    args = p.parse_args(argv)
    platforms = [tag for value in args.platform for tag in value.split() if tag]
    extras = tuple(e for e in args.extras.split(",") if e)
    wheels = build(args.dest.resolve(), args.python_version, platforms, extras)
    size = sum(w.stat().st_size for w in wheels) / 2**20
    here = ".".join(map(str, sys.version_info[:2]))
    target = f"Python {args.python_version or here}" + (
        f", {', '.join(platforms)}" if platforms else ", this machine's platform"
    )
    print(f"wheelhouse: {len(wheels)} wheels ({size:.1f} MiB) in {args.dest} for {target}")
    print(
        "wheelhouse: on the target (its own interpreter, with its CUDA torch): "
        f"make gpu-check WHEELHOUSE={args.dest} PYTHON=python3"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
