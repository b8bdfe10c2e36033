"""Numbers in the words of a finding: ``fmt.n(3200)`` -> '3,200', ``fmt.pct(61.3)`` -> '61 %'.

One style for every rule, so that findings read alike: thousands separators, two significant
decimals at most, a space before units (the issue's style: ``61 %``, ``2.5 s``, ``1.2 MB``).
"""

from __future__ import annotations

from collections.abc import Iterable


def n(value: float) -> str:
    """3200 -> '3,200'; 2.5 -> '2.5'; 0.123 -> '0.12'."""
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:,.2f}".rstrip("0").rstrip(".") if value else "0"


def pct(value: float) -> str:
    """61.3 -> '61 %'; 4.25 -> '4.2 %' (the issue's style: a space before %)."""
    return f"{value:.0f} %" if abs(value) >= 10 else f"{value:.1f} %"


def secs(value: float) -> str:
    """0.5 -> '0.50 s'; 12.34 -> '12.3 s'."""
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def size(value: float) -> str:
    """A byte count: 512 -> '512 B'; 1536 -> '1.5 kB' (powers of 1024)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"  # unreachable


def join(parts: Iterable[str]) -> str:
    """Evidence parts joined by '; ', the empty ones left out."""
    return "; ".join(p for p in parts if p)
