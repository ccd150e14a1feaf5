"""Why a toy sampler does what it does on the 20-D test Gaussian (research/NOTEBOOK.md, issue #11).

    python research/scripts/toy_diagnostics.py SAMPLER.safetensors [more files] [--steps 2000]

For each sampler file (or ``sghmc`` for SGHMC with friction 1), at the test step ``eta = 0.025``:

* **coefficients**: mean ``|Q_f|``, share of coordinates on the ``Q`` clamp, mean ``D_f``,
  share on the ``D`` clamp, on exact samples of the 10-D training and of the 20-D test
  Gaussian (momenta ``N(0, I)``): whether the nets behave at test as in training;
* **shape**: mean ``Q_f`` and ``D_f`` against the momentum ``p`` (all coordinates set to ``p``)
  on exact test samples;
* **stationary**: 50 chains started at exact test samples, ``--steps`` steps with gradient
  noise N(0, 1): the sample variance over the target variance along the target's stiffest,
  median and broadest eigendirection, and the largest mean error in target standard
  deviations (the bias a sampler adds once burn-in is out of the picture), and the KL of the
  Gaussian fitted to those samples; again with noise-free gradients, which is the same sampler
  with the noise its injection should leave out for the gradient noise (SGHMC's ``B_hat``):
  the difference is the heating ``eta Q_f^2 / (2 D_f)`` by the gradient noise.

Samplers trained with ``task.energy_log_normaliser`` get the energy constant on both targets.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "research" / "scripts"))

from toy_eval import trained_with_normalised_energy  # noqa: E402

import metasampler as ms  # noqa: E402
from metasampler.cli import positive_int  # noqa: E402
from metasampler.diagnostics.divergences import gaussian_kl  # noqa: E402
from tasks.toy import GaussianTask, paper_test_gaussian, paper_train_gaussian  # noqa: E402

ETA = 0.025


def _tasks(path: str) -> tuple[GaussianTask, GaussianTask]:
    train, test = paper_train_gaussian(), paper_test_gaussian()
    if path != "sghmc" and trained_with_normalised_energy(Path(path)):
        train, test = train.with_normalised_energy(), test.with_normalised_energy()
    return train, test


def _exact(task: GaussianTask, n: int, seed: int) -> torch.Tensor:
    noise = torch.randn(
        n, task.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    return task.mean + noise @ task.cov_cholesky.T


def _equilibrium_grad_sq(sampler: ms.NNSGHMC, task: GaussianTask) -> dict:
    """``grad_sq=`` for a sampler with the stiffness input: ``E[(d_i Ũ)^2]`` at equilibrium,
    the precision's diagonal plus the gradient noise's variance (1); else nothing."""
    if not getattr(sampler, "uses_stiffness", False):
        return {}
    return {"grad_sq": torch.linalg.inv(task.cov).diagonal() + 1.0}


def coefficients(sampler: ms.NNSGHMC, train: GaussianTask, test: GaussianTask) -> str:
    """``|Q_f|`` and ``D_f`` at equilibrium of the training and the test Gaussian (with the
    stiffness input also ``|Q_f|`` of the stiffest and the broadest coordinate)."""
    parts = []
    for name, task in (("train", train), ("test", test)):
        theta = _exact(task, 500, 0)
        p = torch.randn(
            theta.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64
        )
        grad_sq = _equilibrium_grad_sq(sampler, task)
        target = task.target(1.0, dtype=torch.float64)
        terms = sampler.drift_terms(theta, p, target, eta=ETA, **grad_sq)
        q, d = terms.q.abs(), terms.d
        on_q = (q >= sampler.q_clamp - 1e-6).double().mean()
        on_d = (d >= sampler.d_clamp - 1e-6).double().mean() if sampler.d_clamp else 0.0
        text = f"{name}: |Q| {q.mean():.2f} ({on_q:.0%} clamped)"
        if grad_sq:
            order = grad_sq["grad_sq"].argsort()
            column = q.mean(0)
            text += f" [stiffest {column[order[-1]]:.2f}, broadest {column[order[0]]:.2f}]"
        parts.append(f"{text}, D {d.mean():.2f} ({on_d:.0%} clamped)")
    return "; ".join(parts)


def shape(sampler: ms.NNSGHMC, test: GaussianTask) -> str:
    """Mean ``Q_f`` / ``D_f`` against the momentum on exact test samples."""
    theta = _exact(test, 200, 0)
    target = test.target(1.0, dtype=torch.float64)
    rows = []
    for p in (-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0):
        terms = sampler.drift_terms(
            theta, torch.full_like(theta, p), target, eta=ETA, **_equilibrium_grad_sq(sampler, test)
        )
        rows.append(f"p={p:+.0f}: Q {terms.q.mean():+.2f} D {terms.d.mean():.2f}")
    return " | ".join(rows)


def stationary(
    sampler: ms.samplers.Sampler, test: GaussianTask, steps: int, noise: float = 1.0
) -> str:
    """Variance ratios along the test Gaussian's eigendirections and the KL of the fitted
    Gaussian, 50 chains started exact, gradient noise ``N(0, noise^2)``."""
    start = _exact(test, 50, 2).float()
    result = ms.sample(
        sampler, test.target(noise), 50, steps, init=lambda g: start, seed=1, progress=False
    )
    x = result.theta.double().reshape(-1, test.dim)
    variances, directions = torch.linalg.eigh(test.cov)
    projected = (x - test.mean) @ directions
    ratio = projected.var(0) / variances
    mean_err = (projected.mean(0) / variances.sqrt()).abs().max()
    kl = gaussian_kl(x, test.mean, test.cov)
    return (
        f"variance ratio stiffest {ratio[0]:.3f}, median {ratio.median():.3f}, broadest "
        f"{ratio[-1]:.3f}, mean {ratio.mean():.3f}; largest mean error {mean_err:.3f} sd; "
        f"KL {kl:.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("samplers", nargs="+", help="sampler files, or 'sghmc'")
    parser.add_argument(
        "--steps", type=positive_int, default=2000, help="steps of the stationary run"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for path in args.samplers:
        train, test = _tasks(path)
        print(f"## {path}")
        if path == "sghmc":
            sampler = ms.samplers.SGHMC(eta=ETA, friction=1.0)
        else:
            sampler = ms.load_sampler(path, eta=ETA)
            sampler.use_compile = False  # reproducible run to run (see toy_eval.py)
            learned = copy.deepcopy(sampler).double()  # float64 nets for the terms
            print("coefficients:", coefficients(learned, train, test))
            print("shape:", shape(learned, test))
        print("stationary:", stationary(sampler, test, args.steps))
        # Gaussian noise adds in distribution: the noise-free run is the same sampler with
        # SGHMC's B-hat correction for a known gradient-noise variance (the heating removed).
        print("stationary, noise-free gradients:", stationary(sampler, test, args.steps, 0.0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
