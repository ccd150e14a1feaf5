"""What ``ms.sample(..., adapt=...)`` takes and reports: :class:`Adapt`, :class:`AdaptResult`
(one :class:`Trial` per group of each round), and the check of a request against the run."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Real

from torch import Tensor

from ..samplers.base import Sampler, SamplerState
from ..samplers.hmc import HMC
from ..targets import Target

#: Sampler attributes adapted as the friction, the first a sampler has as a number > 0
#: (SGHMC's ``friction`` ``C``, (m)SGNHT's ``diffusion`` ``A``, the value its thermostat
#: settles on without gradient noise).
FRICTION_ATTRIBUTES = ("friction", "diffusion")

#: The shortest burn-in ``adapt`` runs in (its bracket round is an eighth of it).
MIN_BURN_IN = 100


@dataclass(frozen=True)
class Adapt:
    """How :func:`metasampler.sample` adapts the step during the burn-in (``adapt=True`` is
    ``Adapt()``).

    Args:
        validation: held-out ``(x, y)`` of a :class:`~metasampler.BayesianModel`: rank steps
            by the negative log posterior-predictive probability of ``y`` (predictive NLL),
            which aims at prediction (networks). ``None``: rank them by the chains alone
            (the Stein estimate of the KL of the chains' Gaussian fit, :func:`stein_kl`;
            docs/METHOD.md §7), which aims at the posterior (a model whose parameters are
            read, such as a regression).
        friction: also choose the friction of samplers that have one (SGHMC's ``friction``,
            SGNHT's ``diffusion``): a round at the chosen step with 1/2, 1 and 2 times it, and
            rounds further out while an end of the last one is clearly best.
        span: the first round tries steps from ``start / span`` to ``start * span``
            (factor 4 apart; at least 16).
        max_validation: score on at most this many held-out examples (a fixed random subset).
        extra_cost: the trial rounds' work beyond a plain run, at most this fraction of a plain
            run's chain-steps (burn-in and kept steps): where the rounds' shares of the
            burn-in would cost more, the bracket runs fewer chains and the rounds are
            shortened (the settle phase takes the rest). A larger value buys longer trials
            (a less noisy choice) on short runs; a smaller one a cheaper, noisier choice.

    Raises:
        ValueError: a bad value (the message names it).
    """

    validation: tuple[Tensor, Tensor] | None = None
    friction: bool = True
    span: float = 256.0
    max_validation: int = 1000
    extra_cost: float = 0.6

    def __post_init__(self) -> None:
        if self.validation is not None:
            ok = (
                isinstance(self.validation, (tuple, list))
                and len(self.validation) == 2
                and all(isinstance(v, Tensor) for v in self.validation)
            )
            if not ok:
                raise ValueError("Adapt(validation=...) must be a pair (x, y) of tensors")
            x, y = self.validation
            if x.ndim == 0 or y.ndim == 0 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
                raise ValueError(
                    "Adapt(validation=(x, y)) needs x and y with the same first dimension > 0, "
                    f"got shapes {tuple(x.shape)} and {tuple(y.shape)}"
                )
        if not isinstance(self.friction, bool):
            raise ValueError(f"Adapt(friction=...) must be True or False, got {self.friction!r}")
        if isinstance(self.span, bool) or not isinstance(self.span, Real):
            raise ValueError(f"Adapt(span=...) must be a number >= 16, got {self.span!r}")
        if not (16 <= self.span < math.inf):
            raise ValueError(f"Adapt(span=...) must be a finite number >= 16, got {self.span!r}")
        if isinstance(self.max_validation, bool) or not isinstance(self.max_validation, int):
            raise ValueError(
                f"Adapt(max_validation=...) must be an integer >= 1, got {self.max_validation!r}"
            )
        if self.max_validation < 1:
            raise ValueError(
                f"Adapt(max_validation=...) must be an integer >= 1, got {self.max_validation!r}"
            )
        cost = self.extra_cost
        if isinstance(cost, bool) or not isinstance(cost, Real) or not 0 < cost < math.inf:
            raise ValueError(f"Adapt(extra_cost=...) must be a number > 0, got {cost!r}")

    @property
    def criterion(self) -> str:
        """``"validation"`` with held-out data, else ``"stein"``."""
        return "stein" if self.validation is None else "validation"


@dataclass(frozen=True)
class Trial:
    """One group of one round of the search.

    Attributes:
        round: 0-based round index.
        kind: ``"bracket"``, ``"step"`` or ``"friction"``.
        eta: the group's step.
        friction: the group's friction (``None`` for samplers without one).
        score: the criterion's value (lower is better); ``inf`` for a diverged group.
        se: its standard error (jackknife over blocks of chains; 0 with one chain).
        chains: the number of trial chains the group ran (every group of a round the same).
        error: why the group diverged (the :class:`~metasampler.NonFiniteError` message), or
            ``None``.
        heat: for a sampler whose momentum's stationary law is ``N(0, T I)``, the KL its
            momenta's heat brings (:class:`~metasampler.adapt.criteria.HeatStats`; 0 at the
            target), else ``None``.
        kinetic_temperature: for such a sampler, its momenta's mean square over ``T``, over
            every coordinate and trial chain of the round's window (1 at the target), else
            ``None``.
    """

    round: int
    kind: str
    eta: float
    friction: float | None
    score: float
    se: float
    chains: int
    error: str | None = None
    heat: float | None = None
    kinetic_temperature: float | None = None


@dataclass
class AdaptResult:
    """What the burn-in chose (``SampleResult.adapted``).

    Attributes:
        eta: the chosen step; every kept sample was drawn with it.
        friction: the chosen friction (``None`` when the sampler has none or it was not
            adapted).
        friction_name: the sampler attribute that holds it (``"friction"``, ``"diffusion"``).
        criterion: ``"stein"`` or ``"validation"`` (docs/METHOD.md §7).
        start_eta: the step the search started from (the sampler's).
        start_friction: the sampler's friction.
        trials: every group of every round, in order (see :class:`Trial`).
        sampler: a copy of the sampler with ``eta`` (and the friction) set to the choice:
            the kernel of the kept samples, to run more of them.
        state: the chains at the end of the burn-in, where the kept run started.
        generator_state: the generator's state at that point (``torch.Generator.set_state``).
        settle_steps: burn-in steps all chains ran at the chosen kernel before the first kept
            sample.
        schedule_scale: for a sampler with a schedule, its mean multiplier over the kept
            run's sampling steps: the search tried constant steps (``Trial.eta``) and ``eta``
            is the chosen one divided by it, so that the schedule's mean step is the chosen
            one (at most the largest step of the last round that scored as well as the
            best, over the schedule's peak multiplier); 1 for a constant step.
    """

    eta: float
    friction: float | None
    friction_name: str | None
    criterion: str
    start_eta: float
    start_friction: float | None
    trials: list[Trial]
    sampler: Sampler
    state: SamplerState
    generator_state: Tensor
    settle_steps: int
    schedule_scale: float = 1.0

    @property
    def friction_per_step(self) -> float | None:
        """``eta * friction``: the fraction of the momentum the friction removes per step."""
        return None if self.friction is None else self.eta * self.friction

    def round_scores(self, round: int) -> list[tuple[float, float | None, float]]:
        """``[(eta, friction, score)]`` of one round's groups."""
        return [(t.eta, t.friction, t.score) for t in self.trials if t.round == round]

    def __str__(self) -> str:
        lines = [
            f"adapted eta={self.eta:.4g}"
            + ("" if self.friction is None else f", {self.friction_name}={self.friction:.4g}")
            + f" (start eta={self.start_eta:.4g}; criterion {self.criterion})"
        ]
        for t in self.trials:
            friction = "" if t.friction is None else f" {self.friction_name}={t.friction:.4g}"
            status = f"score {t.score:.4g} +- {t.se:.2g}" if t.error is None else "diverged"
            lines.append(f"  round {t.round} {t.kind:8s} eta={t.eta:.4g}{friction}: {status}")
        return "\n".join(lines)


def check_adapt(
    adapt: object, sampler: Sampler, target: Target, burn_in: int, n_chains: int
) -> Adapt | None:
    """``adapt`` as an :class:`Adapt` (``None`` when off), checked against the run; its
    held-out data checked as the model's own data are (:meth:`BayesianModel.check_data`).

    Raises:
        ValueError: ``adapt`` is not a bool or an :class:`Adapt`; the burn-in is shorter than
            :data:`MIN_BURN_IN`; the sampler runs at temperature 0 or adapts its own step
            (HMC); the chains-alone criterion with one chain; held-out data for a target that
            cannot score it, or that the model could not have been given as data.
    """
    if adapt is False or adapt is None:
        return None
    if adapt is True:
        adapt = Adapt()
    if not isinstance(adapt, Adapt):
        raise ValueError(f"adapt must be True, False or a metasampler.Adapt, got {adapt!r}")
    if burn_in < MIN_BURN_IN:
        raise ValueError(
            f"adapt needs burn_in >= {MIN_BURN_IN} steps to try steps in (got {burn_in}); "
            "the search runs during the burn-in"
        )
    if getattr(sampler, "temperature", 1.0) <= 0:
        raise ValueError(
            f"adapt needs a sampler at temperature > 0; {type(sampler).__name__} runs at "
            f"temperature {sampler.temperature} (an optimiser, not a sampler)"
        )
    if isinstance(sampler, HMC):
        raise ValueError(
            "adapt is for SG-MCMC samplers; HMC adapts its own step towards its target_accept "
            "during its first adapt_trajectories trajectories (HMC(adapt_trajectories=N), 0 by "
            "default: a fixed step); discard them as burn-in"
        )
    if adapt.validation is None:
        if n_chains < 2:
            raise ValueError(
                "adapt=True ranks steps by the spread of several chains and needs n_chains >= 2 "
                "(got 1); run more chains, or rank by held-out data "
                "(adapt=metasampler.Adapt(validation=(x, y)))"
            )
        return adapt
    if not callable(getattr(target, "log_likelihood", None)):
        raise ValueError(
            "Adapt(validation=(x, y)) needs a target with log_likelihood(theta, x, y) (a "
            f"metasampler.BayesianModel), got {type(target).__name__}; use adapt=True to rank "
            "steps by the chains alone"
        )
    check_data = getattr(target, "check_data", None)
    if callable(check_data):  # as the model's own data: a mistake fails here, not mid-run
        adapt = replace(adapt, validation=check_data(*adapt.validation, name="Adapt(validation)"))
    return adapt
