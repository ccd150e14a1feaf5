"""Continue SG-MCMC chains with exact, Metropolis-corrected HMC: what their states predict once
the sampler's bias is gone.

    python research/scripts/chain_fit.py --config configs/eval/mnist_nt.yaml --method sghmc --lr 0.16 \
        methods.sghmc.momentum_decay=0.1 budget.n_steps=8000 --save-states sghmc.pt
    (the same for other methods)
    python research/scripts/reference_hmc.py --config configs/eval/mnist_nt.yaml \
        --states sghmc.pt msgnht.pt nnsghmc.pt [--trajectories 200] [key=value ...]

Every SG-MCMC sampler here samples its own stationary law, not the posterior: the step's
discretisation and the minibatch noise bias it (e.g. SGHMC's output layers run hot by the
configurational temperature, ``research/scripts/chain_fit.py``). HMC on the full data with a Metropolis
test (:class:`metasampler.samplers.HMC`) has no such bias. Started from each sampler's saved
chain states (one group per ``--states`` file, run side by side in one batch under the same
mass and adaptation), it moves each group's chains towards the posterior near where that
sampler left them. The script prints, per group and every ``--report-every`` trajectories,
the mean step and acceptance rate, the chains that accept under a tenth of their proposals
("stuck": their positions are still the sampler's), the temperature of each layer (1 at the
posterior), the current states' mean NLL on the training data, their mean and ensemble test
NLL, and the test NLL and error of the posterior average over the HMC states from trajectory
``--average-from`` on, with the states' mean member NLL (their disagreement is the gap). When
the groups' statistics agree and stop moving, HMC has reached the posterior in them, and
``research/scripts/chain_fit.py --init-states`` on its ``--save-states`` file shows where each SG
sampler's own law lies from there (research/NOTEBOOK.md, "Converged HMC on a smaller network").

The inverse mass is each coordinate's variance over all groups' start states (pooled about
their mean, floored at ``--mass-floor`` times its median): HMC's step then need not be set by
the stiffest coordinate. Each chain's step adapts during the first ``--adapt`` trajectories towards
acceptance ``--target-accept``, then stays fixed; those trajectories are not averaged.
``--save-states`` writes the final states with their groups; given to ``--states`` it
continues the run (a new mass and adaptation from those states, each valid on its own).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="the evaluate.py config of the states")
    parser.add_argument(
        "--states", nargs="+", required=True, help="chain_fit.py --save-states files"
    )
    parser.add_argument("--chains", type=int, default=None, help="chains used per group (all)")
    parser.add_argument("--eta", type=float, default=0.02, help="initial leapfrog step")
    parser.add_argument("--n-leapfrog", type=int, default=20)
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--adapt", type=int, default=30, help="trajectories adapting the step")
    parser.add_argument("--target-accept", type=float, default=0.7)
    parser.add_argument("--average-from", type=int, default=None, help="default: --adapt")
    parser.add_argument("--report-every", type=int, default=25)
    parser.add_argument("--mass-floor", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-states", default=None, help="write the final HMC states here")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_intermixed_args(argv)


def load_groups(paths: list[str], dim: int, chains: int | None) -> list[tuple[str, torch.Tensor]]:
    """``(label, theta)`` per group: one per ``chain_fit.py`` file (labelled by the method
    that wrote it), and the groups of an earlier run of this script (its ``--save-states``
    file, to continue it).

    Raises:
        ValueError: a file whose positions do not fit the config's model.
    """
    from one_method import load_saved_states

    groups = []
    for path in paths:
        saved = load_saved_states(path, dim)
        theta = saved["theta"]
        if "groups" not in saved:
            label = f"{saved.get('method', Path(path).stem)} (step {saved.get('step', '?')})"
            groups.append((label, theta[:chains].float()))
            continue
        labels = saved["groups"]
        sizes = saved.get("group_sizes") or [theta.shape[0] // len(labels)] * len(labels)
        if sum(sizes) != theta.shape[0]:
            raise ValueError(
                f"{path}: group sizes {sizes} do not add up to {theta.shape[0]} chains"
            )
        for label, part in zip(labels, theta.split(sizes), strict=True):
            done = f" + HMC {saved.get('trajectories', '?')}"
            groups.append((label + done, part[:chains].float()))
    return groups


def inverse_mass(groups: list[tuple[str, torch.Tensor]], floor: float) -> torch.Tensor:
    """Each coordinate's variance over all start states, floored at ``floor`` x its median."""
    pooled = torch.cat([theta for _, theta in groups])
    var = pooled.var(0)
    return var.clamp(min=floor * float(var.median()))


def full_data_target(target):
    """The same posterior evaluated on all its data (HMC's Metropolis test needs that)."""
    from metasampler import BayesianModel

    return BayesianModel(
        target.module, (target.x, target.y), likelihood=target.likelihood,
        prior_std=target.prior_std, noise_std=target.noise_std,
    )  # fmt: skip


class GroupReport:
    """Per group of chains: the running posterior average and the rows of its table."""

    def __init__(self, label: str, chains: slice, layers: list[tuple[str, slice]]) -> None:
        from metasampler.benchmark.metrics import RunningAverage

        self.label, self.chains, self.layers = label, chains, layers
        self.average, self.member_sum, self.rows = RunningAverage(), 0.0, []

    def add(self, log_probs: torch.Tensor, y: torch.Tensor, averaged: bool) -> tuple[float, float]:
        """This group's mean member and ensemble test NLL; adds them to the average if asked."""
        from metasampler.benchmark.metrics import member_and_ensemble_nll

        mine = log_probs[self.chains]
        member, ensemble = member_and_ensemble_nll(mine, y)
        if averaged:
            self.average.update(mine)
            self.member_sum += member * mine.shape[0]
        return member, ensemble

    def average_cells(self, y: torch.Tensor) -> list[str]:
        """The posterior average's NLL, error and its states' mean member NLL (or dashes)."""
        from metasampler.benchmark.metrics import error_rate, negative_log_likelihood

        if not self.average.count:
            return ["-", "-", "-"]
        log_mean = self.average.log_mean()
        nll, error = negative_log_likelihood(log_mean, y), error_rate(log_mean, y) * 100
        return [f"{nll:.4f}", f"{error:.2f}", f"{self.member_sum / self.average.count:.4f}"]


