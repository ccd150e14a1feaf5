"""Build sampling problems from a :class:`tasks.config.TaskConfig`.

A :class:`~tasks.problem.Problem` is what the meta-trainer and the evaluators need: a target, a
way to draw initial positions for ``K`` chains, and (for toy targets) the exact task for
KL/moments. Toy Gaussians are built here, Bayesian networks by :mod:`tasks.bnn`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .bnn import build_bnn_problem
from .config import TaskConfig, TaskKind
from .gaussian import GaussianTask, gaussian, paper_test_gaussian, paper_train_gaussian
from .problem import Problem

__all__ = ["Problem", "ProblemFamily", "build_problem", "check_train_activations"]


def _uniform_init(dim: int, low: float, high: float, dtype: torch.dtype, device):
    def init(n_chains: int, generator: torch.Generator) -> Tensor:
        u = torch.rand((n_chains, dim), generator=generator, dtype=dtype, device=device)
        return low + (high - low) * u

    return init


def _gaussian_task(cfg: TaskConfig, seed: int) -> GaussianTask:
    spectrum = {}
    if cfg.eig_range is not None:
        spectrum["eig_range"] = tuple(float(v) for v in cfg.eig_range)
    if cfg.eig_spacing is not None:
        spectrum["spacing"] = cfg.eig_spacing
    if cfg.kind == TaskKind.paper_train_gaussian:
        return paper_train_gaussian(seed=seed, **spectrum)
    if cfg.kind == TaskKind.paper_test_gaussian:
        return paper_test_gaussian(seed=seed)
    cov = cfg.cov if cfg.kind == TaskKind.gaussian else "correlated"
    if cov not in ("identity", "diagonal", "correlated"):
        raise ValueError(f"task.cov must be identity, diagonal or correlated, got {cov!r}")
    return gaussian(cfg.dim, mean=cfg.mean, cov=cov, seed=seed, **spectrum)


def build_problem(
    cfg: TaskConfig,
    seed: int | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Problem:
    """The problem described by ``cfg``; ``seed`` overrides ``cfg.seed`` (random families)."""
    seed = cfg.seed if seed is None else seed
    kind = TaskKind(cfg.kind)
    if kind in (
        TaskKind.gaussian,
        TaskKind.paper_train_gaussian,
        TaskKind.paper_test_gaussian,
        TaskKind.random_gaussians,
    ):
        task = _gaussian_task(cfg, seed)
        if cfg.energy_log_normaliser:
            task = task.with_normalised_energy()
        target = task.target(cfg.grad_noise_std, dtype=dtype, device=device)
        init = _uniform_init(task.dim, cfg.init_low, cfg.init_high, dtype, device)
        return Problem(target, init, task, f"{kind.value}(D={task.dim}, seed={seed})")
    return build_bnn_problem(cfg, seed=seed, device=device, dtype=dtype)


class ProblemFamily:
    """The training problems of a run: one fixed problem, a new random one per epoch
    (``random_gaussians``: a fresh seeded Gaussian drawn with the run's generator), or, with
    ``task.train_activations``, the same network with each listed hidden activation in turn
    (epoch ``e`` gets ``train_activations[e mod n]``; only the current one is held, so the data
    are in memory once, and a change of activation rebuilds the problem, deterministically)."""

    def __init__(
        self,
        cfg: TaskConfig,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        self.random = TaskKind(cfg.kind) == TaskKind.random_gaussians
        self._cycle = _activation_variants(cfg)
        self._held: tuple[int, Problem] | None = None  # (index in the cycle, its problem)
        if self._cycle:  # build now: a bad task config fails before training starts
            self._problem_of(0)

    def _problem_of(self, index: int) -> Problem:
        if self._held is None or self._held[0] != index:
            self._held = None  # free the previous network and data first
            variant = self._cycle[index]
            self._held = (index, build_problem(variant, device=self.device, dtype=self.dtype))
        return self._held[1]

    def __call__(self, epoch: int, generator: torch.Generator) -> Problem:
        if self._cycle:
            return self._problem_of(epoch % len(self._cycle))
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        return build_problem(self.cfg, seed=seed, device=self.device, dtype=self.dtype)


def check_train_activations(kind: TaskKind | str, activations: Sequence[Any] | None) -> None:
    """``ValueError`` unless ``activations`` is ``None`` or a non-empty list for a task kind
    with a hidden activation (``mnist_mlp``, ``fmnist_cnn``)."""
    if activations is None:
        return
    if TaskKind(kind) not in (TaskKind.mnist_mlp, TaskKind.fmnist_cnn):
        raise ValueError(
            f"task.train_activations varies a network's hidden activation; task kind "
            f"{TaskKind(kind).value} has none (use null)"
        )
    if len(activations) == 0:
        raise ValueError("task.train_activations is empty: list at least one, or use null")


def _activation_variants(cfg: TaskConfig) -> list[TaskConfig]:
    """The configs a non-random family cycles through: ``cfg`` itself, or one copy per entry
    of ``cfg.train_activations`` (BNN kinds only); ``[]`` for ``random_gaussians``."""
    activations = getattr(cfg, "train_activations", None)
    if activations is None:
        return [] if TaskKind(cfg.kind) == TaskKind.random_gaussians else [cfg]
    check_train_activations(cfg.kind, activations)
    return [_with_activation(cfg, activation) for activation in activations]


def _with_activation(cfg: TaskConfig, activation: Any) -> TaskConfig:
    """A copy of ``cfg`` (a :class:`TaskConfig` or the run config's read-only section) with
    this hidden activation and no ``train_activations``."""
    change = {"activation": activation, "train_activations": None}
    if dataclasses.is_dataclass(cfg):
        return dataclasses.replace(cfg, **change)
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, change)
