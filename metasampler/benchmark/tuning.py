"""Step-size tuning: the grid value with the lowest validation NLL, the grid extended beyond
an end while the best value sits there (so that the choice is interior, reported in the
results). A diverged run scores ``inf``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..targets import NonFiniteError

__all__ = ["TuneResult", "TuningError", "tune_step_size"]


class TuningError(RuntimeError):
    """Every value of a step-size grid diverged or gave a non-finite validation NLL."""


@dataclass
class TuneResult:
    """Outcome of :func:`tune_step_size`.

    Attributes:
        best: the chosen value (lowest score; the first evaluated of equal scores).
        scores: ``[(value, score)]`` in evaluation order (the grid, then each extension);
            ``inf`` marks a diverged run.
        errors: ``{value: message}`` for runs that raised :class:`NonFiniteError`.
        grid: the initial grid.
        extensions: the values added beyond an end of the grid, in the order they were tried.
        interior: whether ``best`` lies strictly inside the range of evaluated values (a
            smaller and a larger value both scored worse); ``None`` when nothing was tuned.
    """

    best: float
    scores: list[tuple[float, float]]
    errors: dict[float, str] = field(default_factory=dict)
    grid: list[float] = field(default_factory=list)
    extensions: list[float] = field(default_factory=list)
    interior: bool | None = None


def _next_beyond_edge(
    scores: Sequence[tuple[float, float]], edge_tolerance: float = 0.0, whole: bool = False
) -> float | None:
    """The value to try next when the best score sits at an end of the evaluated values.

    Above the largest value when that is the best; below the smallest when that is the best or
    when every run diverged (a diverged run counts as worst: smaller steps are the way out).
    With ``edge_tolerance > 0`` also beyond an end whose score is within that fraction of the
    best (a near-tie: one run per value is a noisy score, and a bump next to the best can hide
    a better value beyond it); of two such ends, the one scoring lower. The step beyond an end
    is the ratio of the two values nearest that end, so a geometric grid stays geometric;
    ``whole`` rounds it to a whole number (a grid of steps), at least one beyond the end (0,
    below a grid at 1, is not a step and ends the extension). ``None`` when nothing is to be
    extended.
    """
    values = sorted({v for v, _ in scores})
    if len(values) < 2:
        return None
    best_value, best_score = min(scores, key=lambda vs: vs[1])
    below, above = values[0] * values[0] / values[1], values[-1] * values[-1] / values[-2]
    if whole:
        below = float(min(round(below), values[0] - 1))
        above = float(max(round(above), values[-1] + 1))
    if not math.isfinite(best_score) or best_value == values[0]:
        return below
    if best_value == values[-1]:
        return above
    score_of = dict(scores)
    near = [
        (score_of[end], beyond)
        for end, beyond in ((values[0], below), (values[-1], above))
        if score_of[end] - best_score <= edge_tolerance * abs(best_score)
    ]
    return min(near)[1] if edge_tolerance > 0 and near else None


def tune_step_size(
    objective: Callable[[float], float],
    grid: Sequence[float],
    max_extensions: int = 0,
    edge_tolerance: float = 0.0,
    whole: bool = False,
) -> TuneResult:
    """Evaluate ``objective(value)`` (a validation NLL) for each grid value; keep the lowest.

    A run that raises :class:`~metasampler.NonFiniteError`, or returns a non-finite score,
    scores ``inf`` (worst). With a single grid value the objective is not called.

    With ``max_extensions > 0`` the grid is extended while the best value sits at one of its
    ends (or every value diverged): the next value beyond that end, at the ratio of the two
    values nearest it, is evaluated too, up to ``max_extensions`` extra values. A best value at
    an end of a short grid says only that the optimum may lie beyond it; the extension finds
    out, so that the choice is interior (``TuneResult.interior``) unless the cap is reached.
    ``edge_tolerance > 0`` extends also past an end that scores within that fraction of the
    best (a near-tie; see :func:`_next_beyond_edge`), within the same cap. ``whole`` keeps
    the extensions whole numbers (a grid of steps).

    Raises:
        ValueError: empty grid, negative ``max_extensions`` or ``edge_tolerance``.
        TuningError: every evaluated value scored ``inf``.
    """
    grid = [float(v) for v in grid]
    if not grid:
        raise ValueError("the step-size grid is empty")
    if max_extensions < 0:
        raise ValueError(f"max_extensions must be >= 0, got {max_extensions!r}")
    if not edge_tolerance >= 0:
        raise ValueError(f"edge_tolerance must be >= 0, got {edge_tolerance!r}")
    if len(grid) == 1:
        return TuneResult(grid[0], [(grid[0], float("nan"))], grid=grid)
    scores: list[tuple[float, float]] = []
    errors: dict[float, str] = {}

    def evaluate(value: float) -> None:
        try:
            score = float(objective(value))
        except NonFiniteError as err:
            score, errors[value] = math.inf, str(err)
        if not math.isfinite(score):
            score = math.inf
        scores.append((value, score))

    for value in grid:
        evaluate(value)
    extensions: list[float] = []
    while len(extensions) < max_extensions:
        value = _next_beyond_edge(scores, edge_tolerance, whole)
        if value is None or not (value > 0 and math.isfinite(value)):
            break
        extensions.append(value)
        evaluate(value)
    best_value, best_score = min(scores, key=lambda vs: vs[1])  # min keeps the first of ties
    if not math.isfinite(best_score):
        raise TuningError(
            f"every step size in {sorted(v for v, _ in scores)} diverged or gave a non-finite "
            "validation NLL; lower the grid"
        )
    values = [v for v, _ in scores]
    interior = min(values) < best_value < max(values)
    return TuneResult(best_value, scores, errors, grid, extensions, interior)