def load_inputs(args: argparse.Namespace):
    """``(problem, full-data target, groups)``, or ``None`` after printing why not."""
    import evaluate
    from experiments.benchmark_config import load_benchmark_config
    from metasampler.config import ConfigError

    try:
        cfg = load_benchmark_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: config: {err}", file=sys.stderr)
        return None
    torch.set_num_threads(cfg.threads)
    problem = evaluate._build_problem(cfg, torch.device(cfg.device))
    target = full_data_target(problem.target)
    try:
        groups = load_groups(args.states, target.dim, args.chains)
    except (ValueError, OSError) as err:  # (a CorruptFileError is a ValueError)
        print(f"error: states: {err}", file=sys.stderr)
        return None
    return problem, target, groups


def print_tables(reports: list[GroupReport], layers: list[tuple[str, slice]]) -> None:
    """One table per group, a row per reported trajectory."""
    header = ["trajectory", "mean step", "accept", "stuck", *[f"T {name}" for name, _ in layers],
              "train NLL", "member NLL", "ensemble NLL", "average NLL", "average err %",
              "average's member NLL"]  # fmt: skip
    for group in reports:
        print(f"\n{group.label}: chains {group.chains.start}-{group.chains.stop - 1}")
        print("| " + " | ".join(header) + " |\n|" + "---:|" * len(header))
        for row in group.rows:
            print("| " + " | ".join(row) + " |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from metasampler import sample
    from metasampler.benchmark.metrics import member_nll, predict_log_probs
    from metasampler.benchmark.temperature import coordinate_virials, layer_slices
    from metasampler.files import save_checksummed
    from metasampler.samplers import HMC

    loaded = load_inputs(args)
    if loaded is None:
        return 2
    problem, target, groups = loaded
    x_test, y_test = problem.data.x_test, problem.data.y_test
    layers = layer_slices(target)
    reports, start = [], 0
    for label, theta in groups:
        reports.append(GroupReport(label, slice(start, start + theta.shape[0]), layers))
        start += theta.shape[0]
    theta0 = torch.cat([theta for _, theta in groups])
    average_from = args.adapt if args.average_from is None else args.average_from
    mass = inverse_mass(groups, args.mass_floor)
    sampler = HMC(
        eta=args.eta, n_leapfrog=args.n_leapfrog, inverse_mass=mass,
        adapt_trajectories=args.adapt, target_accept=args.target_accept,
    )  # fmt: skip
    print(f"{problem.name}: D = {target.dim}, {len(groups)} groups, {theta0.shape[0]} chains, "
          f"full-data HMC, {args.n_leapfrog} leapfrog steps a trajectory", flush=True)  # fmt: skip

    def chain_cells(state, chains: slice, trajectory: int) -> list[str]:
        """The group's mean step, acceptance rate and stuck chains (dashes while adapting)."""
        step = args.eta * float(state.extras["step_scale"][chains].mean())
        if trajectory <= args.adapt:
            return [f"{step:.4g}", "-", "-"]
        rate = sampler.acceptance_rate(state)[chains]
        return [f"{step:.4g}", f"{float(rate.mean()):.2f}", str(int((rate < 0.1).sum()))]

    def report(state, trajectory: int) -> None:
        log_probs = predict_log_probs(target, state.theta, x_test, 1000)
        averaged = trajectory >= average_from
        listed = trajectory % args.report_every == 0 or trajectory == args.trajectories
        virials = coordinate_virials(target, state.theta) if listed else None
        train = predict_log_probs(target, state.theta, target.x, 1000) if listed else None
        for group in reports:
            member, ensemble = group.add(log_probs, y_test, averaged)
            if listed:
                temps = [f"{float(virials[group.chains, sl].mean()):.3f}" for _, sl in layers]
                fit = member_nll(train[group.chains], target.y)
                group.rows.append([
                    str(trajectory), *chain_cells(state, group.chains, trajectory), *temps,
                    f"{fit:.4f}", f"{member:.4f}", f"{ensemble:.4f}", *group.average_cells(y_test),
                ])  # fmt: skip
        if listed:
            print(f"trajectory {trajectory}: " + "; ".join(
                f"{g.label} {g.rows[-1][-3]}" for g in reports), flush=True)  # fmt: skip

    def callback(state) -> None:
        if state.step % args.n_leapfrog == 0:
            report(state, state.step // args.n_leapfrog)

    initial = sampler.init(theta0, target)
    report(initial, 0)
    result = sample(
        sampler, target, theta0.shape[0], args.n_leapfrog * args.trajectories, init=theta0,
        seed=args.seed, progress=True, callback=callback, store=False,
    )  # fmt: skip
    print_tables(reports, layers)
    if args.save_states is not None:
        save_checksummed(args.save_states, {
            "theta": result.final_state.theta, "groups": [g.label for g in reports],
            "group_sizes": [g.chains.stop - g.chains.start for g in reports],
            "config": args.config, "trajectories": args.trajectories,
        })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
