"""The link matrix for people: a host x host grid of cells with a level each
(``good``, ``fair``, ``slow``, ``error``, ``self``), drawn as a rich table here
and as the web machines page's heatmap (the API sends :func:`grid`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from corral.diagnose.links import LinkMatrix, LinkScore, fmt_gbs

__all__ = ["Cell", "grid", "grid_json", "heatmap", "level"]

#: At or above this fraction of the reference a link is ``good`` (else ``fair``
#: down to the threshold, ``slow`` below it).
GOOD_RATIO = 0.7
STYLE = {
    "good": "green",
    "fair": "yellow",
    "slow": "bold red",
    "error": "bold red",
    "self": "dim",
}


@dataclass(frozen=True)
class Cell:
    """One cell: the bandwidth from the row's host to the column's, and its level."""

    src: str
    dst: str
    gbs: float | None
    level: str
    text: str


def level(gbs: float | None, reference: float | None, threshold: float) -> str:
    """``good`` / ``fair`` / ``slow`` / ``error`` for a measured bandwidth."""
    if gbs is None:
        return "error"
    if gbs < threshold:
        return "slow"
    if reference and gbs < GOOD_RATIO * reference:
        return "fair"
    return "good"


def grid(matrix: LinkMatrix, result: LinkScore) -> list[list[Cell]]:
    """Rows by sender, columns by receiver, in ``matrix.hosts`` order."""
    rows: list[list[Cell]] = []
    for src in matrix.hosts:
        row = []
        for dst in matrix.hosts:
            if src == dst:
                row.append(Cell(src, dst, None, "self", "—"))
                continue
            pair = matrix.pair(src, dst)
            if pair is None or pair.error is not None:
                row.append(Cell(src, dst, None, "error", "failed"))
                continue
            gbs = pair.ab_gbs if pair.a == src else pair.ba_gbs
            lvl = level(gbs, result.reference_gbs, result.threshold_gbs)
            row.append(Cell(src, dst, gbs, lvl, fmt_gbs(gbs)))
        rows.append(row)
    return rows


def grid_json(matrix: LinkMatrix, result: LinkScore) -> list[list[dict[str, Any]]]:
    """:func:`grid` as JSON (``from``, ``to``, ``gbs``, ``level``, ``text``)."""
    return [
        [{"from": c.src, "to": c.dst, "gbs": c.gbs, "level": c.level, "text": c.text} for c in row]
        for row in grid(matrix, result)
    ]


def heatmap(matrix: LinkMatrix, result: LinkScore) -> Table:
    """The grid as a rich table (rows send, columns receive), culprits marked."""
    table = Table(
        title="Link bandwidth (row → column)",
        caption=_caption(matrix, result),
        show_lines=False,
    )
    table.add_column("from \\ to", style="bold")
    for host in matrix.hosts:
        table.add_column(host, justify="right")
    for host, row in zip(matrix.hosts, grid(matrix, result), strict=True):
        name = Text(host, style="bold red" if host in result.culprits else "bold")
        if host in result.culprits:
            name.append(" ✗")
        table.add_row(name, *(Text(c.text, style=STYLE[c.level]) for c in row))
    return table


def _caption(matrix: LinkMatrix, result: LinkScore) -> str:
    parts = [f"reference {fmt_gbs(result.reference_gbs)}"]
    parts.append(f"slow below {fmt_gbs(result.threshold_gbs)}")
    if matrix.ring is not None and matrix.ring.busbw_gbs is not None:
        parts.append(f"ring {fmt_gbs(matrix.ring.busbw_gbs)}")
    if matrix.allreduce and matrix.allreduce.get("busbw_gbs") is not None:
        ar = matrix.allreduce
        parts.append(f"{ar.get('backend', 'all-reduce')} busbw {fmt_gbs(ar['busbw_gbs'])}")
    return "; ".join(parts)
