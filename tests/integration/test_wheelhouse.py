"""``make wheelhouse`` here (PyPI answers), then ``make gpu-check WHEELHOUSE=DIR`` into a
fresh interpreter that reaches no registry: corral is installed from the directory alone
(``pip --no-index``), imported from that interpreter's site-packages (not a PYTHONPATH),
and gpu-check's run with it (the no-GPU dry run on this machine) passes.

The download needs the network to PyPI (this machine has it); the install runs in a
network namespace without any network when this machine can make one (root, unshare).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _offline(argv: list[str]) -> list[str]:
    """``argv`` in a network namespace with only a loopback (the local nodes need it),
    when this machine can make one; else ``argv`` as it is (``--no-index`` still
    keeps pip off every index)."""
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        script = 'ip link set lo up && exec "$@"'
        return ["unshare", "--net", "sh", "-c", script, "sh", *argv]
    return argv


def test_a_wheelhouse_installs_corral_without_an_index_and_gpu_check_runs_with_it(
    tmp_path: Path,
) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "PYTHONPATH"))}
    # corral's wheel built with this interpreter's setuptools: build isolation's own
    # install of them (~1.5 CPU-s) is not what is tested here
    built = _run(
        ["make", "-s", "wheelhouse", f"WHEELHOUSE={wheelhouse}", f"PYTHON={sys.executable}"],
        {**env, "PIP_NO_BUILD_ISOLATION": "0"},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    names = sorted(p.name for p in wheelhouse.iterdir())
    assert all(n.endswith(".whl") for n in names), names
    assert any(n.startswith("corral-") for n in names)
    for needed in ("typer-", "pydantic_core-", "psutil-", "nvidia_ml_py-", "asyncssh-"):
        assert any(n.lower().startswith(needed) for n in names), (needed, names)
    assert not [n for n in names if n.startswith("torch")], names  # the target keeps its own
    assert " wheels (" in built.stdout and "make gpu-check WHEELHOUSE=" in built.stdout

    venv = tmp_path / "target"  # a fresh interpreter: nothing but pip in it
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300
    )
    _give_pip(venv, tmp_path / "pip-only")
    python = str(venv / "bin" / "python")
    env["PIP_INDEX_URL"] = "http://127.0.0.1:9/simple"  # any index asked would fail
    gpu_check = _offline(["make", "gpu-check", f"WHEELHOUSE={wheelhouse}", f"PYTHON={python}"])

    # without torch the install works, and the check says what the target lacks
    first = _run(gpu_check, env)
    assert first.returncode != 0
    assert f"--isolated install --no-index --find-links {wheelhouse}" in first.stdout
    assert f"gpu-check: corral installed into {python} from {wheelhouse} (no index)" in first.stdout
    assert "nvml             FAIL (exit 1)" in first.stdout
    assert f"software: local-0: torch is not installed for {python}" in first.stdout

    # the GPU machine's interpreter has its own torch: give this one the project's
    _give_torch(venv)
    second = _run(gpu_check, env)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "no GPUs on this machine: CPU dry run of the plumbing" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith(("nvml ", "plan "))}
    assert rows["nvml"].split()[1] == "ok" and rows["plan"].split()[1] == "ok"

    where = subprocess.run(
        [python, "-c", "import corral, pynvml; print(corral.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert where.stdout.strip().startswith(str(venv / "lib")), where.stdout


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def _give_pip(venv: Path, link_dir: Path) -> None:
    """Make this interpreter's pip (and nothing else of its site-packages) importable in
    ``venv``: the venv is made ``--without-pip``, which spares ensurepip's install of a
    pip (~3.5 CPU-s); pip installs into the interpreter that runs it, ``venv``."""
    spec = importlib.util.find_spec("pip")
    assert spec is not None and spec.origin is not None
    link_dir.mkdir()
    (link_dir / "pip").symlink_to(Path(spec.origin).parent, target_is_directory=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "pip-only.pth").write_text(f"{link_dir}\n")


def _give_torch(venv: Path) -> None:
    """Make the project's torch importable in ``venv`` (after what the wheelhouse
    installed there, which comes first on its path), with a ``torchrun`` next to its
    interpreter, as a GPU machine's own interpreter has them."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "machine-torch.pth").write_text(str(Path(spec.origin).parents[1]) + "\n")
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom torch.distributed.run import main\n"
        "sys.exit(main())\n"
    )
    torchrun.chmod(0o755)
