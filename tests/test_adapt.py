"""``ms.sample(..., adapt=True)``: the burn-in chooses the step (and friction) and the kept
samples come from that fixed kernel (metasampler/adapt/)."""

from __future__ import annotations

import math

import pytest
import torch

import metasampler as ms
from metasampler.adapt import Adapt, stein_kl
from tasks.linear_regression import linear_regression
from tasks.logistic_regression import logistic_regression

D = 4


def _gaussian() -> tuple[ms.EnergyTarget, torch.Tensor, torch.Tensor]:
    """A rotated 4-D Gaussian, variances 0.1 ... 10 (condition number 100), mean 2."""
    g = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    cov = basis @ torch.diag(torch.logspace(-1, 1, D, dtype=torch.float64)) @ basis.T
    precision = torch.linalg.inv(cov).float()
    mean = torch.full((D,), 2.0)

    def energy(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (((x - mean) @ precision) * (x - mean)).sum(-1)

    return ms.EnergyTarget(energy, dim=D), mean.double(), cov


K, N_STEPS, BURN_IN = 32, 2000, 600


def _kl(result: ms.SampleResult, mean: torch.Tensor, cov: torch.Tensor) -> float:
    return ms.diagnostics.gaussian_kl(result.theta.double(), mean, cov)


def _run(eta: float, seed: int, adapt: bool | Adapt = False) -> ms.SampleResult:
    target, _, _ = _gaussian()
    sampler = ms.samplers.SGLD(eta=eta)
    return ms.sample(
        sampler, target, K, N_STEPS, burn_in=BURN_IN, seed=seed, progress=False, adapt=adapt
    )


def test_adapted_step_is_within_a_factor_of_2_of_the_kl_optimal_step_at_the_budget():
    _, mean, cov = _gaussian()
    grid = [0.1 * 2 ** (j / 2) for j in range(-5, 0)]  # 0.0177 ... 0.0707
    kls = {eta: sum(_kl(_run(eta, seed), mean, cov) for seed in (0, 1)) / 2 for eta in grid}
    best = min(kls, key=kls.get)
    assert best not in (grid[0], grid[-1])  # the grid brackets the optimum
    result = _run(0.05, seed=3, adapt=True)
    chosen = result.adapted.eta
    assert best / 2 <= chosen <= best * 2, (chosen, kls)
    assert _kl(result, mean, cov) <= 2 * kls[best]


def test_starts_100x_too_large_and_too_small_end_at_the_same_choice_within_a_factor_of_2():
    large = _run(3.0, seed=1, adapt=True).adapted
    small = _run(0.0003, seed=1, adapt=True).adapted
    assert large.start_eta == 3.0 and small.start_eta == 0.0003
    assert 0.5 <= large.eta / small.eta <= 2.0, (large.eta, small.eta)
    # the too-large start's bracket held steps that diverged: dropped, not fatal
    assert any(t.error is not None for t in large.trials)
    # the too-small start's bracket moved up at least once (its best was at the top end)
    assert max(t.eta for t in small.trials if t.kind == "bracket") > 0.0003 * 256


def test_kept_samples_come_from_the_fixed_chosen_kernel():
    target, _, _ = _gaussian()
    seen: list[tuple[float, int]] = []

    def callback(state: ms.samplers.SamplerState) -> None:
        seen.append((state.eta, state.step))

    sampler = ms.samplers.SGHMC(eta=0.3, friction=1.0)
    result = ms.sample(
        sampler, target, 16, 1200, burn_in=400, thin=2, seed=3, progress=False,
        adapt=True, callback=callback,
    )  # fmt: skip
    adapted = result.adapted
    assert adapted.friction_name == "friction" and adapted.friction is not None
    assert adapted.sampler.friction == adapted.friction
    assert adapted.sampler.eta == adapted.eta
    assert sampler.eta == 0.3 and sampler.friction == 1.0  # the caller's sampler is untouched
    # every step the callback saw (settle and kept) ran at the chosen step
    assert {eta for eta, _ in seen} == {adapted.eta}
    assert seen[-1][1] == 1200 and len(seen) == 800 + adapted.settle_steps
    assert result.final_state.eta == adapted.eta
    # the kept run is exactly a fresh run of the chosen kernel from the burn-in's end
    generator = torch.Generator().manual_seed(0)
    generator.set_state(adapted.generator_state)
    state, kept = adapted.state, []
    assert state.step == 400
    for _ in range(800):
        state = adapted.sampler.step(state, target, generator)
        if state.step % 2 == 0:
            kept.append(state.theta)
    assert torch.equal(torch.stack(kept), result.theta)


def test_a_gradient_that_overflows_at_large_steps_still_adapts_without_error():
    # a steep quartic wall: at steps above ~0.05 a chain is thrown out and x^4 overflows
    # float32 within a few steps (a NonFiniteError in every such trial group)
    target = ms.EnergyTarget(lambda x: (0.5 * x * x + 5.0 * x**4).sum(-1), dim=2)
    with pytest.raises(ms.NonFiniteError):  # without adapt the start step diverges
        ms.sample(ms.samplers.SGLD(eta=1.0), target, 16, 600, burn_in=300, seed=0, progress=False)
    result = ms.sample(
        ms.samplers.SGLD(eta=1.0), target, 16, 600, burn_in=300, seed=0, progress=False,
        adapt=True,
    )  # fmt: skip
    adapted = result.adapted
    diverged = [t for t in adapted.trials if t.error is not None]
    assert diverged and all("non-finite" in t.error for t in diverged)
    assert adapted.eta < 0.05
    assert bool(torch.isfinite(result.theta).all())
    # the positions' spread is the target's (about 0.3 per coordinate), not a frozen chain's
    assert 0.15 < float(result.theta.std()) < 0.5


def _logistic_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    p = torch.sigmoid(x @ torch.tensor([2.0, -1.0]) + 0.5)
    return x, (torch.rand(n, generator=g) < p).float().unsqueeze(-1)


def _validation_nll(model: ms.BayesianModel, result: ms.SampleResult, x, y) -> float:
    logp = model.log_likelihood(result.theta.flatten(0, 1), x, y)
    return float(-(torch.logsumexp(logp, 0) - math.log(logp.shape[0])).mean())


def test_the_validation_criterion_picks_a_sensible_step_for_a_logistic_regression():
    x, y = _logistic_data(200, 0)
    xv, yv = _logistic_data(200, 1)
    model = ms.BayesianModel(
        torch.nn.Linear(2, 1), (x, y), likelihood="bernoulli", prior_std=3.0, batch_size=50
    )

    def run(eta: float, adapt: bool | Adapt = False) -> ms.SampleResult:
        sampler = ms.samplers.SGLD(eta=eta)
        return ms.sample(sampler, model, 8, 700, burn_in=300, seed=0, progress=False, adapt=adapt)

    # 1e-5 is 100x too small: the chains have not reached the posterior after 700 steps
    reference = {eta: _validation_nll(model, run(eta), xv, yv) for eta in (1e-5, 1e-3)}
    assert reference[1e-5] > reference[1e-3] + 0.05
    result = run(1e-5, Adapt(validation=(xv, yv)))
    assert result.adapted.criterion == "validation"
    assert 2e-4 < result.adapted.eta < 0.02
    assert _validation_nll(model, result, xv, yv) < reference[1e-3] + 0.01


def _regression_kl(sampler: ms.samplers.Sampler, adapt: bool = False) -> float:
    task = linear_regression()  # an ordinary model with an exact Gaussian posterior
    result = ms.sample(
        sampler, task.model, 16, 3000, burn_in=1000, seed=0, progress=False, adapt=adapt
    )
    return _kl(result, task.mean, task.cov)


def test_a_linear_regression_adapts_from_starts_100x_off_to_near_the_grid_s_best():
    """SGLD and SGHMC on an ordinary regression model, from steps 100x too small and too
    large: the search moves past the end of its last step (and friction) round where the
    best sits there, and ends near the KL the best of a grid reaches from the start."""
    sgld_grid = [5e-6, 1e-5, 2e-5, 4e-5]
    sgld = {eta: _regression_kl(ms.samplers.SGLD(eta=eta)) for eta in sgld_grid}
    assert min(sgld, key=sgld.get) not in (sgld_grid[0], sgld_grid[-1])
    for start in (1e-7, 1e-3):
        assert _regression_kl(ms.samplers.SGLD(eta=start), adapt=True) < 2 * min(sgld.values())
    # SGHMC from a friction 4 to 10 times below the grid's best: the friction round moves on
    sghmc = [
        _regression_kl(ms.samplers.SGHMC(eta=eta, friction=friction))
        for eta in (3e-4, 1e-3, 3e-3)
        for friction in (30.0, 100.0, 300.0)
    ]
    for start in (3e-5, 0.3):
        adapted = _regression_kl(ms.samplers.SGHMC(eta=start, friction=30.0), adapt=True)
        assert adapted < 2 * min(sghmc)


def test_stein_kl_is_the_gaussian_kl_to_second_order():
    # exact moments: a Gaussian fit N(m + d, S) to the target N(m, C)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=g, dtype=torch.float64)
    cov = a @ a.T + 3 * torch.eye(3, dtype=torch.float64)
    precision = torch.linalg.inv(cov)
    mean = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    fit_cov = cov * 1.05 + 0.01 * torch.eye(3, dtype=torch.float64)
    fit_mean = mean + 0.02
    # sums of n "samples" with exactly those moments: x x^T and x g^T with g = P (x - m)
    n = 1000
    sum_x = n * fit_mean
    second = fit_cov + torch.outer(fit_mean, fit_mean)
    sum_g = n * precision @ (fit_mean - mean)
    sum_xg = n * (second - torch.outer(fit_mean, mean)) @ precision
    value = stein_kl(sum_x, sum_g, n * second, sum_xg, n, 1.0)
    exact = ms.diagnostics.gaussian_kl_from_moments(fit_mean, fit_cov, mean, cov)
    assert value == pytest.approx(exact, rel=0.05)
    # the diagonal form is the sum of the diagonal terms
    diagonal = stein_kl(sum_x, sum_g, n * second.diagonal(), sum_xg.diagonal(), n, 1.0)
    assert 0 < diagonal < 2 * value


@pytest.mark.parametrize(
    "make",
    [
        lambda: ms.samplers.PSGLD(eta=0.01),
        lambda: ms.samplers.SGNHT(eta=0.1, multivariate=True),
        lambda: ms.samplers.cyclical_sghmc(eta=0.2, total_steps=800, n_cycles=4),
        lambda: ms.NNSGHMC(eta=0.1, compile=False),
        lambda: ms.load_sampler("toy_gaussian"),
    ],
    ids=["psgld", "msgnht", "csghmc", "nnsghmc-new", "nnsghmc-loaded"],
)
def test_every_sampler_adapts(make):
    target, mean, cov = _gaussian()
    sampler = make()
    result = ms.sample(sampler, target, 8, 800, burn_in=300, seed=0, progress=False, adapt=True)
    adapted = result.adapted
    assert math.isfinite(adapted.eta) and adapted.eta > 0
    assert result.final_state.eta == adapted.eta
    assert result.theta.shape[1:] == (8, D) and bool(torch.isfinite(result.theta).all())
    untrained = isinstance(sampler, ms.NNSGHMC) and sampler.training  # poor at any step
    if not untrained:
        assert _kl(result, mean, cov) < 1.0
    if isinstance(sampler, ms.samplers.SGNHT):
        assert adapted.friction_name == "diffusion"
    if isinstance(sampler.schedule, ms.schedules.CyclicalCosine):
        # constant steps were tried; the base step makes the schedule's mean step the choice
        assert 0.2 < adapted.schedule_scale < 0.6
        assert adapted.sampler.schedule is sampler.schedule
    else:
        assert adapted.schedule_scale == 1.0
    if isinstance(sampler, ms.NNSGHMC):
        assert adapted.friction is None  # its nets give the friction


def test_a_bayesian_model_adapts_by_the_chains_alone_and_with_few_chains():
    x, y = _logistic_data(100, 0)
    model = ms.BayesianModel(torch.nn.Linear(2, 1), (x, y), likelihood="bernoulli", batch_size=25)
    sampler = ms.samplers.SGHMC(lr=0.5)  # eta = sqrt(lr / N)
    result = ms.sample(sampler, model, 3, 500, burn_in=200, seed=0, progress=False, adapt=True)
    assert result.adapted.criterion == "stein"
    assert result.adapted.start_eta == pytest.approx(math.sqrt(0.5 / 100))
    assert {t.chains for t in result.adapted.trials} == {3}  # every group runs all 3 chains
    assert "adapted eta=" in str(result.adapted)


def test_every_step_diverging_is_one_clear_error():
    target = ms.EnergyTarget(lambda x: (x * x).sum(-1) * float("nan"), dim=2)
    with pytest.raises(ms.NonFiniteError, match="adapt: every step tried diverged"):
        ms.sample(ms.samplers.SGLD(eta=0.1), target, 4, 300, burn_in=200, progress=False,
                  adapt=True)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"adapt": True, "burn_in": 50}, "adapt needs burn_in >= 100"),
        ({"adapt": "yes"}, "adapt must be True, False or a metasampler.Adapt"),
        ({"adapt": True, "sampler": ms.samplers.SGDMomentum(eta=0.1)}, "temperature > 0"),
        ({"adapt": True, "sampler": ms.samplers.HMC(eta=0.1)}, "HMC adapts its own step"),
        (
            {"adapt": Adapt(validation=(torch.zeros(3, 2), torch.zeros(3)))},
            "needs a target with log_likelihood",
        ),
    ],
)
def test_bad_adapt_arguments_name_what_is_wrong(kwargs, message):
    target, _, _ = _gaussian()
    arguments = {"sampler": ms.samplers.SGLD(eta=0.1), "burn_in": 200, **kwargs}
    sampler = arguments.pop("sampler")
    with pytest.raises(ValueError, match=message):
        ms.sample(sampler, target, 4, 400, progress=False, **arguments)


