"""Formatting shared by the report's sections (bench/report.py, bench/report_gateway.py)."""

from __future__ import annotations

import math
import re
from typing import Any


def num(value: Any, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def shares_text(share: dict[str, float], floor: float = 0.0, top: int | None = None) -> str:
    """Process kinds by their share of the machine, largest first: "webhook 22%, worker 14%"."""
    ranked = [(kind, value) for kind, value in sorted(share.items(), key=lambda item: -item[1]) if value >= floor]
    return ", ".join(f"{kind} {value:.0%}" for kind, value in ranked[:top])


def spread(s: dict[str, Any] | None, digits: int = 0, unit: str = "") -> str:
    """A repeated figure: its median, with (min–max) when the runs differ."""
    if not s:
        return "–"
    if s["min"] == s["max"] or len(s.get("runs") or [None, None]) <= 1:
        return num(s["median"], digits, unit)
    return f"{num(s['median'], digits, unit)} ({num(s['min'], digits)}–{num(s['max'], digits)})"


def status(met: bool | None, measurable: bool = True) -> str:
    if not measurable:
        return "not yet measurable"
    return "**met**" if met else "**not met**"


def _anchor(title: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def per_unit_table(caption: str, rows: dict[str, dict[str, float]]) -> list[str]:
    if not rows:
        return []
    kinds = sorted({k for row in rows.values() for k in row if k != "machine"}) + ["machine"]
    out = [caption, "", "| | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    out += [f"| {name} | " + " | ".join(num(row.get(k), 2) for k in kinds) + " |" for name, row in rows.items()]
    return out + [""]
