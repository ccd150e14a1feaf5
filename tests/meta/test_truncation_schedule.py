"""The truncation schedule of meta-training (issue #11): in-chain pool over a segment,
accumulated meta-gradient of a segment, per-loss steps, continuing chains and exact resume."""

from __future__ import annotations

import pytest
import torch
from test_meta_training import small_settings

from experiments.run_config import load_config
from metasampler.config import ConfigError, TrainConfig
from metasampler.learned import NNSGHMC
from metasampler.meta import trainer as trainer_module
from metasampler.meta.losses import InChainCollector
from metasampler.meta.schedule import TruncationSchedule
from metasampler.meta.stein import stein_score
from metasampler.meta.trainer import MetaTrainer
from metasampler.meta.unroll import unroll_window
from metasampler.sampling import make_generator
from tasks.registry import ProblemFamily

PAPER = dict(accumulate=True, step_per_loss=True, continue_chains=True, in_chain_span="segment")


def settings(**overrides) -> TrainConfig:
    """``small_settings`` resized so a segment spans several windows and in-chain samples."""
    resized = dict(
        epochs=2,
        steps_per_sub_epoch=24,
        n_chains=8,
        unroll=5,
        in_chain_burn_in=6,
        in_chain_thinning=3,
        in_chain_chains=3,
        replay_prob=0.0,
        checkpoint_every=1,
        adam_betas=[0.5, 0.99],
        grad_clip=0.0,
    )
    return small_settings(**{**resized, **overrides})


def family(dim: int = 3, dtype: torch.dtype = torch.float32) -> ProblemFamily:
    cfg = load_config(
        None, ["task.kind=gaussian", f"task.dim={dim}", "task.cov=diagonal", "task.mean=1.0"]
    )
    return ProblemFamily(cfg.task, dtype=dtype)


def new_sampler(seed: int = 0) -> NNSGHMC:
    return NNSGHMC(eta=0.02, q_hidden=(8,), d_hidden=(8,), seed=seed)


def test_in_chain_pool_spans_the_segment_and_each_loss_gets_its_own_step(monkeypatch):
    s = settings(**PAPER)
    pools: list[tuple[list[int], int, int]] = []

    class Recording(InChainCollector):
        def loss(self, *args, **kwargs):
            theta, _ = self.samples()
            pools.append((self.steps, theta.shape[0], self.n_samples))
            return super().loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "InChainCollector", Recording)
    trainer = MetaTrainer(new_sampler(), family(), s, progress=False)
    steps_taken = []
    real_step = trainer.outer.step
    monkeypatch.setattr(trainer.outer, "step", lambda g: steps_taken.append(1) or real_step(g))
    trainer.train()
    # Positions after steps 1 .. segment-1 (the last one is paired with its gradient in the
    # next segment), counted within each segment even when chains continue (sub-epoch 2).
    expected = [
        t
        for t in range(1, s.steps_per_sub_epoch)
        if t > s.in_chain_burn_in and (t - s.in_chain_burn_in) % s.in_chain_thinning == 0
    ]
    assert len(expected) >= 5 and expected[-1] > 2 * s.unroll  # spans several windows
    assert len(pools) == s.epochs * s.sub_epochs  # one in-chain estimate per segment
    for steps, n_chains, n_samples in pools:
        assert steps == expected
        assert n_chains == s.in_chain_chains
        assert n_samples == len(expected) * s.in_chain_chains
    assert len(steps_taken) == 2 * s.epochs * s.sub_epochs  # cross-chain step + in-chain step


@pytest.mark.parametrize("continuing, fresh_per_epoch", [(True, 1), (False, 2)])
def test_continuing_chains_start_fresh_only_at_each_epoch(monkeypatch, continuing, fresh_per_epoch):
    trainer = MetaTrainer(
        new_sampler(), family(), settings(continue_chains=continuing), progress=False
    )
    starts = []
    real = trainer._initial_state
    monkeypatch.setattr(trainer, "_initial_state", lambda p: starts.append(1) or real(p))
    trainer.train()
    assert len(starts) == 2 * fresh_per_epoch