def test_one_chain_adapts_by_held_out_data_but_not_by_the_chains_alone():
    # The chains-alone criterion compares the chains' spread with the target's: one chain
    # has none to compare (it would choose a step that does not move), so it is an error.
    x, y = _logistic_data(100, 0)
    model = ms.BayesianModel(torch.nn.Linear(2, 1), (x, y), likelihood="bernoulli", batch_size=25)
    with pytest.raises(ValueError, match="needs n_chains >= 2"):
        ms.sample(ms.samplers.SGLD(lr=0.5), model, 1, 400, burn_in=200, adapt=True,
                  progress=False)  # fmt: skip
    held_out = Adapt(validation=_logistic_data(50, 1))
    result = ms.sample(ms.samplers.SGLD(lr=0.5), model, 1, 400, burn_in=200, adapt=held_out,
                       seed=0, progress=False)  # fmt: skip
    assert result.theta.shape[1] == 1 and result.adapted.criterion == "validation"


def _classifier_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()  # labels 0, 1, 2


@pytest.mark.parametrize(
    ("validation", "message"),
    [
        ((torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)), r"inputs x of shape \(5, 3\)"),
        ((torch.zeros(5, 2), torch.zeros(5)), "integer labels"),
        ((torch.zeros(5, 2), torch.full((5,), 3)), r"labels y must be in \[0, 2\]"),
        ((torch.full((5, 2), float("nan")), torch.zeros(5, dtype=torch.long)), "non-finite"),
    ],
)
def test_held_out_data_is_checked_as_the_model_s_own_data(validation, message):
    x, y = _classifier_data(100)
    model = ms.BayesianModel(torch.nn.Linear(2, 3), (x, y), likelihood="categorical",
                             batch_size=25)  # fmt: skip
    with pytest.raises(ValueError, match=r"Adapt\(validation\).*" + message):
        ms.sample(ms.samplers.SGLD(lr=0.5), model, 4, 400, burn_in=200,
                  adapt=Adapt(validation=validation), progress=False)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"validation": torch.zeros(3)}, r"must be a pair \(x, y\) of tensors"),
        ({"validation": (torch.zeros(3, 2), torch.zeros(4))}, "same first dimension"),
        ({"span": 4.0}, "span=...\\) must be a finite number >= 16"),
        ({"friction": 1}, "friction=...\\) must be True or False"),
        ({"max_validation": 0}, "max_validation=...\\) must be an integer >= 1"),
        ({"extra_cost": 0.0}, "extra_cost=...\\) must be a number > 0"),
        ({"extra_cost": float("nan")}, "extra_cost=...\\) must be a number > 0"),
        ({"extra_cost": True}, "extra_cost=...\\) must be a number > 0"),
    ],
)
def test_bad_adapt_options_name_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Adapt(**kwargs)


