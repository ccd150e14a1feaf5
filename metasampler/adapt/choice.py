"""How a round chooses among its groups: the best that held, ties within noise, the kinetic
rule for hot momenta, the friction's rules, and whether an end of the round calls for a move."""

from __future__ import annotations

import math

from .criteria import jackknife_se
from .groups import Group

#: After the bracket, a trial group of a sampler whose momenta measure their temperature is
#: chosen only where their mean kinetic temperature is at most this further from 1 than the
#: closest group's of its round (the benchmark's tolerance for "samples at the posterior's
#: temperature"): a step that will not hold over the kept run shows first in the momenta, far
#: hotter than ``T`` in a few coordinates, well before the positions or the criterion show it.
KINETIC_TOLERANCE = 0.1


def eligible(groups: list[Group]) -> list[Group]:
    """The groups a round may choose: those that held (no divergence, a finite score) and,
    where the momenta measure their temperature (after the bracket, whose groups still
    carry the start's transient), whose momenta's kinetic temperature is at most
    :data:`KINETIC_TOLERANCE` further from 1 than the closest group's."""
    held = [g for g in groups if g.error is None and math.isfinite(g.score)]
    judged = [g for g in held if g.kinetic is not None and not g.in_bracket]
    if not judged:
        return held
    limit = min(abs(g.kinetic - 1.0) for g in judged) + KINETIC_TOLERANCE
    return [g for g in held if g not in judged or abs(g.kinetic - 1.0) <= limit]


def best_group(groups: list[Group]) -> Group | None:
    candidates = eligible(groups)
    return min(candidates, key=lambda g: g.score) if candidates else None


def choose(groups: list[Group], attr: str, reach: int | None = None) -> tuple[float, bool] | None:
    """A round's choice of ``attr`` (``"eta"`` or ``"friction"``): the geometric mean over
    the best group and its neighbours (in ``attr``; at most ``reach`` on each side) whose
    score is within noise of the best (the difference at most ``sqrt(2)`` of its jackknife
    standard error: the groups ran the same chains with the same random numbers, so the
    difference is measured better than either score), so that a choice between groups the
    criterion cannot tell apart does not drift with its noise; and whether the best group
    sits at an end of the round's values. ``None`` when every group diverged."""
    best = best_group(groups)
    if best is None:
        return None
    ordered = sorted(groups, key=lambda g: getattr(g, attr))
    i = ordered.index(best)
    candidates = eligible(groups)

    def tied(g: Group) -> bool:
        if g not in candidates:
            return False
        paired = [a - b for a, b in zip(g.leave_out, best.leave_out, strict=False)]
        return g.score - best.score <= math.sqrt(2.0) * jackknife_se(paired)

    reach = len(ordered) if reach is None else reach
    low = i
    while low > max(0, i - reach) and tied(ordered[low - 1]):
        low -= 1
    high = i
    while high < min(len(ordered) - 1, i + reach) and tied(ordered[high + 1]):
        high += 1
    values = [math.log(getattr(g, attr)) for g in ordered[low : high + 1]]
    return math.exp(sum(values) / len(values)), i in (0, len(ordered) - 1)


def clearly_worse_than_best(group: Group | None, groups: list[Group]) -> bool:
    """Whether ``group`` diverged or scored worse than the round's best by more than two
    standard errors of the paired difference."""
    best = best_group(groups)
    if group is None or best is None or group.error is not None:
        return True
    if not math.isfinite(group.score):
        return True
    paired = [a - b for a, b in zip(group.leave_out, best.leave_out, strict=False)]
    return group.score - best.score > 2.0 * jackknife_se(paired)


def _hotter(group: Group | None, than: Group | None) -> bool:
    """Whether ``group``'s momenta run hotter than ``than``'s (``False`` where neither
    measures its heat). A trial sees at once the mixing a lower friction buys, but the heat
    it brings reaches the positions' slow directions only over the kept run; the momenta
    show it at once, so a lower friction is taken only where its momenta run no hotter."""
    if group is None or than is None or not group.heat_leave_out or not than.heat_leave_out:
        return False
    return group.heat > than.heat


def end_direction(groups: list[Group], attr: str, chosen: float, reference: float) -> int:
    """``+1`` (``-1``) where the round chose, alone (no neighbour tied with it), its largest
    (smallest) ``attr`` and it lies above (below) ``reference``: the optimum may lie further
    out; else ``0``."""
    best = best_group(groups)
    if best is None or chosen == reference:
        return 0
    value = getattr(best, attr)
    if not math.isclose(value, chosen, rel_tol=1e-9):
        return 0  # the choice averages tied groups, or is not the best's
    if value not in (min(getattr(g, attr) for g in groups), max(getattr(g, attr) for g in groups)):
        return 0
    return 1 if chosen > reference else -1


def outward_factors(direction: int, factor: float) -> tuple[float, float, float]:
    """A round's factors from an end outward: the end and two steps beyond it."""
    return tuple(factor ** (direction * j) for j in range(3))


def chosen_friction(groups: list[Group], friction: float) -> float:
    """A friction round's choice: ``friction`` stays unless its group is clearly worse than
    the round's best (:func:`clearly_worse_than_best`) or fails the kinetic rule
    (:func:`eligible`), and a lower one must not bring more heat (:func:`_hotter`)."""
    kept = next((g for g in groups if g.friction == friction), None)
    chosen = choose(groups, "friction")
    if chosen is None:
        return friction
    if kept in eligible(groups) and not clearly_worse_than_best(kept, groups):
        return friction
    if chosen[0] < friction and _hotter(best_group(groups), kept):
        return friction
    return chosen[0]
