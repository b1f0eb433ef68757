"""The job options' one schema (corral.job.schema): every field is found at every entry
point its Option offers (the verbs' flags, the API's JobRequest, the web form, the
Kubernetes and Slurm verbs), and where it is not offered the schema says why. A field
added to the schema and not wired somewhere fails here."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from corral.cli.main import _register, app
from corral.errors import ConfigError
from corral.job.schema import ENTRIES, JobOptions, Option, default_of, options_of
from corral.service.models import OWN, JobRequest

_register()

VERB_OF: dict[str, tuple[str, ...]] = {
    "run": ("run",),
    "plan": ("plan",),
    "submit": ("job", "submit"),
    "k8s": ("k8s", "render"),
    "slurm": ("slurm", "submit"),
}
"""The command each command-line entry point is checked on."""
NEW_JOB_PAGE = (
    Path(__file__).parents[2] / "src" / "corral" / "web" / "templates" / "new_job.html"
).read_text(encoding="utf-8")


@functools.cache
def _root() -> Any:
    """The CLI's click command tree, built once (typer builds it anew on each call:
    a fifth of a second, for each of a few hundred look-ups)."""
    return typer.main.get_command(app)


def _command(*path: str) -> Any:
    command: Any = _root()
    for name in path:
        command = command.commands[name]
    return command


def _params(*path: str) -> set[str]:
    return {p.name for p in _command(*path).params}


def _form_inputs() -> set[str]:
    """The ids of the new-job form's inputs: the generated sections and the page's own."""
    from corral.web.form import option_sections

    generated = {f.name for section in option_sections() for f in section.fields}
    return generated | set(re.findall(r'id="([a-z_]+)"', NEW_JOB_PAGE))


ACTOR_SAMPLES: dict[str, Any] = {
    "python": "/opt/py/bin/python3",
    "master_addr": "10.0.0.9",
    "master_port": 1234,
    "workdir": "/srv/work",
    "env": {"K": "v", "FOO": "1"},
    "secret_env": ("K",),
    "nccl_interface": "eth9",
    "gloo_interface": "eth8",
    "collective_timeout": 42.0,
    "checkpoint_dir": "/ckpt",
    "run_dir": "/elsewhere",
    "job_id": "other-id",
    "qos": "utility",
    "workload_weights": (1.0, 3.0),
    "max_restarts": 2,
    "restart_backoff": 3.0,
    "host_timeout": 7.0,
    "grace": 1.0,
}
"""A value for each field the actors runtime takes: the finder sees the field there when
it changes what the builder readies for the workers (their spec, env, policies)."""


def _actors_take(name: str) -> bool:
    """Field ``name`` set on an actors job (two SSH hosts) changes its ready workers."""
    from corral.cluster.model import Cluster, Host
    from corral.job.build import ready_ranks
    from corral.job.describe import JobDescription

    if name not in ACTOR_SAMPLES:
        return False
    base = JobOptions(job_id="j", env={"K": "v"})
    cluster = Cluster(hosts=(Host(name="a"), Host(name="b")))

    def ready(options: JobOptions) -> str:
        made = ready_ranks(JobDescription(options, cluster), "/w.py")
        return repr((made.spec, made.policies, made.ranks, made.master_addr))

    return ready(dataclasses.replace(base, **{name: ACTOR_SAMPLES[name]})) != ready(base)


def _finders() -> dict[str, Callable[[str, Option], bool]]:
    def verb(entry: str) -> Callable[[str, Option], bool]:
        def found(name: str, opt: Option) -> bool:
            param = f"no_{name}" if opt.negate else opt.name_at(entry, name)
            return param in _params(*VERB_OF[entry])

        return found

    inputs = _form_inputs()
    return {
        **{entry: verb(entry) for entry in VERB_OF},
        "api": lambda name, opt: opt.name_at("api", name) in JobRequest.model_fields,
        "web": lambda name, opt: opt.name_at("web", name) in inputs,
        "actors": lambda name, opt: _actors_take(name),
    }


def missing(fields: list[tuple[str, Option]]) -> list[str]:
    """``field@entry`` for each entry point a field claims and is not found at, and for
    each one it leaves out without a reason."""
    finders = _finders()
    out: list[str] = []
    for name, opt in fields:
        for entry in ENTRIES:
            if entry in opt.not_at:
                if not opt.not_at[entry].strip():
                    out.append(f"{name}@{entry}: no reason given")
            elif not finders[entry](name, opt):
                out.append(f"{name}@{entry}")
    return out


def test_every_field_is_at_every_entry_point_or_says_why() -> None:
    assert missing([(f.name, o) for f, o in options_of()]) == []


def test_a_field_added_and_not_wired_is_found_missing() -> None:
    unwired = Option(help="a new option nothing offers yet", flag="--brand-new")
    assert missing([("brand_new", unwired)]) == [f"brand_new@{e}" for e in ENTRIES]
    no_reason = Option(help="x", not_at=dict.fromkeys(ENTRIES, " "))
    assert missing([("vague", no_reason)]) == [f"vague@{e}: no reason given" for e in ENTRIES]


@pytest.mark.parametrize("item", [f for f, o in options_of("api") if f.name not in OWN])
def test_the_api_field_has_the_schemas_default_and_help(item: dataclasses.Field[Any]) -> None:
    field = JobRequest.model_fields[item.name]
    assert field.get_default(call_default_factory=True) == default_of(item)
    assert field.description == item.metadata["option"].help_at("api")


@pytest.mark.parametrize("entry", list(VERB_OF))
def test_a_verbs_flag_defaults_are_the_schemas(entry: str) -> None:
    defaults = {p.name: p.default for p in _command(*VERB_OF[entry]).params}
    for item, opt in options_of(entry):
        if opt.flag is None or opt.negate:
            continue
        value = default_of(item)
        if item.name == "nproc_per_node" or isinstance(value, tuple | dict):
            continue  # parsed from text / a repeated flag: no default but empty
        assert defaults[item.name] == value, (entry, item.name)


def test_one_master_port_default_everywhere() -> None:
    """corral run used 29500 and job submit / the API 0: the schema's 0 won."""
    assert JobOptions().master_port == 0
    assert JobRequest(script="t.py").master_port == 0
    for entry in ("run", "plan", "submit", "slurm", "k8s"):
        found = {p.name: p.default for p in _command(*VERB_OF[entry]).params}
        assert found["master_port"] == 0, entry