def test_heat_is_the_kl_of_the_kinetic_temperature_and_unbiased_at_the_target():
    from metasampler.adapt.criteria import HeatStats

    g = torch.Generator().manual_seed(0)

    def heat(t: float, replicates: int = 200) -> list[float]:
        values = []
        for _ in range(replicates):
            stats = HeatStats(n_blocks=8, per_block=2, temperature=1.0)
            for _ in range(50):  # 16 chains, 20 coordinates, momenta N(0, t)
                stats.update(math.sqrt(t) * torch.randn(16, 20, generator=g))
            values.append(stats.score()[0])
        return values

    at_target = heat(1.0)
    mean = sum(at_target) / len(at_target)
    se = math.sqrt(sum((v - mean) ** 2 for v in at_target) / len(at_target) ** 2)
    assert abs(mean) < 3 * se  # no heat at the target: the estimate's noise is removed
    hot = heat(1.2, replicates=20)
    assert sum(hot) / len(hot) == pytest.approx(20 * 0.2**2 / 4, rel=0.15)


def test_a_lower_friction_that_runs_hotter_is_not_taken():
    """On the paper's toy Gaussian with gradient noise N(0, 1), halving SGHMC's friction
    mixes faster in a trial but heats the kept chains (its KL at 12,000 steps is 40 %
    higher, speed/bench_adapt.py): the friction round measures that heat, and a lower
    friction that scores clearly better is still refused where its momenta run hotter."""
    from metasampler.adapt.choice import chosen_friction
    from metasampler.adapt.groups import Group
    from tasks.toy import paper_test_gaussian

    task = paper_test_gaussian(seed=0)
    result = ms.sample(
        ms.samplers.SGHMC(eta=0.07, friction=1.0), task.target(grad_noise_std=1.0), 50, 4000,
        burn_in=2000, init=lambda gen: 6.0 * torch.rand((50, task.dim), generator=gen),
        seed=0, progress=False, adapt=True,
    )  # fmt: skip
    friction_round = [t for t in result.adapted.trials if t.kind == "friction"]
    assert [t.friction for t in friction_round] == [0.5, 1.0, 2.0]
    assert friction_round[0].heat > friction_round[1].heat  # measured: the lower runs hotter

    def groups(lower_heat: float) -> list:
        """A round where friction 0.5 scores clearly best (every block 0.3 lower)."""
        made = []
        for friction, score, heat in ((0.5, 1.0, lower_heat), (1.0, 1.3, 0.2), (2.0, 1.6, 0.1)):
            group = Group(0.1, friction, None, None, None, None, score=score, heat=heat)
            group.leave_out = [score + 0.01 * j for j in range(8)]
            group.heat_leave_out = [heat] * 8
            made.append(group)
        return made

    assert chosen_friction(groups(lower_heat=0.5), 1.0) == 1.0  # hotter: refused
    assert chosen_friction(groups(lower_heat=0.1), 1.0) == 0.5  # no hotter: taken