def test_accumulated_segment_gradient_is_the_sum_of_its_windows_gradients(monkeypatch):
    """Finite differences of each window's surrogate (its start state and random stream
    fixed, the stop-gradient directions fixed) summed over the windows equal the gradient of
    the one step taken after the segment."""
    torch.manual_seed(0)
    dim, n_chains, segment, window = 2, 6, 6, 2
    s = settings(
        epochs=1,
        sub_epochs=1,
        steps_per_sub_epoch=segment,
        unroll=window,
        n_chains=n_chains,
        cross_chain_every=1,
        in_chain_weight=0.0,
        accumulate=True,
        step_per_loss=True,
    )
    problems = family(dim, torch.float64)
    target = problems(1, None).target

    def build() -> NNSGHMC:
        return NNSGHMC(eta=0.05, q_hidden=(5,), d_hidden=(4,), seed=3).double()

    trainer = MetaTrainer(build(), problems, s, seed=11, progress=False)
    applied = []
    monkeypatch.setattr(trainer.outer, "step", lambda g: applied.append(g) or True)
    trainer.train()
    assert len(applied) == 1  # one step for the whole segment

    # Reference: replay the same chains (same seed and stream) window by window.
    sampler = build()
    generator = make_generator(11)
    init = problems(1, generator).init(n_chains, generator)
    state = sampler.init(init, target, generator)
    starts, directions, n_slices = [], [], 0
    for _ in range(segment // window):
        starts.append((state.detach(), generator.get_state()))
        with torch.no_grad():
            state, samples = unroll_window(
                sampler, state, target, generator, length=window, segment_start=0,
                cross_chain_every=1,
            )  # fmt: skip
        kwargs = {"bandwidth_factor": s.stein_bandwidth_factor, "ridge": s.stein_ridge}
        directions.append(
            [
                g + stein_score(p, **kwargs)
                for p, g in zip(samples.positions, samples.grads, strict=True)
            ]
        )
        n_slices += len(samples.positions)

    def segment_surrogate() -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64)
        for (start, rng), vs in zip(starts, directions, strict=True):
            generator.set_state(rng)
            _, samples = unroll_window(
                sampler, start, target, generator, length=window, segment_start=0,
                cross_chain_every=1,
            )  # fmt: skip
            for v, theta in zip(vs, samples.positions, strict=True):
                total = total + (v * theta).sum(1).mean()
        return total / n_slices

    # The windows' surrogates summed and differentiated at once (the windows replayed from
    # their detached starts) give the one step the segment applied.
    params = list(sampler.parameters())
    expected = torch.autograd.grad(segment_surrogate(), params, allow_unused=True)
    moved = 0
    for got, want in zip(applied[0], expected, strict=True):
        if want is None:
            assert got is None or not got.any()
            continue
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)
        moved += bool(want.abs().max() > 1e-6)
    assert moved >= 3  # the parameters do move the chains


EPOCH_POOL = {**PAPER, "in_chain_span": "epoch"}


def test_in_chain_pool_over_the_epoch_keeps_its_chains_and_earlier_samples(monkeypatch):
    s = settings(**EPOCH_POOL, sub_epochs=3)
    seen: list[tuple[list[int], int, int]] = []  # (chain subset, earlier, collected) per loss

    class Recording(InChainCollector):
        def loss(self, *args, **kwargs):
            seen.append((self.chains.tolist(), self.n_earlier, self.n_samples))
            return super().loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "InChainCollector", Recording)
    MetaTrainer(new_sampler(), family(), s, progress=False).train()
    per_segment = seen[0][2]
    assert per_segment > 0 and len(seen) == s.epochs * s.sub_epochs
    for epoch in range(s.epochs):
        losses = seen[epoch * s.sub_epochs : (epoch + 1) * s.sub_epochs]
        assert [n for _, n, _ in losses] == [sub * per_segment for sub in range(s.sub_epochs)]
        assert len({tuple(chains) for chains, _, _ in losses}) == 1  # one subset per epoch
    with pytest.raises(ConfigError, match="in_chain_span=epoch needs train.continue_chains"):
        load_config(None, ["train.in_chain_span=epoch", "train.accumulate=true"])