def test_collective_timeout_reaches_every_rank(tmp_path: Path) -> None:
    """--collective-timeout from corral plan (as corral run plans it) is each rank's
    CORRAL_DIST_TIMEOUT, which corral.sdk.init_distributed applies; --dist-timeout,
    the Kubernetes and Slurm verbs' old name, is the same flag."""
    import json

    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    runner = CliRunner()
    for flag in ("--collective-timeout", "--dist-timeout"):
        result = runner.invoke(
            app,
            [
                "plan",
                "--hosts",
                "local:2",
                "--launcher",
                "python",
                flag,
                "42",
                "--json",
                "--",
                str(script),
            ],
        )
        assert result.exit_code == 0, result.output
        nodes = json.loads(result.stdout)["nodes"]
        assert [n["env"]["CORRAL_DIST_TIMEOUT"] for n in nodes] == ["42", "42"]
    default = runner.invoke(
        app, ["plan", "--hosts", "local:1", "--launcher", "python", "--json", "--", str(script)]
    )
    assert json.loads(default.stdout)["nodes"][0]["env"]["CORRAL_DIST_TIMEOUT"] == "1800"


def test_collective_timeout_in_the_k8s_and_slurm_renders() -> None:
    runner = CliRunner()
    k8s = runner.invoke(
        app,
        ["k8s", "render", "--image", "img", "--collective-timeout", "77", "--", "t.py"],
    )
    assert k8s.exit_code == 0, k8s.output
    assert re.search(r"name: CORRAL_DIST_TIMEOUT\s+value: ['\"]?77", k8s.stdout)
    slurm = runner.invoke(app, ["slurm", "render", "--collective-timeout", "77", "--", "t.py"])
    assert slurm.exit_code == 0, slurm.output
    assert "CORRAL_DIST_TIMEOUT=77" in slurm.stdout


def test_collective_timeout_from_the_api_and_the_form() -> None:
    from pydantic import ValidationError

    from corral.web.form import option_sections

    assert JobRequest(script="t.py", collective_timeout=90).collective_timeout == 90
    with pytest.raises(ValidationError, match="collective_timeout"):
        JobRequest(script="t.py", collective_timeout=0)
    fields = {f.name: f for s in option_sections() for f in s.fields}
    assert fields["collective_timeout"].default == 1800.0
    assert fields["collective_timeout"].kind == "number"


def _out_of_bounds(opt: Option) -> Any:
    """A value outside ``opt``'s bounds (the first one that has such a value)."""
    bounds = opt.bounds
    if "pattern" in bounds:
        return "a b"
    if "min_length" in bounds:
        return ""
    if "max_length" in bounds:
        return "x" * (bounds["max_length"] + 1)
    if "gt" in bounds:
        return bounds["gt"]
    if "ge" in bounds:
        return bounds["ge"] - 1
    return bounds.get("le", bounds.get("lt")) + 1


@pytest.mark.parametrize("item", [f for f, o in options_of() if o.bounds], ids=lambda f: f.name)
def test_the_builder_refuses_what_the_api_refuses(item: dataclasses.Field[Any]) -> None:
    """A value the API's JobRequest refuses (the schema's bounds) is refused by the one
    builder too, naming the flag: corral run, plan, the renders and the actors alike."""
    from corral.job.build import job_spec, policies

    opt: Option = item.metadata["option"]
    base = JobOptions(command=("t.py",), launcher="python", env={"K": "v"})
    bad = dataclasses.replace(base, **{item.name: _out_of_bounds(opt)})
    with pytest.raises(ConfigError) as caught:
        policies(bad)
        job_spec(bad)
    assert caught.value.option == (opt.flag or item.name)


def test_no_verb_writes_a_job_flags_default_again() -> None:
    """The verbs that take a few job flags (``check``, ``calibrate``: a parameter
    annotated with one of cli.options' ``flag_of`` aliases) take its default from the
    schema (``FLAG_DEFAULTS``), never as a literal of their own (None: not given)."""
    import ast

    cli = Path(__file__).parents[2] / "src" / "corral" / "cli"
    face = ast.parse((cli / "options.py").read_text(encoding="utf-8"))
    aliases = {
        target.id
        for node in face.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", "") == "flag_of"
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert {"RunDirOpt", "MasterPortOpt", "ThresholdOpt"} <= aliases
    copies = []
    for path in sorted(cli.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            args = [*node.args.args, *node.args.kwonlyargs]
            defaults = [*node.args.defaults, *node.args.kw_defaults]
            for arg, default in zip(args[len(args) - len(defaults) :], defaults, strict=True):
                literal = isinstance(default, ast.Constant) and default.value is not None
                if getattr(arg.annotation, "id", None) in aliases and literal:
                    copies.append(f"{path.name}:{default.lineno} {arg.arg}")
    assert copies == []
