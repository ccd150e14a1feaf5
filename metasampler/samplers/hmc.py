"""HMC — Hamiltonian Monte Carlo with a Metropolis correction (Neal 2011), a reference sampler.

Hamiltonian ``H(theta, p) = U(theta) / T + p M^{-1} p / (2 T)``, diagonal mass ``M``. Each
trajectory draws ``p ~ N(0, T M)``, takes ``L`` leapfrog steps::

    p     <- p - (eta / 2) grad U(theta)
    theta <- theta + eta M^{-1} p
    p     <- p - (eta / 2) grad U(theta)

and keeps its end with probability ``min(1, exp(H_start - H_end))``, else returns to its start.
The leapfrog map is reversible and volume-preserving, so the chain leaves ``exp(-U / T)``
exactly invariant whatever ``eta``: unlike every SG-MCMC sampler, HMC has no discretisation
bias, which makes it the reference against which their stationary distributions are checked.
The price is exact energies and gradients: the target must be evaluated on all its data
(a :class:`~metasampler.BayesianModel` with ``batch_size = N``).

One leapfrog step is one sampler step (one target evaluation, as every sampler here), so a
trajectory spans ``L`` steps and only its ends are samples (:meth:`HMC.collects`). During the
first ``adapt_trajectories`` trajectories each chain's step is scaled towards an acceptance
probability of ``target_accept`` (a Robbins-Monro update of its log; per chain, so that a
chain in a stiffer region than the others is not left rejecting every proposal); discard those
as burn-in. The chains are independent, so each may keep its own fixed step afterwards. Each
trajectory's step is jittered by a uniform factor in ``1 +- jitter`` to avoid periodic
trajectories.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from ..integrators import gaussian_like
from ..targets import Target
from .base import Sampler, SamplerState

__all__ = ["HMC"]


class HMC(Sampler):
    """Metropolis-corrected HMC with ``n_leapfrog`` leapfrog steps per trajectory.

    Args:
        eta / lr: the leapfrog step (see :class:`~metasampler.samplers.base.Sampler`).
        n_leapfrog: leapfrog steps per trajectory, ``L >= 1``.
        inverse_mass: ``M^{-1}``, a positive number or a ``(D,)`` tensor (e.g. the posterior's
            variance per coordinate, as estimated by earlier chains).
        adapt_trajectories: trajectories during which the step adapts (0: fixed step).
        target_accept: the acceptance probability each chain's adaptation aims at.
        jitter: each trajectory's step is ``eta * u``, ``u ~ U(1 - jitter, 1 + jitter)``.
        temperature: ``T > 0`` in ``exp(-U / T)``.

    The state's ``extras`` hold ``accepted`` (per chain, trajectories accepted after the
    adaptation), ``trajectories`` (their number) and ``step_scale`` (``(K, 1)``, each chain's
    adapted factor on ``eta``).

    Raises:
        ValueError: at ``init``, for a target that evaluates a minibatch or adds noise to its
            gradient (the Metropolis test needs exact energies).
    """

    order = "second"

    def __init__(
        self,
        *,
        eta: float | None = None,
        lr: float | None = None,
        n_leapfrog: int = 10,
        inverse_mass: float | Tensor = 1.0,
        adapt_trajectories: int = 0,
        target_accept: float = 0.7,
        jitter: float = 0.1,
        temperature: float = 1.0,
    ) -> None:
        super().__init__(eta=eta, lr=lr, temperature=temperature)
        if isinstance(n_leapfrog, bool) or int(n_leapfrog) != n_leapfrog or n_leapfrog < 1:
            raise ValueError(f"n_leapfrog must be an integer >= 1, got {n_leapfrog!r}")
        if not self.temperature > 0:
            raise ValueError("HMC needs a temperature > 0")
        if int(adapt_trajectories) != adapt_trajectories or adapt_trajectories < 0:
            raise ValueError(
                f"adapt_trajectories must be an integer >= 0, got {adapt_trajectories!r}"
            )
        if not 0 < target_accept < 1:
            raise ValueError(f"target_accept must be in (0, 1), got {target_accept!r}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
        inverse_mass = torch.as_tensor(inverse_mass, dtype=torch.float64)
        if inverse_mass.ndim > 1:
            raise ValueError(f"inverse_mass must be a number or a (D,) tensor, got shape "
                             f"{tuple(inverse_mass.shape)}")  # fmt: skip
        if not (torch.isfinite(inverse_mass).all() and (inverse_mass > 0).all()):
            raise ValueError("inverse_mass must be finite and > 0 in every coordinate")
        self.n_leapfrog = int(n_leapfrog)
        self.inverse_mass = inverse_mass
        self.adapt_trajectories = int(adapt_trajectories)
        self.target_accept = float(target_accept)
        self.jitter = float(jitter)

    def acceptance_rate(self, state: SamplerState) -> Tensor:
        """Per chain, the fraction of trajectories accepted since the adaptation ended."""
        after = float(state.extras["trajectories"]) - self.adapt_trajectories
        return state.extras["accepted"] / max(after, 1.0)

    def collects(self, k: int) -> bool:
        """Only a trajectory's end (step ``k`` a multiple of ``L``) is a sample."""
        return k % self.n_leapfrog == 0

    def _init_extras(
        self, state: SamplerState, target: Target, generator: torch.Generator | None
    ) -> SamplerState:
        _check_exact(target)
        theta = state.theta
        if self.inverse_mass.ndim == 1 and self.inverse_mass.shape[0] != theta.shape[1]:
            raise ValueError(
                f"inverse_mass has {self.inverse_mass.shape[0]} coordinates, theta {theta.shape[1]}"
            )
        ev = self.evaluate(target, theta, 0, generator)
        zeros = theta.new_zeros(theta.shape[0])
        state.energy, state.grad = ev.energy.detach(), ev.grad.detach()
        state.momentum = torch.zeros_like(theta)
        state.extras = {
            "inverse_mass": self.inverse_mass.to(theta),
            "step_scale": theta.new_ones(theta.shape[0], 1),
            "accepted": zeros,
            "trajectories": theta.new_zeros(()),
        }
        return state

    def _step(self, state, target, eta, temperature, generator):
        if state.step % self.n_leapfrog == 0:
            state = self._start_trajectory(state, eta, temperature, generator)
        extras = dict(state.extras)
        momentum = state.momentum - 0.5 * extras["trajectory_eta"] * state.grad
        theta = state.theta + extras["trajectory_eta"] * extras["inverse_mass"] * momentum
        ev = target.evaluate(theta, generator)
        energy, grad = ev.energy.detach(), ev.grad.detach()
        # A diverging chain goes back to its start and is rejected at the trajectory's end.
        finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1)
        extras["diverged"] = extras["diverged"] | ~finite
        ok = finite.unsqueeze(-1)
        theta = torch.where(ok, theta, extras["start_theta"])
        grad = torch.where(ok, grad, extras["start_grad"])
        energy = torch.where(finite, energy, extras["start_energy"])
        momentum = torch.where(ok, momentum - 0.5 * extras["trajectory_eta"] * grad, 0.0)
        new = SamplerState(theta, momentum, extras, state.step, state.eta, energy, grad)
        if (state.step + 1) % self.n_leapfrog == 0:
            new = self._end_trajectory(new, temperature, generator)
        return new

    def _start_trajectory(self, state, eta, temperature, generator):
        """Fresh momenta ``N(0, T M)``, the start's Hamiltonian and this trajectory's step."""
        extras = dict(state.extras)
        inverse_mass = extras["inverse_mass"]
        momentum = (
            gaussian_like(state.theta, generator, math.sqrt(temperature)) / inverse_mass.sqrt()
        )
        u = torch.rand(
            (state.theta.shape[0], 1), generator=generator, dtype=state.theta.dtype,
            device=state.theta.device,
        )  # fmt: skip
        extras.update(
            start_theta=state.theta, start_energy=state.energy, start_grad=state.grad,
            start_hamiltonian=_hamiltonian(state.energy, momentum, inverse_mass, temperature),
            trajectory_eta=eta * extras["step_scale"] * (1.0 + self.jitter * (2.0 * u - 1.0)),
            diverged=torch.zeros_like(state.energy, dtype=torch.bool),
        )  # fmt: skip
        return replace(state, momentum=momentum, extras=extras)

    def _end_trajectory(self, state, temperature, generator):
        """The Metropolis test; rejected (or diverged) chains return to the trajectory's start."""
        extras = state.extras
        end = _hamiltonian(state.energy, state.momentum, extras["inverse_mass"], temperature)
        log_ratio = (extras["start_hamiltonian"] - end).nan_to_num(nan=-math.inf)
        log_ratio = torch.where(extras["diverged"], -math.inf, log_ratio)
        accept, accept_prob = self._metropolis(log_ratio, generator)
        keep = accept.unsqueeze(-1)
        theta = torch.where(keep, state.theta, extras["start_theta"])
        grad = torch.where(keep, state.grad, extras["start_grad"])
        energy = torch.where(accept, state.energy, extras["start_energy"])
        trajectories = extras["trajectories"] + 1
        extras = {k: extras[k] for k in ("inverse_mass", "step_scale", "accepted")}
        if trajectories <= self.adapt_trajectories:
            # Robbins-Monro on each chain's log(step scale) towards the target acceptance.
            gain = 1.0 / math.sqrt(float(trajectories) + 3.0)
            change = gain * (accept_prob - self.target_accept)
            extras["step_scale"] = extras["step_scale"] * change.exp().unsqueeze(-1)
        else:
            extras["accepted"] = extras["accepted"] + accept.to(energy.dtype)
        extras["trajectories"] = trajectories
        return SamplerState(theta, torch.zeros_like(theta), extras, state.step, state.eta, energy,
                            grad)  # fmt: skip

    def _metropolis(self, log_ratio: Tensor, generator: torch.Generator | None):
        """Per chain, whether the proposal is kept, and its acceptance probability."""
        accept_prob = log_ratio.clamp(max=0.0).exp()
        draw = torch.rand(accept_prob.shape, generator=generator, dtype=accept_prob.dtype,
                          device=accept_prob.device)  # fmt: skip
        return draw < accept_prob, accept_prob


def _hamiltonian(energy: Tensor, momentum: Tensor, inverse_mass: Tensor, temperature: float):
    """``U / T + p M^{-1} p / (2 T)`` per chain."""
    return (energy + 0.5 * (momentum.square() * inverse_mass).sum(-1)) / temperature


def _check_exact(target: Target) -> None:
    """The Metropolis test is only exact with the full data and noise-free gradients."""
    batch, n_data = getattr(target, "batch_size", None), getattr(target, "n_data", None)
    if batch is not None and n_data is not None and batch < n_data:
        raise ValueError(
            f"HMC needs exact energies: the target evaluates minibatches of {batch} of its "
            f"{n_data} examples; build it with batch_size={n_data}"
        )
    if getattr(target, "grad_noise_std", 0.0) > 0:
        raise ValueError("HMC needs exact gradients: the target adds noise (grad_noise_std > 0)")
