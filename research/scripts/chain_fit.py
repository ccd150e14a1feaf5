"""Where an ``evaluate.py`` method's chains sit: per-chain train and test NLL and weight norm.

    python research/scripts/chain_fit.py --config configs/eval/mnist_nt_af.yaml --method cnnsghmc \
        --lr 4.2 --sampler pretrained/mnist_mlp_positive_preconditioned.safetensors \
        [--steps 1 100 500 1000 1500 1600 1700 1800 2000] [key=value ...]

Runs one method of the config (its options from the config and the ``key=value``
overrides, its warm-up and schedule as the protocol builds them) at the per-batch learning rate
``--lr`` for the config's chains and steps, and prints at each step of ``--steps`` the chains'
mean NLL on the training and test splits, the test NLL of their ensemble, their mean energy
and half squared weight norm ``|theta|^2 / 2``. Under a Gaussian prior ``N(0, s^2 I)`` a chain
that has reached the prior's typical set in the directions the data leave free has a half
squared norm near ``D s^2 / 2`` (printed first), so the norm tells how far the chains have
mixed in those directions. The last column is the chains' mean configurational temperature
``theta . grad U(theta) / D`` (full-data gradient; 1 in expectation over the posterior, below
while the chains spread from a small start or sample cold, above where they run hot:
:mod:`metasampler.benchmark.temperature`); a last table gives it per parameter tensor (each
also 1 at the posterior), which shows where the chains run hot or cold. For NNSGHMC another
table gives the median of the learned curl ``Q_f`` per parameter tensor (with its stiffness
preconditioner and speed limit, at the chains' state): how fast each tensor's coordinates move
per step relative to ``eta``.

Where the model's first parameter is a ``Linear`` weight on the flat inputs (the MLPs), a
second table splits the first layer's weights by how many training examples have their input
feature non-zero and gives their mean ``theta^2 / 2`` per weight (``s^2 / 2`` at the prior;
much less where the data pin a weight near zero).

``--average-from S`` also accumulates the posterior-average predictive on the test split from
step ``S`` on (every ``--average-every`` steps, all chains) and prints its NLL and error at the
end: with a long run of a small-step sampler, a reference for what the posterior predicts.
It also prints the averaged states' mean member NLL: the gap between that and the average's NLL
is how much the kept states disagree (zero when they all predict alike).

``--per-chain`` (with ``--average-from``) also keeps each chain's own posterior average and
prints, per chain, its final configurational temperature, the test NLL of its own average and
that of all chains' average without it, then the average over the chains whose final
temperature is at most ``--hot`` against the average over the others: which chains the
posterior average's NLL owes what to (a few hot chains, or the rest; research/NOTEBOOK.md, session
51).

``--save-states PATH`` writes the chains' final positions (a checksummed ``torch.save`` file
with the config, method, learning rate and step), e.g. as start positions for
``research/scripts/reference_hmc.py``. ``--init-states PATH`` starts the chains from such a file
instead of the config's initialisation (say, one sampler from where another left its chains),
as many chains as it holds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# The application packages (tasks, experiments) live in the repository, not in the wheel.
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from one_method import load_from_args, load_saved_states, method_parser  # noqa: E402

from metasampler.cli import positive_float  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = method_parser(__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[1, 100, 500, 1000, 1500, 1600, 1700, 1800, 2000]
    )
    parser.add_argument("--average-from", type=int, default=None, help="first averaged step")
    parser.add_argument("--average-every", type=int, default=10)
    parser.add_argument(
        "--per-chain", action="store_true", help="with --average-from: each chain's own average"
    )
    parser.add_argument(
        "--hot", type=positive_float, default=1.2, help="--per-chain: hotter than this is hot"
    )
    parser.add_argument("--save-states", default=None, help="write the final positions here")
    parser.add_argument("--init-states", default=None, help="start from these saved positions")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_intermixed_args(argv)


def nlls(target, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The chains' mean NLL per example on ``(x, y)`` and their ensemble's (the NLL of the
    chains' average predictive)."""
    from metasampler.benchmark.metrics import member_and_ensemble_nll, predict_log_probs

    return member_and_ensemble_nll(predict_log_probs(target, theta, x, 1000), y)


# Bins of "training examples with this input feature non-zero" for the first-layer split.
_FREQUENCY_BINS = ((0, 0), (1, 9), (10, 99), (100, 999), (1000, None))


