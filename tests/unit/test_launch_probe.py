"""Pre-launch probes of SSH hosts, against the scripted fake transport."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence

import pytest

import corral
from corral.agent.probe import MAX_TEXT, read_answer
from corral.cluster import Host
from corral.errors import LaunchError
from corral.job.agents import HostProbe, VersionMismatch, agent_argv, problems, start_agents
from corral.transport.fake import FakeNode, FakeTransport
from corral.transport.local import LocalTransport

HOSTS = [Host("h1", slots=1), Host("h2", slots=1)]


def _probe(**kw: object) -> HostProbe:
    base: dict[str, object] = dict(
        host="h1",
        python="/usr/bin/python3",
        hostname="h1",
        has_torch=True,
        workdir_ok=True,
        port=29500,
    )
    base.update(kw)
    return HostProbe(**base)  # type: ignore[arg-type]


def test_problems_name_what_is_wrong() -> None:
    assert problems(_probe(), need_torch=True, workdir="/w", port=29500) == []
    [torch] = problems(_probe(has_torch=False), need_torch=True, workdir=None, port=None)
    assert "torch is not installed for /usr/bin/python3" in torch
    [wd] = problems(_probe(workdir_ok=False), need_torch=False, workdir="/w", port=None)
    assert wd == "--workdir /w does not exist"
    [cwd] = problems(
        _probe(workdir_ok=False), need_torch=False, workdir="/w", port=None, workdir_given=False
    )
    assert "current directory" in cwd and "--workdir" in cwd
    [port] = problems(
        _probe(port=None, port_error="in use"), need_torch=False, workdir=None, port=29500
    )
    assert "master port 29500 cannot be bound (in use)" in port


def test_agent_argv_tries_interpreters_in_order() -> None:
    argv = agent_argv("/opt/py/bin/python")
    assert argv[:2] == ["sh", "-c"] and argv[-1] == "/opt/py/bin/python"
    assert agent_argv(None)[-1] == "python3"


def _agent(workdir_ok: bool, version: str | None = corral.__version__) -> object:
    async def behaviour(node: FakeNode) -> int:
        op = await node.next_op("probe")
        fields = {"version": version} if version is not None else {}
        node.event(
            "probe",
            executable="/usr/bin/python3",
            hostname=node.host.name,
            torch=True,
            workdir_ok=workdir_ok,
            port=op["port"] if op["port"] is not None else None,
            **fields,
        )
        nxt = await node.next_op()
        return 0 if nxt["op"] == "abort" else 1

    return behaviour


def test_one_bad_host_aborts_every_agent() -> None:
    async def main() -> FakeTransport:
        transport = FakeTransport({"h1": _agent(True), "h2": _agent(False)})  # type: ignore[dict-item]
        with pytest.raises(LaunchError) as err:
            await start_agents(
                transport,
                HOSTS,
                python=None,
                workdir="/code",
                master=HOSTS[0],
                master_port=29500,
                need_torch=True,
            )
        assert str(err.value) == "h2: --workdir /code does not exist"
        return transport

    transport = asyncio.run(main())
    for name in ("h1", "h2"):
        ops = [op["op"] for op in transport.nodes[name].received]
        assert ops == ["probe", "abort"], (name, ops)
    assert transport.nodes["h1"].received[0]["port"] == 29500  # only the master checks it
    assert transport.nodes["h2"].received[0]["port"] is None


def test_unreachable_host_is_named() -> None:
    async def main() -> None:
        transport = FakeTransport({"h1": _agent(True)}, unreachable=["h2"])  # type: ignore[dict-item]
        with pytest.raises(LaunchError, match=r"h2: cannot connect \(unreachable\)"):
            await start_agents(
                transport,
                HOSTS,
                python=None,
                workdir=None,
                master=HOSTS[0],
                master_port=0,
                need_torch=False,
            )

    asyncio.run(main())


def test_ready_hosts_return_their_probes() -> None:
    async def main() -> dict[str, HostProbe]:
        transport = FakeTransport({"h1": _agent(True), "h2": _agent(True)})  # type: ignore[dict-item]
        started = await start_agents(
            transport,
            HOSTS,
            python=None,
            workdir=None,
            master=HOSTS[0],
            master_port=0,
            need_torch=True,
        )
        for proc, _ in started.values():
            proc.write(b'{"op":"abort"}\n')
        return {name: probe for name, (_, probe) in started.items()}

    probes = asyncio.run(main())
    assert probes["h1"].port == 0 and probes["h2"].port is None
    assert probes["h2"].hostname == "h2"


def test_login_shell_noise_is_named_not_a_traceback() -> None:
    async def noisy(node: FakeNode) -> int:
        node.stdout.feed_data(b"Welcome to node h1!\n")
        await node.next_op()
        return 0

    async def main() -> None:
        transport = FakeTransport({"h1": noisy, "h2": _agent(True)})  # type: ignore[dict-item]
        with pytest.raises(LaunchError, match=r"h1: unexpected output before the corral agent"):
            await start_agents(
                transport,
                HOSTS,
                python=None,
                workdir=None,
                master=HOSTS[0],
                master_port=0,
                need_torch=False,
            )

    asyncio.run(main())


def _start(transport: object, hosts: list[Host], *, python: str | None = None) -> object:
    return start_agents(
        transport,  # type: ignore[arg-type]
        hosts,
        python=python,
        workdir=None,
        master=hosts[0],
        master_port=None,
        need_torch=False,
    )


def test_version_mismatch_names_host_and_versions_and_aborts_all() -> None:
    async def main() -> FakeTransport:
        transport = FakeTransport(
            {"h1": _agent(True), "h2": _agent(True, version="0.0.9")}  # type: ignore[dict-item]
        )
        with pytest.raises(LaunchError) as err:
            await _start(transport, HOSTS)  # type: ignore[misc]
        assert str(err.value) == (
            f"h2 runs corral 0.0.9, this coordinator {corral.__version__}: install the same "
            "version on every host (or corral sync)"
        )
        return transport

    transport = asyncio.run(main())
    for name in ("h1", "h2"):  # nothing started anywhere
        assert [op["op"] for op in transport.nodes[name].received] == ["probe", "abort"]


def test_agent_without_version_counts_as_older() -> None:
    async def main() -> None:
        transport = FakeTransport(
            {"h1": _agent(True, version=None), "h2": _agent(True)}  # type: ignore[dict-item]
        )
        with pytest.raises(LaunchError, match=r"^h1 runs an older corral \(no version"):
            await _start(transport, HOSTS)  # type: ignore[misc]

    asyncio.run(main())


def test_malformed_probe_is_named() -> None:
    async def bad(node: FakeNode) -> int:
        await node.next_op("probe")
        node.event("probe", version=corral.__version__, executable=3, hostname="h1")
        await node.next_op()
        return 0

    async def main() -> None:
        transport = FakeTransport({"h1": bad, "h2": _agent(True)})  # type: ignore[dict-item]
        with pytest.raises(LaunchError, match=r"^h1: invalid agent event: probe.executable"):
            await _start(transport, HOSTS)  # type: ignore[misc]

    asyncio.run(main())


ANSWER: dict[str, object] = {
    "event": "probe",
    "time": 1.5,
    "executable": "/usr/bin/python3",
    "hostname": "h",
    "torch": False,
    "workdir_ok": True,
    "port": None,
    "version": "0.1.0",
}


def test_a_probe_answer_keeps_the_fields_the_launch_reads() -> None:
    answer = read_answer({**ANSWER, "facts": {"cpu": 2}})
    assert answer == {**ANSWER, "port_error": None}  # the host's facts are the checklist's
    assert (
        read_answer({**ANSWER, "port": 29500, "port_error": "in use", "time": 2})["port"] == 29500
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"executable": 3}, "executable"),
        ({"hostname": None}, "hostname"),
        ({"executable": "x" * (MAX_TEXT + 1)}, "executable"),
        ({"torch": "yes"}, "torch"),
        ({"workdir_ok": 1}, "workdir_ok"),
        ({"port": 70000}, "port"),
        ({"port": True}, "port"),
        ({"port": "29500"}, "port"),
        ({"port_error": 5}, "port_error"),
        ({"version": "v" * 201}, "version"),
        ({"time": float("nan")}, "time"),
        ({"time": -1.0}, "time"),
        ({"time": "now"}, "time"),
        ({"time": None}, "time"),
    ],
)
def test_a_malformed_probe_answer_names_its_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^invalid agent event: probe\.{field}: ") as err:
        read_answer({**ANSWER, **change})
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_real_agent_reports_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ``python -m corral.agent`` answers with the installed version; a
    coordinator of another version refuses it before anything is launched."""
    host = Host("h1", slots=1)

    async def probe() -> HostProbe:
        transport = LocalTransport()
        try:
            started = await _start(transport, [host], python=sys.executable)  # type: ignore[misc]
            proc, found = started["h1"]
            proc.write(b'{"op":"abort"}\n')
            proc.close_stdin()
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            return found  # type: ignore[no-any-return]
        finally:
            await transport.close()

    installed = corral.__version__
    assert asyncio.run(probe()).version == installed

    monkeypatch.setattr(corral, "__version__", "99.0.0")

    async def refused() -> None:
        transport = LocalTransport()
        try:
            with pytest.raises(LaunchError) as err:
                await _start(transport, [host], python=sys.executable)  # type: ignore[misc]
            assert str(err.value).startswith(
                f"h1 runs corral {installed}, this coordinator 99.0.0:"
            )
        finally:
            await transport.close()

    asyncio.run(refused())