def test_in_chain_loss_scores_the_collected_samples_against_the_whole_pool():
    """The Stein estimate of a loss covers the retired samples; the gradient does not."""
    gen = torch.Generator().manual_seed(0)
    collector = InChainCollector(4, n_select=2, generator=gen)
    first = torch.randn(3, 4, 2, generator=gen)  # (steps, chains, D)
    later = torch.randn(2, 4, 2, generator=gen).requires_grad_()
    grads = torch.randn(5, 4, 2, generator=gen)
    for t in range(3):
        collector.collect(t + 1, first[t], grads[t])
    collector.retire()
    assert collector.n_samples == 0 and collector.n_earlier == 6
    for t in range(2):
        collector.collect(t + 4, later[t], grads[3 + t])
    loss = collector.loss(ridge=0.05)
    chains = collector.chains
    pooled = torch.cat([first[:, chains].transpose(0, 1), later[:, chains].transpose(0, 1)], 1)
    score = stein_score(pooled.detach().reshape(-1, 2), ridge=0.05).reshape(2, 5, 2)[:, 3:]
    direction = grads[3:, chains].transpose(0, 1) + score
    manual = (direction * later[:, chains].transpose(0, 1)).sum() / 4
    assert torch.allclose(loss, manual)
    (grad,) = torch.autograd.grad(loss, later)
    assert torch.allclose(grad[:, chains], direction.transpose(0, 1) / 4)
    alone = InChainCollector(4, n_select=2, generator=torch.Generator().manual_seed(0))
    for t in range(2):
        alone.collect(t + 4, later[t], grads[3 + t])
    assert not torch.allclose(alone.loss(ridge=0.05), loss)  # the earlier samples matter
    collector.select_chains(gen)
    assert collector.n_earlier == 0


def test_exported_nets_are_the_mean_of_the_last_epochs_nets(monkeypatch):
    s = settings(epochs=4, average_last=2)
    trainer = MetaTrainer(new_sampler(), family(), s, progress=False)
    snapshots = {}
    real_end = trainer._end_epoch

    def record(epoch, losses):
        snapshots[epoch] = {k: v.clone() for k, v in trainer.sampler.named_parameters()}
        real_end(epoch, losses)

    monkeypatch.setattr(trainer, "_end_epoch", record)
    trainer.train()
    final = dict(trainer.final_sampler().named_parameters())
    for name, value in final.items():
        mean = (snapshots[3][name] + snapshots[4][name]) / 2
        assert torch.allclose(value, mean, atol=1e-7), name
        assert not torch.allclose(snapshots[3][name], snapshots[4][name])  # it did move
    unaveraged = MetaTrainer(new_sampler(), family(), settings(epochs=1), progress=False)
    assert unaveraged.final_sampler() is unaveraged.sampler
    with pytest.raises(ConfigError, match="average_last"):
        load_config(None, ["train.epochs=3", "train.average_last=4"])


