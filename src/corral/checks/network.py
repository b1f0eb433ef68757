"""Check 5, network: the master port is free on the master host (and who holds
it when not), every host opens a real TCP connection to ``MASTER_ADDR:PORT``
(a temporary listener stands in for the rendezvous), every host resolves the
master to the same address, and the interface each host uses to reach the
master (by route) is detected: it becomes the host's
``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` unless one is given.
"""

from __future__ import annotations

from typing import Any

from corral.agent.hostfacts import describe_holders
from corral.checks.context import CheckContext, is_loopback
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "network"


def interfaces(ctx: CheckContext) -> dict[str, str]:
    """The detected interface per host that answered (loopback left out)."""
    found: dict[str, str] = {}
    for f in ctx.answered():
        iface = (f.facts.get("route") or {}).get("interface")
        if iface and iface != "lo":
            found[f.host.name] = iface
    return found


def _holders(listener: dict[str, Any]) -> str:
    holders = listener.get("holders") or []
    if not holders:
        return "held by a process corral cannot see (another user's or another namespace's)"
    return "held by " + describe_holders(holders)


def check(ctx: CheckContext) -> CheckResult:
    """See the module docstring."""
    port = ctx.options.master_port
    addr = ctx.master_addr
    hosts: dict[str, HostCheck] = {}
    fixes: list[str] = []
    real_hosts = [h for h in ctx.cluster.hosts if not h.local]
    if is_loopback(addr) and len(real_hosts) > 1:
        hosts = {
            h.name: HostCheck(Status.FAIL, f"master address {addr} is loopback") for h in real_hosts
        }
        return CheckResult.from_hosts(
            NAME,
            hosts,
            error=f"master address {addr} is a loopback address but the job spans "
            f"{len(real_hosts)} hosts: the others would connect to themselves",
            fix_command=f"pass --master-addr with {ctx.master.name}'s address on the cluster "
            "network (or leave it out: the first host's address is used)",
        )
    master_facts = ctx.facts[ctx.master.name]
    listener = master_facts.facts.get("listener") or {} if master_facts.ok else {}
    resolved = {f.host.name: (f.facts.get("route") or {}).get("ip") for f in ctx.answered()}
    answers = [ip for ip in resolved.values() if ip]
    common = max(set(answers), key=answers.count) if answers else None
    given = {
        h.name: ctx.options.gloo_interface or ctx.options.nccl_interface or h.interface
        for h in ctx.cluster.hosts
    }
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.FAIL, "host did not answer")
            continue
        problems: list[str] = []
        route = f.facts.get("route") or {}
        iface = route.get("interface")
        if host == ctx.master and port and not listener.get("free", True):
            problems.append(f"master port {port} is in use: {_holders(listener)}")
            pids = [str(h["pid"]) for h in listener.get("holders") or []]
            fixes.append(
                (f"kill {' '.join(pids)} on {host.name}, or " if pids else "")
                + "pass --master-port 0 (a free port is picked)"
            )
        if route.get("error"):
            problems.append(route["error"])
        elif common is not None and route.get("ip") != common and not ctx.is_local:
            problems.append(
                f"{addr} resolves to {route.get('ip')} here but to {common} on other hosts"
            )
            fixes.append(f"fix /etc/hosts on {host.name} (or pass --master-addr as an IP)")
        connect = f.connect
        target_port = listener.get("port")
        if connect is None:
            if not route.get("error") and target_port:
                problems.append("connection to the master not tested (session stopped)")
        elif not connect.get("ok"):
            problems.append(f"cannot reach {addr}:{target_port}: {connect.get('error')}")
            shown = port or target_port
            fixes.append(
                f"open TCP port {shown} from {host.name} to {addr} (firewall / route), "
                f"check with `corral exec --hosts {host.name} -- nc -zv {addr} {shown}`"
            )
        want = given.get(host.name)
        if want and want not in (route.get("interfaces") or {}) and not ctx.is_local:
            have = ", ".join(sorted(route.get("interfaces") or {})) or "none"
            problems.append(f"interface {want} does not exist there (has {have})")
            fixes.append(f"fix the interface for {host.name} (it has {have})")
        if problems:
            hosts[host.name] = HostCheck(Status.FAIL, "; ".join(problems))
            continue
        via = f" via {iface}" if iface else ""
        ms = f" in {connect['ms']:.1f} ms" if connect and connect.get("ms") is not None else ""
        note = f" (given {want})" if want and want != iface else ""
        hosts[host.name] = HostCheck(Status.PASS, f"reaches {addr}:{target_port}{ms}{via}{note}")
    detected = interfaces(ctx)
    data = {
        "master": {"host": ctx.master.name, "addr": addr, "port": port},
        "listener": listener,
        "interfaces": detected,
        "resolved": resolved,
    }
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=_summary(addr, port, listener),
        fix_command="; ".join(dict.fromkeys(fixes)) or None,
        data=data,
    )


def _summary(addr: str, port: int, listener: dict[str, Any]) -> str:
    """The network line: the port the job will use and, when it differs, the one tested."""
    tested = listener.get("port")
    if not port:
        on = f"tested on free port {tested}; " if tested else ""
        return f"all hosts reach {addr} ({on}--master-port 0: the job's is picked at launch)"
    return f"all hosts reach {addr}:{port}" + (
        "" if listener.get("free", True) else f" (tested on port {tested})"
    )