def test_momenta_are_drawn_afresh_so_the_trials_heat_does_not_reach_the_kept_run(monkeypatch):
    """SGHMC with a friction so low that its momenta keep their energy through the burn-in:
    the trial rounds' steps (up to 256 times the start) leave the momenta hot unless they
    are drawn afresh from N(0, T) for each round and for the chosen kernel. (The bracket
    runs at the start's friction here: the friction it raises from the chains alone would
    also keep the heat out.)"""
    from metasampler.adapt import burn_in, rounds

    monkeypatch.setattr(burn_in, "_BRACKET_MEMORY", 0.0)
    target, _, _ = _gaussian()

    def kinetic_temperatures() -> list[float]:
        temperatures = []
        for seed in range(3):
            result = ms.sample(
                ms.samplers.SGHMC(eta=0.05, friction=0.05), target, 32, 400, burn_in=300,
                seed=seed, progress=False, adapt=ms.Adapt(extra_cost=10.0),  # full-length rounds
            )  # fmt: skip
            temperatures.append(float(result.adapted.state.momentum.square().mean()))
        return temperatures

    assert max(kinetic_temperatures()) < 3.0
    for module in (rounds, burn_in):  # every use of the momenta drawn afresh
        monkeypatch.setattr(module, "refreshed", lambda state, sampler, seed: state)
    assert min(kinetic_temperatures()) > 4.0