@pytest.mark.parametrize(
    "schedule",
    [
        PAPER,
        EPOCH_POOL,
        dict(step_per_loss=True),
        dict(continue_chains=True),
        dict(step_scale_range=[0.5, 2.0]),
    ],
    ids=str,
)
def test_resume_is_bit_exact_with_the_new_schedules(tmp_path, schedule):
    full = settings(epochs=3, **schedule)
    straight = MetaTrainer(new_sampler(), family(), full, seed=5, progress=False)
    straight.train()
    run_dir = tmp_path / "run"
    first = MetaTrainer(
        new_sampler(), family(), settings(epochs=2, **schedule), run_dir=run_dir, seed=5,
        progress=False,
    )  # fmt: skip
    first.train()
    resumed = MetaTrainer(new_sampler(7), family(), full, run_dir=run_dir, seed=9, progress=False)
    assert resumed.resume() == 2
    resumed.train()
    assert resumed.history.loss == straight.history.loss
    for (name, a), b in zip(
        straight.sampler.state_dict().items(), resumed.sampler.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_resume_is_bit_exact_when_continuing_chains_carry_finite_difference_secants(tmp_path):
    # The paper's sampler with finite-difference Gamma: continuing chains carry the secants'
    # cache of net outputs across an epoch's sub-epochs; a run resumed at an epoch's end must
    # still reproduce the uninterrupted one.
    def sampler(seed: int = 0) -> NNSGHMC:
        return NNSGHMC(
            eta=0.02, q_hidden=(8,), d_hidden=(8,), seed=seed, curl_input="momentum",
            thermostat=False, gamma="finite_difference",
        )  # fmt: skip

    full = settings(epochs=3, **PAPER)
    straight = MetaTrainer(sampler(), family(), full, seed=5, progress=False)
    straight.train()
    run_dir = tmp_path / "run"
    first = MetaTrainer(
        sampler(), family(), settings(epochs=2, **PAPER), run_dir=run_dir, seed=5, progress=False
    )
    first.train()
    resumed = MetaTrainer(sampler(7), family(), full, run_dir=run_dir, seed=9, progress=False)
    assert resumed.resume() == 2
    resumed.train()
    assert resumed.history.loss == straight.history.loss


def test_an_interrupted_averaging_run_resumes_to_the_same_exported_nets(tmp_path):
    full = settings(epochs=3, average_last=2)
    straight = MetaTrainer(new_sampler(), family(), full, seed=5, progress=False)
    straight.train()
    run_dir = tmp_path / "run"
    first = MetaTrainer(new_sampler(), family(), full, run_dir=run_dir, seed=5, progress=False)
    real_problems = first.problems

    def stop_at_epoch_3(epoch, generator):
        if epoch == 3:
            raise KeyboardInterrupt
        return real_problems(epoch, generator)

    first.problems = stop_at_epoch_3
    with pytest.raises(KeyboardInterrupt):
        first.train()  # checkpoints after epochs 1 and 2, in the window from epoch 2
    resumed = MetaTrainer(new_sampler(7), family(), full, run_dir=run_dir, seed=9, progress=False)
    assert resumed.resume() == 2
    resumed.train()
    for (name, a), b in zip(
        straight.final_sampler().state_dict().items(),
        resumed.final_sampler().state_dict().values(),
        strict=True,
    ):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("continuing", [True, False])
def test_each_epoch_samples_at_a_step_drawn_from_the_range(monkeypatch, continuing):
    sampler = new_sampler()
    s = settings(epochs=6, continue_chains=continuing, step_scale_range=[0.5, 2.0])
    trainer = MetaTrainer(sampler, family(), s, progress=False)
    used: list[tuple[int, float]] = []  # (epoch, eta of a step)
    real_step = sampler._step
    monkeypatch.setattr(
        sampler, "_step", lambda st, tg, eta, *a: used.append((trainer.epoch + 1, eta))
        or real_step(st, tg, eta, *a)
    )  # fmt: skip
    trainer.train()
    per_epoch = {e: {eta for epoch, eta in used if epoch == e} for e in range(1, s.epochs + 1)}
    assert all(len(etas) == 1 for etas in per_epoch.values())  # one step for a whole epoch
    etas = [etas.pop() for etas in per_epoch.values()]
    assert all(0.5 * 0.02 <= eta <= 2.0 * 0.02 for eta in etas)
    assert len(set(etas)) == s.epochs  # a new draw every epoch
    assert min(etas) < 0.02 < max(etas)  # on both sides of the sampler's step
    assert sampler.eta == 0.02  # the exported sampler keeps its training step


def test_without_a_step_range_every_epoch_samples_at_the_sampler_step(monkeypatch):
    sampler = new_sampler()
    trainer = MetaTrainer(sampler, family(), settings(epochs=2), progress=False)
    used: list[float] = []
    real_step = sampler._step
    monkeypatch.setattr(
        sampler, "_step", lambda st, tg, eta, *a: used.append(eta) or real_step(st, tg, eta, *a)
    )
    trainer.train()
    assert used and set(used) == {0.02}


def test_schedule_and_config_reject_a_segment_pool_with_steps_inside_the_segment():
    with pytest.raises(ConfigError, match="in_chain_span=segment needs train.accumulate"):
        load_config(None, ["train.in_chain_span=segment"])
    with pytest.raises(ConfigError, match="adam_betas"):
        load_config(None, ["train.adam_betas=[0.5]"])
    for bad in ("[2.0,1.0]", "[0.0,1.0]", "[1.0]"):
        with pytest.raises(ConfigError, match="step_scale_range"):
            load_config(None, [f"train.step_scale_range={bad}"])
    with pytest.raises(ConfigError, match="step_scale_range"):  # also from the Python API
        MetaTrainer(new_sampler(), family(), settings(step_scale_range=[0.0, 1.0]))
    with pytest.raises(ValueError, match="accumulate=True"):
        TruncationSchedule(segment=10, window=5, pool_spans_segment=True)
    assert TruncationSchedule(segment=10, window=4).windows() == [4, 4, 2]
