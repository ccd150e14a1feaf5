"""Step-size (and friction) adaptation during the burn-in: ``ms.sample(..., adapt=True)``.

The step passed to a sampler's constructor is only where the search starts. During the
burn-in, rounds of trial groups run side by side, each group a copy of the same trial chains
with the same random numbers at a different step; a criterion ranks them and the search
narrows on a log grid: a bracket 256x either side of the start, a step round, a friction
round (momentum samplers), a last step round, rounds that move on past an end that is
clearly best, then a settle phase at the chosen kernel. The kept samples are drawn with that
fixed kernel. The criteria: the Stein estimate of the KL of the chains' Gaussian fit
(:func:`stein_kl`, from the chains alone; after Coullon, South & Nemeth 2021 and Gorham &
Mackey 2015) or, with ``Adapt(validation=(x, y))``, the held-out predictive NLL. The rounds
cost at most ``Adapt.extra_cost`` of a plain run's chain-steps beyond it.

The rounds, the criteria's equations and the reasoning behind each rule are written out in
``docs/METHOD.md`` §7. The modules:

* :mod:`~metasampler.adapt.config`: :class:`Adapt`, :class:`AdaptResult`, :class:`Trial`;
* :mod:`~metasampler.adapt.criteria`: the statistics that score a group;
* :mod:`~metasampler.adapt.chains`: taking, assembling and recording chains;
* :mod:`~metasampler.adapt.groups`, :mod:`~metasampler.adapt.choice`: a trial group and how a
  round chooses among its groups;
* :mod:`~metasampler.adapt.rounds`: running one round;
* :mod:`~metasampler.adapt.burn_in`: the sequence of rounds within the budget
  (:func:`adapt_burn_in`).
"""

from .burn_in import adapt_burn_in
from .choice import KINETIC_TOLERANCE
from .config import FRICTION_ATTRIBUTES, MIN_BURN_IN, Adapt, AdaptResult, Trial, check_adapt
from .criteria import FULL_STEIN_MAX_DIM, stein_kl

__all__ = [
    "Adapt",
    "AdaptResult",
    "Trial",
    "FRICTION_ATTRIBUTES",
    "FULL_STEIN_MAX_DIM",
    "KINETIC_TOLERANCE",
    "MIN_BURN_IN",
    "adapt_burn_in",
    "check_adapt",
    "stein_kl",
]