def test_a_thermostat_s_momenta_are_not_judged_by_their_kinetic_temperature():
    """(m)SGNHT's thermostat holds its momenta at T whatever the step: on MNIST a step that
    sent its chains to chance level kept them at 1.16 and would have been chosen."""
    target, _, _ = _gaussian()
    result = ms.sample(
        ms.samplers.SGNHT(eta=0.1, multivariate=True), target, 8, 800, burn_in=300, seed=0,
        progress=False, adapt=True,
    )  # fmt: skip
    assert all(t.kinetic_temperature is None and t.heat is None for t in result.adapted.trials)
    sghmc = ms.sample(
        ms.samplers.SGHMC(eta=0.1), target, 8, 800, burn_in=300, seed=0, progress=False,
        adapt=True,
    )  # fmt: skip
    assert all(t.kinetic_temperature is not None for t in sghmc.adapted.trials if not t.error)


def test_only_momenta_with_a_known_stationary_law_are_drawn_afresh():
    from metasampler.adapt.chains import refreshed

    target, _, _ = _gaussian()
    theta = torch.zeros(2000, D)
    hot = ms.samplers.SGHMC(eta=0.1, temperature=2.0).init(theta, target)
    hot.momentum = hot.momentum * 10.0
    fresh = refreshed(hot, ms.samplers.SGHMC(eta=0.1, temperature=2.0), seed=0)
    assert float(fresh.momentum.var()) == pytest.approx(2.0, rel=0.05)
    assert fresh.theta is hot.theta
    learned = ms.NNSGHMC(eta=0.1, compile=False)
    state = learned.init(theta[:4], target)
    assert refreshed(state, learned, seed=0) is state