def test_version_mismatch_message() -> None:
    err = VersionMismatch("tb2", "0.1.0", "0.2.0")
    assert str(err) == (
        "tb2 runs corral 0.1.0, this coordinator 0.2.0: install the same version on every "
        "host (or corral sync)"
    )
    assert (err.host, err.agent_version, err.coordinator_version) == ("tb2", "0.1.0", "0.2.0")


class _EnvRecorder(FakeTransport):
    """The fake transport, recording the environment each host's agent got."""

    envs: dict[str, dict[str, str] | None]

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> FakeNode:
        self.envs = getattr(self, "envs", {})
        self.envs[host.name] = dict(env) if env is not None else None
        return await super().start(host, argv, env=env, cwd=cwd)


@pytest.mark.parametrize(("job_id", "env"), [("job-7", {"CORRAL_JOB_ID": "job-7"}), (None, None)])
def test_agents_carry_the_job_id(job_id: str | None, env: dict[str, str] | None) -> None:
    """The pre-flight's stale check knows the job's own agents by this variable."""

    async def main() -> dict[str, dict[str, str] | None]:
        transport = _EnvRecorder({"h1": _agent(True), "h2": _agent(True)})  # type: ignore[dict-item]
        started = await start_agents(
            transport,
            HOSTS,
            python=None,
            workdir=None,
            master=HOSTS[0],
            master_port=None,
            need_torch=False,
            job_id=job_id,
        )
        for proc, _ in started.values():
            proc.write(b'{"op":"abort"}\n')
        await transport.close()
        return transport.envs

    assert asyncio.run(main()) == {"h1": env, "h2": env}
