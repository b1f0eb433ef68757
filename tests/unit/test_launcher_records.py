"""What a job records and reports for launchers without ranks of their own: ``job.json``'s
command (redacted) and the summary's exit column."""

from __future__ import annotations

import pytest

from corral.cluster import load_cluster
from corral.job.engine import dry_run, job_json, redact_words
from corral.job.result import NodeReport, NodeRun, RankRecord
from corral.job.summary import _exit_text
from corral.plan.launchers import CommandOptions
from corral.plan.spec import JobSpec
from corral.redact import REDACTED
from corral.transport.options import SshOptions

SPEC = JobSpec(
    script="",
    launcher="command",
    launcher_options=CommandOptions("echo {node_rank}"),
    env={"HF_TOKEN": "hf_0123456789", "DB": "postgres://u:pw@h/db", "SHORT_KEY": "ab"},
    secret_env=("DB",),
)


@pytest.mark.parametrize(
    ("word", "shown"),
    [
        ("HF_TOKEN=abc python t.py", f"HF_TOKEN={REDACTED} python t.py"),
        ("MY_SECRET=x; echo y", f"MY_SECRET={REDACTED}; echo y"),
        ('DB="a b" run', f"DB={REDACTED} run"),
        ("PASSWORD='q r'&&ls", f"PASSWORD={REDACTED}&&ls"),
        ("--api-key=zz", f"--api-key={REDACTED}"),
        ("FOO=bar a.KEY=1", "FOO=bar a.KEY=1"),  # not secret names; an attribute, not a variable
        ("echo hf_0123456789!", f"echo {REDACTED}!"),  # a secret --env value anywhere
        ("url postgres://u:pw@h/db", f"url {REDACTED}"),  # --secret-env DB
        ("ab stays", "ab stays"),  # a value this short is not searched for
    ],
)
def test_redact_words(word: str, shown: str) -> None:
    assert redact_words([word], SPEC) == [shown]


def test_job_json_records_each_nodes_rendered_command() -> None:
    prepared = dry_run(SPEC, load_cluster("local:2"))
    record = job_json(prepared, SshOptions())
    assert record["command"] == ["bash", "-c", "echo 0"]
    assert [h["argv"] for h in record["hosts"]] == [["bash", "-c", f"echo {i}"] for i in (0, 1)]
    assert record["command_template"] == "echo {node_rank}"
    script = dry_run(
        JobSpec(script="t.py", args=("--token=abcd",), launcher="python"), load_cluster("n1:1")
    )
    plain = job_json(script, SshOptions())
    assert plain["command"] == ["t.py", f"--token={REDACTED}"]
    assert "argv" not in plain["hosts"][0] and "command_template" not in plain


def test_the_exit_column_falls_back_to_the_nodes_own_code() -> None:
    node = NodeRun(command=dry_run(SPEC, load_cluster("local:1")).commands[0])
    assert _exit_text(node) == "-"  # nothing known yet
    node.report = NodeReport(code=9)  # the agent's node_exit
    assert _exit_text(node) == "9"
    node.report = NodeReport(code=-15)
    assert _exit_text(node) == "SIGTERM"
    node.report = NodeReport(started=False)  # start_failed: the launcher never ran
    assert _exit_text(node) == "-"
    node.report = NodeReport(code=-15)
    node.ranks[0] = RankRecord(host="local-0", rank=0, code=3, exited=True)
    assert _exit_text(node) == "3"  # the ranks' codes when there are ranks
