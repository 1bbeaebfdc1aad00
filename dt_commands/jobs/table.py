"""The columns ``dt-jobs list`` and ``metrics`` print."""

from __future__ import annotations


def table(rows: list[tuple[str, ...]], right: set[int]) -> str:
    """``rows`` as aligned columns, those in ``right`` right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
