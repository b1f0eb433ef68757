"""The pages' scripts take the state vocabulary from corral.states (served in every
page's ``<body data-states>``): no script under web/static spells a job or node state
itself, and what is served is the vocabulary, with a badge symbol for every state."""

from __future__ import annotations

import json
import re
from pathlib import Path

from corral.states import TERMINAL_STATES, JobState, NodeState
from corral.web.pages import STATES_JSON

STATIC = Path(__file__).parents[2] / "src" / "corral" / "web" / "static"
NAMES = sorted({s.value for s in JobState} | {s.value for s in NodeState})


def state_literals(text: str) -> list[str]:
    """Each state name written as a string literal, or as an object key with a string
    value (a symbol table keyed by state), with its line number."""
    names = "|".join(NAMES)
    quoted = re.compile(rf"""(["'`])({names})\1""")
    keyed = re.compile(rf"""\b({names})\s*:\s*["'`]""")
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("//", 1)[0]
        found += [f"{number}: {m.group(2)}" for m in quoted.finditer(code)]
        found += [f"{number}: {m.group(1)}" for m in keyed.finditer(code)]
    return found


def test_no_script_spells_a_state() -> None:
    hits = {
        path.name: state_literals(path.read_text(encoding="utf-8"))
        for path in sorted(STATIC.glob("*.js"))
    }
    assert {name: found for name, found in hits.items() if found} == {}


def test_the_check_sees_state_literals() -> None:
    sample = 'const A = new Set(["succeeded", \'lost\']);\nconst B = { timed_out: "x" };\n'
    assert state_literals(sample) == ["1: succeeded", "1: lost", "2: timed_out"]
    assert state_literals("job.stopping = false; // 'failed' in a comment\n") == []


def test_the_served_vocabulary_is_corral_states() -> None:
    served = json.loads(STATES_JSON)
    assert served["job"] == {s.name: s.value for s in JobState}
    assert served["node"] == {s.name: s.value for s in NodeState}
    assert set(served["final"]) == {s.value for s in TERMINAL_STATES}
    assert set(served["nodeFinal"]) == {s.value for s in NodeState if s.terminal}
    assert set(served["symbols"]) == set(NAMES)  # every state has its badge symbol