def test_a_step_whose_momenta_run_further_from_t_than_the_tolerance_is_not_chosen():
    from metasampler.adapt.choice import KINETIC_TOLERANCE, best_group, choose
    from metasampler.adapt.groups import Group

    def group(eta: float, score: float, kinetic: float | None) -> Group:
        g = Group(eta, None, None, None, None, None)  # type: ignore[arg-type]
        g.score, g.leave_out, g.kinetic = score, [score] * 4, kinetic
        return g

    hot, cold = 1.0 + 2 * KINETIC_TOLERANCE, 1.0 - 3 * KINETIC_TOLERANCE
    groups = [group(0.5, 3.0, 1.0), group(1.0, 2.0, 1.05), group(2.0, 1.0, hot)]
    assert best_group(groups).eta == 1.0  # the best score runs hot: the next best is chosen
    assert choose(groups, "eta") == (1.0, False)
    # momenta far colder than T are as far from the target's law: not chosen either
    far_cold = [group(0.5, 3.0, 0.95), group(1.0, 2.0, 0.9), group(2.0, 1.0, cold)]
    assert best_group(far_cold).eta == 1.0
    unmeasured = [group(0.5, 3.0, None), group(1.0, 2.0, None), group(2.0, 1.0, None)]
    assert best_group(unmeasured).eta == 2.0  # the bracket's groups, and samplers without momenta
    all_hot = [group(1.0, 2.0, hot + 0.5), group(2.0, 1.0, hot + 5.0)]
    assert best_group(all_hot).eta == 1.0  # the closest to T, where every group is far from it


