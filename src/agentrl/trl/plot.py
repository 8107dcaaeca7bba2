"""The learning curve as a PNG, drawn with Pillow (no plotting library needed)."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

__all__ = ["plot_curve"]

_W, _H, _PAD = 720, 420, 56


def plot_curve(
    path: str | pathlib.Path,
    success: Sequence[float],
    *,
    target: float | None = None,
    title: str = "exact success per GRPO step",
) -> pathlib.Path:
    """Draw success (0..1) per step, with the target as a dashed line; returns the path."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (_W, _H), "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = _PAD, _PAD // 2 + 14, _W - _PAD // 2, _H - _PAD
    draw.text((left, 8), title, fill="black")
    draw.rectangle((left, top, right, bottom), outline="black")
    steps = max(len(success), 2)

    def xy(i: float, v: float) -> tuple[float, float]:
        return (
            left + (right - left) * i / (steps - 1),
            bottom - (bottom - top) * max(0.0, min(1.0, v)),
        )

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = xy(0, tick)[1]
        draw.line((left - 4, y, left, y), fill="black")
        draw.text((8, y - 6), f"{tick:.0%}", fill="black")
    for i in range(steps):
        x = xy(i, 0)[0]
        draw.line((x, bottom, x, bottom + 4), fill="black")
        if steps <= 20 or i % max(1, steps // 10) == 0:
            draw.text((x - 4, bottom + 8), str(i + 1), fill="black")
    draw.text(((left + right) // 2 - 12, _H - 20), "step", fill="black")
    if target is not None:
        y = xy(0, target)[1]
        for x in range(left, right, 12):
            draw.line((x, y, min(x + 6, right), y), fill=(200, 0, 0))
        # At the left, where a learning curve is still low: it does not cover the curve.
        draw.text((left + 8, y - 14), f"goal {target:.0%}", fill=(200, 0, 0))
    points = [xy(i, v) for i, v in enumerate(success)]
    if len(points) > 1:
        draw.line(points, fill=(0, 90, 200), width=3)
    for x, y in points:
        draw.ellipse((x - 4, y - 4, x + 4, y + 4), fill=(0, 90, 200))
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)
    return out