def first_layer_split(target, x_train: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """Flat indices of the first-layer weights per input-frequency bin (``None``: no such layer)."""
    _, weight = next(iter(target.module.named_parameters()))
    if weight.dim() != 2 or weight.shape[1] != x_train[0].numel():
        return None
    on_count = (x_train.flatten(1) != 0).sum(0)
    index = torch.arange(weight.numel()).view(weight.shape)
    split = []
    for low, high in _FREQUENCY_BINS:
        inside = (on_count >= low) & (on_count <= (high if high is not None else on_count.max()))
        label = f"{low}" if high == low else f"{low}-{high}" if high else f">= {low}"
        split.append((f"{label} ({int(inside.sum())} inputs)", index[:, inside].reshape(-1)))
    return split


def print_by_step(title: str, labels: list[str], rows: dict[int, list[str]]) -> None:
    """A table of formatted cells, one row per reported step."""
    print(f"\n{title}")
    print("| step | " + " | ".join(labels) + " |")
    print("|---:|" + "---:|" * len(labels))
    for step, cells in rows.items():
        print(f"| {step} | " + " | ".join(cells) + " |")


def labelled_slices(target) -> list[tuple[str, slice]]:
    """Each parameter tensor's slice of the flat ``theta``, labelled with its name and size."""
    from metasampler.benchmark.temperature import parameter_slices

    return [(f"{name} ({part.stop - part.start})", part) for name, part in parameter_slices(target)]


def curl_medians(sampler, state, target, slices: list[tuple[str, slice]]) -> list[str]:
    """The median of NNSGHMC's curl ``Q_f`` over each tensor's coordinates and the chains, at
    the chains' state (its gradient statistic as the next step would use it)."""
    grad_sq = state.extras.get("grad_sq")
    with torch.no_grad():
        q = sampler.drift_terms(state.theta, state.momentum, target, grad_sq=grad_sq).q
    return [f"{float(q[:, part].median()):.3f}" for _, part in slices]


def mean_and_se(per_chain: torch.Tensor) -> tuple[float, float]:
    """Mean over the chains and its standard error (the chains are independent)."""
    return float(per_chain.mean()), float(per_chain.std() / per_chain.numel() ** 0.5)


def print_average(average, member_nll: float, y_test: torch.Tensor, start: int) -> None:
    """The posterior average's test NLL and error, and its states' mean member NLL."""
    from metasampler.benchmark.metrics import error_rate, negative_log_likelihood

    log_mean = average.log_mean()
    nll, error = negative_log_likelihood(log_mean, y_test), error_rate(log_mean, y_test) * 100
    print(f"\nPosterior average over {average.count} chain states from step {start}: "
          f"test NLL {nll:.4f}, error {error:.2f} %; the states' mean member NLL "
          f"{member_nll:.4f} (gap {member_nll - nll:.4f}: how much they disagree)")  # fmt: skip


def print_per_chain(
    log_sums: torch.Tensor, count: int, temperatures: torch.Tensor, y_test: torch.Tensor, hot: float
) -> None:
    """Each chain's own posterior average and what it adds to all chains' (``log_sums``:
    ``(K, B, C)`` summed log-probabilities of ``count`` states per chain), then the average of
    the chains at most ``hot`` against that of the hotter ones."""
    from metasampler.benchmark.metrics import RunningAverage, error_rate, negative_log_likelihood

    def average_of(chains: torch.Tensor) -> torch.Tensor:  # the chains' log mean predictive
        summed = torch.logsumexp(log_sums[chains], 0)
        return RunningAverage.from_log_sum(summed, count * int(chains.sum())).log_mean()

    def scores(chains: torch.Tensor) -> str:
        if not bool(chains.any()):
            return "no chain"
        log_mean = average_of(chains)
        nll, error = negative_log_likelihood(log_mean, y_test), error_rate(log_mean, y_test)
        return f"{int(chains.sum())} chains: test NLL {nll:.4f}, error {error * 100:.2f} %"

    n_chains = log_sums.shape[0]
    print("\nPer chain: final temperature, its own posterior average's test NLL, and all "
          "chains' average without it")  # fmt: skip
    print("| chain | temperature | own average NLL | all but this chain |\n|---:|---:|---:|---:|")
    for k in range(n_chains):
        own = torch.arange(n_chains) == k
        print(f"| {k} | {float(temperatures[k]):.3f} | "
              f"{negative_log_likelihood(average_of(own), y_test):.4f} | "
              f"{negative_log_likelihood(average_of(~own), y_test):.4f} |")  # fmt: skip
    cool = temperatures <= hot
    print(f"\nAll chains: {scores(torch.ones_like(cool))}; temperature <= {hot}: "
          f"{scores(cool)}; hotter: {scores(~cool)}")  # fmt: skip


def save_states(path: str, theta: torch.Tensor, args: argparse.Namespace, step: int) -> None:
    """The chains' positions and where they come from, as a checksummed file."""
    from metasampler.files import save_checksummed

    save_checksummed(path, {
        "theta": theta.detach().cpu(), "config": args.config, "method": args.method,
        "lr": args.lr, "overrides": list(args.overrides), "seed": args.seed, "step": step,
    })  # fmt: skip
    print(f"\nWrote the {theta.shape[0]} chains' positions at step {step} to {path}")


def chain_starts(path: str | None, problem, n_chains: int):
    """``(n_chains, init)`` for ``sample``: the config's initialisation, or (``path``) the
    positions a ``--save-states`` file holds, as many chains as it has.

    Raises:
        ValueError: the file's positions do not fit the model; CorruptFileError (a ValueError).
    """
    if path is None:
        return n_chains, lambda gen: problem.init(n_chains, gen)
    theta = load_saved_states(path, problem.target.dim)["theta"]
    return theta.shape[0], theta.to(problem.data.x_test.device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from metasampler import sample
    from metasampler.benchmark.metrics import RunningAverage, member_nll, predict_log_probs
    from metasampler.benchmark.temperature import coordinate_virials

    if args.per_chain and args.average_from is None:
        print("error: --per-chain needs --average-from (the first averaged step)", file=sys.stderr)
        return 2
    run = load_from_args(args)
    if run is None:
        return 2
    cfg, problem, budget = run.cfg, run.problem, run.cfg.budget
    data, target = problem.data, problem.target
    sampler = run.factory(args.lr, budget.n_steps)
    try:
        n_chains, init = chain_starts(args.init_states, problem, budget.n_chains)
    except (ValueError, OSError) as err:  # (CorruptFileError is a ValueError)
        print(f"error: --init-states: {err}", file=sys.stderr)
        return 2
    print(f"{problem.name}: D = {target.dim}; prior typical set: |theta|^2 / 2 ~ "
          f"{target.dim * cfg.task.prior_std**2 / 2:.0f}")  # fmt: skip
    print("| step | train NLL | test NLL | test NLL, ensemble | energy | abs(theta)^2 / 2 | "
          "temperature |\n|---:|---:|---:|---:|---:|---:|---:|")  # fmt: skip

    split = first_layer_split(target, data.x_train)
    by_frequency: dict[int, list[str]] = {}
    slices, by_tensor, curl_by_tensor = labelled_slices(target), {}, {}
    average, member_nll_sum, final = RunningAverage(), [0.0], {}
    per_chain: dict[str, torch.Tensor] = {}  # --per-chain: (K, B, C) summed log-probabilities

    def report(state) -> None:
        final["state"] = state
        start = args.average_from
        if (
            start is not None
            and state.step >= start
            and (state.step - start) % args.average_every == 0
        ):
            log_probs = predict_log_probs(target, state.theta, data.x_test, 1000)
            average.update(log_probs)
            if args.per_chain:
                summed = per_chain.get("log_sums")
                per_chain["log_sums"] = (
                    log_probs.double() if summed is None else torch.logaddexp(summed, log_probs)
                )
            member_nll_sum[0] += member_nll(log_probs, data.y_test) * log_probs.shape[0]
        if state.step in args.steps:
            if split is not None:
                half_sq = state.theta.pow(2) / 2
                by_frequency[state.step] = [f"{half_sq[:, i].mean():.3f}" for _, i in split]
            train, _ = nlls(target, state.theta, data.x_train, data.y_train)
            test, ensemble = nlls(target, state.theta, data.x_test, data.y_test)
            norm = float(state.theta.pow(2).sum(-1).mean()) / 2
            energy = float(state.energy.mean())
            virials = coordinate_virials(target, state.theta)
            temperature = float(virials.mean())
            by_tensor[state.step] = [
                "{:.3f} ± {:.3f}".format(*mean_and_se(virials[:, sl].mean(-1))) for _, sl in slices
            ]
            if hasattr(sampler, "drift_terms"):
                curl_by_tensor[state.step] = curl_medians(sampler, state, target, slices)
            print(f"| {state.step} | {train:.4f} | {test:.4f} | {ensemble:.4f} | {energy:.1f} | "
                  f"{norm:.1f} | {temperature:.3f} |", flush=True)  # fmt: skip

    sample(
        sampler, target, n_chains, budget.n_steps, init=init, seed=args.seed, progress=False,
        callback=report, store=False,
    )  # fmt: skip
    if split is not None:
        print_by_step(
            "First-layer weights by how many training examples have their input non-zero: mean "
            f"theta^2 / 2 per weight (prior: {cfg.task.prior_std**2 / 2:.3f})",
            [label for label, _ in split], by_frequency,
        )  # fmt: skip
    print_by_step(
        "Configurational temperature by parameter tensor: mean theta_i dU/dtheta_i over its "
        "coordinates, mean ± standard error over the chains (1 at the posterior)",
        [label for label, _ in slices], by_tensor,
    )  # fmt: skip
    if curl_by_tensor:
        print_by_step(
            "NNSGHMC's curl Q_f by parameter tensor: median over the chains and coordinates",
            [label for label, _ in slices], curl_by_tensor,
        )  # fmt: skip
    if average.count:
        print_average(average, member_nll_sum[0] / average.count, data.y_test, args.average_from)
    if per_chain:
        temperatures = coordinate_virials(target, final["state"].theta).mean(-1)
        n_states = average.count // per_chain["log_sums"].shape[0]
        print_per_chain(per_chain["log_sums"], n_states, temperatures, data.y_test, args.hot)
    if args.save_states is not None:
        save_states(args.save_states, final["state"].theta, args, final["state"].step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