@pytest.mark.parametrize("extra_cost", [0.2, 0.4])
def test_adapting_costs_at_most_its_extra_cost(extra_cost):
    """The trial rounds' gradient evaluations (chain-steps) beyond a plain run's stay within
    ``Adapt.extra_cost`` of the plain run's, on a short run where the rounds' full shares of
    the burn-in would cost far more (8 chains, burn-in 150 of 400 steps)."""
    _, mean, cov = _gaussian()
    precision = torch.linalg.inv(cov).float()
    evaluated = [0]

    def energy(x: torch.Tensor) -> torch.Tensor:
        evaluated[0] += x.shape[0] if x.ndim > 1 else 1
        centred = x - mean.float()
        return 0.5 * ((centred @ precision) * centred).sum(-1)

    target = ms.EnergyTarget(energy, dim=D)

    def chain_steps(adapt: ms.Adapt | bool) -> int:
        evaluated[0] = 0
        ms.sample(
            ms.samplers.SGHMC(eta=0.05, friction=1.0), target, 8, 400, burn_in=150, seed=0,
            progress=False, adapt=adapt,
        )  # fmt: skip
        return evaluated[0]

    plain = chain_steps(False)
    adapted = chain_steps(ms.Adapt(extra_cost=extra_cost))
    assert plain <= adapted <= (1 + extra_cost) * plain
    assert adapted > (1 + extra_cost / 2) * plain  # the budget is used, not wasted


def test_the_bracket_runs_fewer_chains_only_where_the_budget_binds():
    """Eight chains per bracket group where the budget allows it (four are noise on the toy
    Gaussian), four where it binds, and every later round on eight."""
    target, _, _ = _gaussian()

    def chains(extra_cost: float) -> dict[str, set[int]]:
        result = ms.sample(
            ms.samplers.SGLD(eta=0.05), target, 8, 400, burn_in=150, seed=0, progress=False,
            adapt=ms.Adapt(extra_cost=extra_cost),
        )  # fmt: skip
        kinds: dict[str, set[int]] = {}
        for trial in result.adapted.trials:
            kinds.setdefault(trial.kind, set()).add(trial.chains)
        return kinds

    assert chains(10.0) == {"bracket": {8}, "step": {8}}
    assert chains(0.4) == {"bracket": {4}, "step": {8}}


def test_on_a_logistic_regression_the_chains_alone_aim_at_the_posterior():
    """An ordinary model whose parameters are read (``tasks.logistic_regression``, the
    README's): adapted from the chains alone, SGLD's kept samples match an HMC reference.
    Held-out NLL, which barely tells the steps apart on such a model, takes a larger step
    whose samples are too wide: the README advises the chains alone for such models."""
    task = logistic_regression()
    mean, cov = task.moments(task.reference(trajectories=600))

    def run(adapt: bool | Adapt) -> ms.SampleResult:
        return ms.sample(
            ms.samplers.SGLD(lr=0.01), task.model, 8, 1500, burn_in=500, seed=0,
            progress=False, adapt=adapt,
        )  # fmt: skip

    alone, held_out = run(True), run(Adapt(validation=task.held_out))
    assert _kl(alone, mean, cov) < 0.1
    assert held_out.adapted.eta > 1.5 * alone.adapted.eta
    assert _kl(held_out, mean, cov) > 2 * _kl(alone, mean, cov)


def test_an_underdamped_momentum_sampler_adapts_from_the_chains_alone_from_a_far_start():
    """SGHMC at its default friction on a stiff regression from the module's
    initialisation: the momenta keep the start's energy for longer than a bracket group
    runs, so at the start's friction no step's chains settle in it and a step too small to
    move them scores best. The bracket raises the friction where the momenta would remember
    longer than a quarter of its window, and the rounds after it start from that friction;
    the search then ends at a kernel that samples."""
    task = linear_regression(n=300, scales=(1.0, 1.0, 1.0), prior_std=10.0, batch_size=100)
    start = ms.samplers.SGHMC(lr=0.01)  # friction 1: a memory of about 170 steps at this step
    for seed in (1, 4):
        result = ms.sample(
            start, task.model, 8, 1500, burn_in=500, seed=seed, progress=False, adapt=True
        )
        assert result.adapted.eta > result.adapted.start_eta / 8
        assert result.adapted.friction > 10.0
        assert _kl(result, task.mean, task.cov) < 0.5  # plain runs at friction 1: 30 or more
