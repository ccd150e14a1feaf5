"""One method of an ``evaluate.py`` config, as the protocol builds it, for the diagnostics in
``research/scripts/`` (``chain_fit.py``, ``prior_only_variance.py``) that run a single method at a
chosen per-batch learning rate instead of tuning it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from experiments.benchmark_config import load_benchmark_config
from metasampler.benchmark.methods import METHODS
from metasampler.benchmark.protocol import MethodFactory
from metasampler.config import ConfigError


def method_parser(description: str | None) -> argparse.ArgumentParser:
    """A parser with the arguments that pick the method (``--config``, ``--method``, ``--lr``,
    ``--sampler``); each script adds its own, then the config overrides (``key=value``)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="an evaluate.py config")
    parser.add_argument("--method", required=True, help="a key of the config's methods")
    parser.add_argument("--lr", type=float, required=True, help="per-batch learning rate")
    parser.add_argument("--sampler", default=None, help="NNSGHMC file (nnsghmc, cnnsghmc)")
    return parser


@dataclass
class OneMethod:
    """The loaded config, its problem (data, target, initialisation) and the method's factory
    (``factory(lr, n_steps)`` is the sampler with the protocol's warm-up)."""

    cfg: DictConfig
    problem: Any
    factory: MethodFactory


def load_one_method(
    config: str, overrides: list[str], method: str, sampler_path: str | None = None
) -> OneMethod:
    """Method ``method`` of the benchmark config at ``config`` (with ``key=value`` overrides),
    its options from the config with the friction constant (not a grid), on the config's
    problem; sets the config's thread count.

    Raises:
        ConfigError: the config is invalid, or ``method`` is not one of its methods.
    """
    import evaluate  # (the application's problem builder; imported here for the scripts)

    cfg = load_benchmark_config(config, overrides)
    if method not in cfg.methods:
        raise ConfigError(
            f"--method {method!r} is not one of the config's methods: {', '.join(cfg.methods)}"
        )
    torch.set_num_threads(cfg.threads)
    problem = evaluate._build_problem(cfg, torch.device(cfg.device))
    options = OmegaConf.to_container(cfg.methods[method], resolve=True)
    for option in METHODS[method].tuned_options:  # (the config's constant values, not grids)
        options.pop(f"{option}_grid", None)
    budget = cfg.budget
    factory = MethodFactory(
        method, options, problem.target.n_data, budget.warmup_steps, budget.warmup_lr_factor,
        sampler_path, cfg.device,
    )  # fmt: skip
    return OneMethod(cfg, problem, factory)


def load_from_args(args: argparse.Namespace) -> OneMethod | None:
    """:func:`load_one_method` for the arguments of :func:`method_parser` (and
    ``args.overrides``); ``None`` after printing the error when the config is bad."""
    try:
        return load_one_method(args.config, args.overrides, args.method, args.sampler)
    except ConfigError as err:
        print(f"error: config: {err}", file=sys.stderr)
        return None


def load_saved_states(path: str, dim: int) -> dict[str, Any]:
    """What ``research/scripts/chain_fit.py --save-states`` (or ``research/scripts/reference_hmc.py``) wrote to
    ``path``, its ``theta`` checked to be ``(chains, dim)`` positions.

    Raises:
        ValueError: the positions do not fit a model of ``dim`` parameters; a
            :class:`~metasampler.files.CorruptFileError` (a ``ValueError``) for an altered file.
    """
    from metasampler.files import load_checksummed

    saved = load_checksummed(path)
    theta = saved.get("theta")
    if not isinstance(theta, torch.Tensor) or theta.ndim != 2 or theta.shape[1] != dim:
        shape = tuple(theta.shape) if isinstance(theta, torch.Tensor) else type(theta).__name__
        raise ValueError(f"{path}: positions {shape} do not fit this model (D = {dim})")
    return saved
