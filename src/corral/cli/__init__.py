"""The verbs of ``corral``: which module holds each, and its one-line summary.

Each verb module exposes ``register(app)``, adding its command(s) or group to the
root app. The root (:mod:`corral.cli.main`) imports a verb's module only when
that verb runs (or shows its own help), so ``corral --version`` and ``corral
--help`` import none of them: the root's help lists the verbs with the summaries
below, which a test keeps equal to the first paragraph of each verb's own help.

To add a verb or a verb group: write ``corral/cli/<module>.py`` with
``register(app)`` and add one line to :data:`VERBS` (in the order the root's help
lists it).
"""

from __future__ import annotations


class Verb:
    """Where a verb lives and how the root's help describes it (not a ``NamedTuple``:
    the entry point, :mod:`corral.cli.entry`, runs before ``typing`` is imported)."""

    __slots__ = ("module", "summary")

    def __init__(self, module: str, summary: str) -> None:
        self.module = module
        """Its module under ``corral.cli`` (one module may add several verbs)."""
        self.summary = summary
        """The first paragraph of its help."""


VERBS: dict[str, Verb] = {
    "run": Verb(
        "run", "Launch SCRIPT on every node and supervise it; the exit code is the job's result."
    ),
    "plan": Verb(
        "run",
        "Print the exact per-node command and environment `corral run` would use (dry run).",
    ),
    "check": Verb(
        "check",
        "Run the pre-flight checklist on every host: connectivity, hardware, software "
        "versions, code consistency, network (master port, reachability, interfaces), "
        "checkpoint dir, clock skew, stale processes, a collective smoke test, sync status; "
        "with --shared-data-path, that the path is one filesystem on every host.",
    ),
    "exec": Verb("exec", "Run a shell command on every node in parallel, output prefixed [host]."),
    "sync": Verb("sync", "Push the code tree SRC to every host in parallel (rsync over SSH)."),
    "logs": Verb(
        "logs",
        "Print a job's logs, each line prefixed [host:rank]. A marker line opens each attempt.",
    ),
    "ping": Verb(
        "ping", "List the hosts that do not answer (echo over SSH, with a deadline per host)."
    ),
    "calibrate": Verb(
        "calibrate",
        "Measure every rank's throughput (examples/s) at once and the split it calls for.",
    ),
    "serve": Verb(
        "serve", "Serve the REST API: machines, planning, dispatch, status, logs, queue."
    ),
    "job": Verb("job", "Submit, watch and stop jobs on a corral server (corral serve)."),
    "machine": Verb(
        "machine",
        "Register, list, check and remove the machines of a corral server (corral serve).",
    ),
    "notify": Verb(
        "notify",
        "Webhooks and chat/mail notifications of a corral server's job events (corral serve).",
    ),
    "testbed": Verb(
        "testbed",
        "Simulated N-host cluster on this machine: network namespaces with their own sshd "
        "(Linux, root).",
    ),
    "k8s": Verb(
        "k8s",
        "Run the job on Kubernetes: an Indexed Job (one pod per node) and a headless "
        "Service for the pods' stable names.",
    ),
    "slurm": Verb("slurm", "Run the job on a Slurm cluster: render or submit an sbatch script."),
}

_VERB_MODULES: tuple[str, ...] = tuple(dict.fromkeys(v.module for v in VERBS.values()))
"""Every verb module, each once, in the order of :data:`VERBS`."""
