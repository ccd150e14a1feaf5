"""What a loaded NNSGHMC does on an ``evaluate.py`` task: its learned curl and friction per step.

    python research/scripts/nnsghmc_friction.py --config configs/eval/mnist_nt.yaml --lr 0.036 \
        [--sampler PATH] [--n-chains 4] [--n-steps 400] [--every 50] [key=value ...]

Runs the sampler under the config's protocol (warm-up phase, ``alpha_per_step``) at the per-batch
learning rate ``--lr`` and prints, every ``--every`` steps, over all chains and coordinates:
the step ``eta_k``; the mean of ``Q_f`` (and its 10th and 90th percentiles) and the fraction
of coordinates whose ``f_phiQ`` sits at its clamp; the friction per step ``eta_k * D_f`` (mean
and 90th percentile) split into the
``alpha Q_f^2`` part and the ``s_D f_phiD + c`` part; the nets' per-coordinate inputs (median
and RMS of the standardised gradient ``g_hat``, RMS of the standardised momentum ``p_hat``, at
the last step's gradient); for a curl with the stiffness input, the 10th, 50th and 90th
percentiles of ``s_i = log(eta sqrt(V_i))``; the heat the minibatch noise adds (below); the
chains' configurational temperature (``evaluate.py``'s ``temp``: mean and hottest chain); and the
test error and NLL of the ensemble of the current chains. ``--alpha-per-step`` and
``--d-scale`` change the friction for an ablation; ``--momentum-input-clamp`` and
``--speed-limit`` replace the file's constants. Config overrides (``key=value``, as
``evaluate.py`` takes them) set the method's options as the evaluation does, e.g.
``methods.nnsghmc.momentum_decay=0.0004`` (replaces the file's constant friction ``c``) or
``methods.nnsghmc.stiffness_freeze_after=1000``.

The minibatch gradient's noise (variance ``V_i`` per coordinate over minibatches) enters the
momentum as ``eta^2 Q_f^2 V_i`` per step, and the friction ``eta D_f`` dissipates it, so a
coordinate's momentum runs at ``T + h_i`` with ``h_i = eta Q_f^2 V_i / (2 D_f)`` (Chen et al.
2014's ``B_hat / D``). The ``noise heat`` column gives the mean of ``h_i`` over the coordinates
(to compare with ``evaluate.py``'s ``temp`` column minus 1), its 90th percentile, and the mean
of ``max(h_i - T, 0)``: where ``h_i > T`` even a noise correction that knows ``V`` (the cooling
stage, ``grad_noise_estimate``) cannot cancel the heat, as it would have to inject negative
variance, so that mean is the heat left after one. ``V`` is the mean of 16 one-minibatch
estimates (``estimate_noise=True``).

SGHMC's friction per step in the benchmark is ``momentum_decay`` (0.01): a
sampler whose per-step friction is far above it moves like an over-damped (slow) SGHMC.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

# The application packages (tasks, experiments) live in the repository, not in the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from metasampler.cli import positive_int  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--lr", type=float, required=True, help="per-batch learning rate")
    parser.add_argument("--sampler", default=None)
    parser.add_argument("--n-chains", type=positive_int, default=4)
    parser.add_argument("--n-steps", type=positive_int, default=400)
    parser.add_argument("--every", type=positive_int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--alpha-per-step", type=float, default=None, help="override the config's value"
    )
    parser.add_argument(
        "--d-scale", type=float, default=1.0, help="multiply the file's f_D output scale s_D"
    )
    for name in ("momentum-input-clamp", "speed-limit"):
        parser.add_argument(f"--{name}", type=float, default=None, help="replace the file's")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_args(argv)


def build_sampler(args: argparse.Namespace, cfg, problem):
    """The config's NNSGHMC at ``--lr`` with the overrides, warmed up as the protocol does;
    returns it, its step ``eta``, the warm-up's steps and step, and the note on ``alpha``."""
    from omegaconf import OmegaConf

    from metasampler.benchmark import apply_warmup, build_method, set_alpha_from_warmup

    n = problem.target.n_data
    options = OmegaConf.to_container(cfg.methods.nnsghmc, resolve=True)
    if args.alpha_per_step is not None:
        options["alpha_per_step"] = args.alpha_per_step
    for name in ("momentum_input_clamp", "speed_limit"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    sampler = build_method(
        "nnsghmc",
        options,
        args.lr,
        n_data=n,
        n_steps=args.n_steps,
        sampler_path=args.sampler or cfg.sampler_path,
        device=str(problem.target.device),
    )
    sampler.d_output_scale *= args.d_scale
    warmup = min(cfg.budget.warmup_steps, args.n_steps)
    eta_warmup = apply_warmup(sampler, warmup, cfg.budget.warmup_lr_factor, n)
    note = set_alpha_from_warmup(sampler, options.get("alpha_per_step"), eta_warmup)
    eta = sampler.eta if sampler.eta is not None else (args.lr / n) ** 0.5
    return sampler, eta, warmup, eta_warmup, note


def print_header(args, problem, sampler, eta, warmup, eta_warmup, note) -> None:
    """The run's settings, then the head of the table."""
    print(
        f"{problem.name}: lr {args.lr:g} (eta {eta:.4g}), warm-up {warmup} steps at eta "
        f"{eta_warmup:.4g}; alpha: {note}; q_clamp {sampler.q_clamp:g}, beta_off "
        f"{sampler.beta_off:g}; s_D {sampler.d_output_scale:g}; {args.n_chains} chains"
    )
    print(
        "| step | eta_k | Q_f mean (p10 / p90) | Q clamped | eta D_f mean | eta D_f p90 | "
        "eta alpha Q^2 | eta (s_D f_D + c) | median abs g_hat | RMS g_hat | RMS p_hat | "
        "stiffness s p10 / p50 / p90 | noise heat h: mean (p90) / mean max(h - T, 0) | "
        "temp: mean (max) | ensemble test err % | ensemble test NLL |"
    )
    print("|---" * 16 + "|")


def ensemble_test_metrics(target, theta, x_test, y_test) -> tuple[float, float]:
    """Error and NLL of the chains' ensemble, per frame for a sequence task (as evaluate.py)."""
    from metasampler.benchmark import (
        ensemble_log_probs_from_lp,
        error_rate,
        frame_metrics,
        frame_targets,
        is_sequence_model,
        negative_log_likelihood,
        predict_frame_log_probs,
        predict_log_probs,
    )

    if is_sequence_model(target):
        lp = predict_frame_log_probs(target, theta, x_test, y_test)
        metrics = frame_metrics(ensemble_log_probs_from_lp(lp), frame_targets(y_test))
        return metrics["error"], metrics["nll"]
    ens = ensemble_log_probs_from_lp(predict_log_probs(target, theta, x_test))
    return error_rate(ens, y_test), negative_log_likelihood(ens, y_test)


def quantiles(x: torch.Tensor, *levels: float) -> list[float]:
    """Quantiles of all of ``x``'s entries (numpy's: ``torch.quantile`` refuses more than 2^24
    entries, fewer than 20 chains of a 1M-parameter network)."""
    return [float(v) for v in np.quantile(x.detach().double().cpu().numpy(), levels)]


def noise_heat_summary(
    target, theta: torch.Tensor, q: torch.Tensor, d: torch.Tensor, eta_k: float, temperature=1.0
) -> tuple[float, float, float]:
    """The minibatch noise's heat ``h`` per coordinate
    (:func:`metasampler.benchmark.temperature.noise_heat`, ``V`` from 16 draws): its mean and
    90th percentile over the coordinates, and the mean of ``max(h - T, 0)``, the share no noise
    correction can remove. The last two are spread by the noise of ``V``'s estimate (the last
    is biased up by it); the mean is unbiased."""
    from metasampler.benchmark.temperature import noise_heat

    gen = torch.Generator().manual_seed(12345)
    heat = noise_heat(target, theta, q, d, eta_k, draws=16, generator=gen)
    left = (heat - temperature).clamp_min(0.0)
    return float(heat.mean()), quantiles(heat, 0.9)[0], float(left.mean())


def heat_columns(sampler, target, theta, q, d, eta_k: float) -> str:
    """The noise-heat column (:func:`noise_heat_summary`) and the chains' configurational
    temperature, mean and hottest chain."""
    from metasampler.benchmark.temperature import configurational_temperature

    heat, heat_p90, left = noise_heat_summary(target, theta, q, d, eta_k, sampler.temperature)
    temps = configurational_temperature(target, theta)
    return (
        f"{heat:.3g} ({heat_p90:.3g}) / {left:.3g} | "
        f"{float(temps.mean()):.3f} ({float(temps.max()):.3f})"
    )


def friction_row(sampler, problem, state, eta_k: float) -> str:
    """One row of the table: curl, friction and ensemble test error of ``state``'s chains."""
    target, x_test, y_test = problem.target, problem.data.x_test, problem.data.y_test
    with torch.no_grad():
        terms = sampler.drift_terms(
            state.theta, state.momentum, target, eta=eta_k, grad_sq=state.extras.get("grad_sq")
        )
    q, d = terms.q.double(), terms.d.double()
    q_p10, q_p90 = quantiles(q, 0.1, 0.9)
    clamped = ((q - sampler.beta_off).abs() >= sampler.q_clamp - 1e-6).double().mean()
    clamped = "–" if getattr(sampler, "precondition_power", 0) > 0 else f"{float(clamped):.1%}"
    units = getattr(sampler, "friction_units", "absolute")
    # the alpha Q_f^2 share of D_f (before any d_clamp): divided by eta in per-step units
    curl_part = sampler.alpha * q * q / (eta_k if units == "per_step" else 1.0)
    per_step = eta_k * d
    v = sampler._scalars(target, eta_k, sampler.temperature)
    g_hat, p_hat = state.grad.double() * v["g_scale"], state.momentum.double() * v["inv_sp"]
    err, nll = ensemble_test_metrics(target, state.theta, x_test, y_test)
    stiffness = "–"
    if state.extras.get("grad_sq") is not None:
        from metasampler.learned.stiffness import stiffness_input

        s = stiffness_input(state.extras["grad_sq"], eta_k)
        p10, p50, p90 = quantiles(s, 0.1, 0.5, 0.9)
        stiffness = f"{p10:.2f} / {p50:.2f} / {p90:.2f}"
    return (
        f"| {state.step} | {eta_k:.4g} | {float(q.mean()):.3f} ({q_p10:.3f} / {q_p90:.3f}) | "
        f"{clamped} | "
        f"{float(per_step.mean()):.4f} | {quantiles(per_step, 0.9)[0]:.4f} | "
        f"{float((eta_k * curl_part).mean()):.4f} | "
        f"{float((eta_k * (d - curl_part)).mean()):.4f} | {float(g_hat.abs().median()):.2f} | "
        f"{float(g_hat.pow(2).mean().sqrt()):.2f} | {float(p_hat.pow(2).mean().sqrt()):.3f} | "
        f"{stiffness} | {heat_columns(sampler, target, state.theta, q, d, eta_k)} | "
        f"{100 * err:.2f} | {nll:.4f} |"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)

    from experiments.benchmark_config import load_benchmark_config
    from metasampler import sample
    from tasks.registry import build_problem

    cfg = load_benchmark_config(args.config, args.overrides)
    problem = build_problem(cfg.task, seed=cfg.task.seed, device="cpu")
    sampler, eta, warmup, eta_warmup, note = build_sampler(args, cfg, problem)
    print_header(args, problem, sampler, eta, warmup, eta_warmup, note)

    def report(state) -> None:
        k = state.step
        if k % args.every and k != args.n_steps:
            return
        eta_k = eta * sampler.schedule(k).scale
        print(friction_row(sampler, problem, state, eta_k), flush=True)

    sample(
        sampler,
        problem.target,
        args.n_chains,
        args.n_steps,
        init=lambda g: problem.init(args.n_chains, g),
        seed=args.seed,
        progress=False,
        callback=report,
        store=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
