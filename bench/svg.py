"""Minimal SVG line charts for the evaluation and soak reports.

Owns markup only: a framed chart, polylines and labels, written to a file. Never computes a figure and never scales
data; callers map their values to pixel coordinates.
"""
from __future__ import annotations

from pathlib import Path


def frame(width: int, height: int, title: str, left: float, top: float, right: float, bottom: float) -> list[str]:
    """The document's opening: white background, a centred title and the two axes meeting at (left, bottom)."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
            f'font-size="11">', f'<rect width="{width}" height="{height}" fill="white"/>',
            label(width / 2, 18, title, anchor="middle"),
            f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="black"/>']


def polyline(points: str, color: str, width: float = 1.5, dash: bool = False) -> str:
    """`points` is "x,y x,y ..." in pixels."""
    style = ' stroke-dasharray="5"' if dash else ""
    return f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{style} points="{points}"/>'


def label(x: float, y: float, text: str, color: str = "black", anchor: str = "start") -> str:
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<text x="{x:.1f}" y="{y:.1f}" fill="{color}" text-anchor="{anchor}">{text}</text>'


def save(parts: list[str], path) -> str:
    Path(path).write_text("\n".join([*parts, "</svg>"]))
    return str(path)
