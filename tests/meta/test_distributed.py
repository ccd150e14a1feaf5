"""Chains sharded across processes (issue #7): two gloo processes on localhost.

One ``torch.multiprocessing.spawn`` of two ranks (module fixture ``ranks``) runs every
scenario in turn and saves what each rank saw; the tests compare that with single-process
references computed here. How the equivalences are arranged:

* **Meta-gradient.** Under torchrun each rank draws its chains' initial positions, momenta
  and noise from its own stream, ``rank_seed(seed, rank)``; problems and the in-chain chain
  subset come from the stream of ``seed`` itself, shared by all ranks. The reference is one
  process holding *all* ``K`` chains: it steps the two blocks of chains with those same two
  streams (the chains of a window do not interact), concatenates them, and computes the
  ordinary single-process :func:`cross_chain_loss` and :class:`InChainCollector` loss on all
  ``K`` chains, then one backward pass. The ranks' all-reduced meta-gradient must equal it.
* **Evaluation.** The reference runs each rank's block of chains with the same stream in one
  process (``metasampler.sample``, samples stored), pools all chains' predictions and computes
  the ensemble / posterior-average metrics once; the sharded ``run_method`` must report the
  same numbers on every rank.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from experiments.run_config import load_config
from metasampler import distributed
from metasampler.benchmark import (
    EvalSet,
    RunningAverage,
    ensemble_log_probs_from_lp,
    metrics_from_log_probs,
    predict_log_probs,
    predictive_entropy,
    run_method,
    synthetic_classification_problem,
)
from metasampler.config import TrainConfig
from metasampler.distributed import (
    all_gather_rows,
    chain_shard,
    failure_guard,
    rank_seed,
    shard_bounds,
    shard_sizes,
)
from metasampler.learned import NNSGHMC
from metasampler.meta.checkpoint import read_checkpoint
from metasampler.meta.losses import InChainCollector, combined_loss, cross_chain_loss
from metasampler.meta.trainer import MetaTrainer, TrainingDivergedError
from metasampler.samplers import SGHMC, SGLD
from metasampler.sampling import make_generator, sample
from tasks.registry import Problem, ProblemFamily

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2
SEED = 11
STEIN = {"bandwidth_factor": 0.5, "ridge": 0.04}


# -- shared set-ups ---------------------------------------------------------------------------
def toy_family() -> ProblemFamily:
    cfg = load_config(
        None, ["task.kind=gaussian", "task.dim=3", "task.cov=diagonal", "task.grad_noise_std=1.0"]
    )
    return ProblemFamily(cfg.task)


def one_window(n_chains: int, **overrides) -> TrainConfig:
    """One epoch of one 8-step window: cross-chain every 2 steps, in-chain from step 3."""
    base = dict(
        epochs=1,
        sub_epochs=1,
        steps_per_sub_epoch=8,
        unroll=8,
        n_chains=n_chains,
        cross_chain_every=2,
        in_chain_burn_in=2,
        in_chain_thinning=2,
        in_chain_chains=3,
        replay_prob=0.0,
        grad_clip=0.0,  # compare raw gradients
        eval_every=0,
        checkpoint_every=1,
    )
    base.update(overrides)
    return TrainConfig(**base)


def new_sampler() -> NNSGHMC:
    return NNSGHMC(eta=0.05, q_hidden=(6,), d_hidden=(6,), seed=0)


def classification():
    return synthetic_classification_problem(
        n_train=120, n_val=20, n_test=60, n_ood=30, n_features=4, hidden=[6], batch_size=30
    )


EVAL_BUDGET = dict(n_chains=5, n_steps=24, burn_in=8, thin=4, eval_every=8)


class Poisoned:
    """A target that fails on one rank at its ``at``-th evaluation: NaN gradients or an error."""

    def __init__(self, inner, bad_rank: int, at: int, how: str) -> None:
        self.inner, self.bad, self.at, self.how, self.calls = inner, bad_rank, at, how, 0
        self.dim, self.n_data = inner.dim, inner.n_data

    def evaluate(self, theta, generator=None, create_graph=False):
        import torch.distributed as dist

        self.calls += 1
        ev = self.inner.evaluate(theta, generator, create_graph=create_graph)
        if dist.get_rank() == self.bad and self.calls >= self.at:
            if self.how == "raise":
                raise RuntimeError("simulated failure on this rank")
            ev.grad = ev.grad * float("nan")
        return ev


def poisoned_family(how: str):
    base = toy_family()(0, torch.Generator())

    def problems(epoch: int, generator: torch.Generator) -> Problem:
        return Problem(Poisoned(base.target, 1, 4, how), base.init, None, "poisoned")

    return problems


# -- the ranks --------------------------------------------------------------------------------
def _scenarios(rank: int, tmp: Path) -> dict:
    out: dict = {}

    def record(name, fn):
        start = time.perf_counter()
        try:
            out[name] = {"value": fn()}
        except Exception as err:
            out[name] = {"error": type(err).__name__, "message": str(err)}
            out[name]["traceback"] = traceback.format_exc()
        out[name]["seconds"] = time.perf_counter() - start

    def gradient(n_chains):
        sampler = new_sampler()
        trainer = MetaTrainer(
            sampler, toy_family(), one_window(n_chains), seed=SEED, progress=False
        )
        trainer.train()
        return {
            "grads": {n: p.grad.clone() for n, p in sampler.named_parameters()},
            "params": {n: p.detach().clone() for n, p in sampler.named_parameters()},
            "loss": trainer.history.loss,
        }

    record("gradient_even", lambda: gradient(6))
    record("gradient_uneven", lambda: gradient(5))

    def resume():
        settings = one_window(
            6, epochs=3, sub_epochs=2, steps_per_sub_epoch=12, unroll=6, replay_prob=0.5
        )
        straight = MetaTrainer(new_sampler(), toy_family(), settings, seed=SEED, progress=False)
        straight.train()
        run_dir = tmp / "resume_run"
        first = MetaTrainer(
            new_sampler(),
            toy_family(),
            one_window(
                6, epochs=2, sub_epochs=2, steps_per_sub_epoch=12, unroll=6, replay_prob=0.5
            ),
            run_dir=run_dir,
            seed=SEED,
            progress=False,
        )
        first.train()
        again = MetaTrainer(
            new_sampler(), toy_family(), settings, run_dir=run_dir, seed=SEED, progress=False
        )
        done = again.resume()
        again.train()
        return {
            "done": done,
            "straight": straight.history.loss,
            "resumed": again.history.loss,
            "same_params": all(
                torch.equal(a, b)
                for a, b in zip(
                    straight.sampler.parameters(), again.sampler.parameters(), strict=True
                )
            ),
        }

    record("resume", resume)

    def diverging(how):
        trainer = MetaTrainer(
            new_sampler(), poisoned_family(how), one_window(6), seed=SEED, progress=False
        )
        trainer.train()

    record("nan_chain", lambda: diverging("nan"))
    record("exception", lambda: diverging("raise"))

    def nan_loss():
        from metasampler.meta import update as update_module

        real = update_module.sharded_cross_chain_loss

        def poisoned(*args, **kwargs):
            value = real(*args, **kwargs)
            return value * float("nan") if rank == 1 else value

        update_module.sharded_cross_chain_loss = poisoned
        try:
            MetaTrainer(
                new_sampler(), toy_family(), one_window(6), seed=SEED, progress=False
            ).train()
        finally:
            update_module.sharded_cross_chain_loss = real

    record("nan_loss", nan_loss)
    record(
        "paper_schedule",
        lambda: MetaTrainer(new_sampler(), toy_family(), one_window(6, continue_chains=True)),
    )

    def evaluation():
        problem = classification()
        data = problem.data
        result = run_method(
            SGHMC(lr=0.02, friction=1.0),
            problem.target,
            problem.init,
            main=EvalSet(data.x_test, data.y_test),
            extra={"ood": EvalSet(data.ood_x)},
            seed=3,
            **EVAL_BUDGET,
        )
        return {"final": result.final, "curves": result.curves}

    record("evaluation", evaluation)

    def evaluation_diverges():
        problem = classification()
        data = problem.data
        lr = 1e6 if rank == 1 else 0.02  # rank 1's chains blow up
        result = run_method(
            SGLD(lr=lr),
            problem.target,
            problem.init,
            main=EvalSet(data.x_test, data.y_test),
            seed=3,
            **EVAL_BUDGET,
        )
        return {"diverged_at": result.diverged_at, "message": result.message}

    record("evaluation_diverges", evaluation_diverges)

    def guard():
        with failure_guard("testing the guard"):
            if rank == 0:
                raise ValueError("rank 0 gives up")

    record("guard", guard)

    def gather():
        x = torch.full((rank + 1, 2), float(rank + 1), requires_grad=True)
        everyone = all_gather_rows(x)  # rank 0: 1 row, rank 1: 2 rows
        (everyone * torch.arange(1.0, 4.0)[:, None]).sum().backward()
        return {"everyone": everyone.detach(), "grad": x.grad}

    record("gather", gather)
    out["tmp"] = str(tmp)
    return out


def _rank_main(rank: int, port: int, tmp: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),  # a hang fails the test instead of blocking it
    )
    try:
        results = _scenarios(rank, Path(tmp))
    finally:
        distributed.shutdown()  # destroys the group, draining gloo's worker threads first
    torch.save(results, Path(tmp) / f"rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank_main, args=(_free_port(), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _value(result: dict) -> dict:
    assert "error" not in result, result.get("traceback")
    return result["value"]


# -- single-process pieces ------------------------------------------------------------------
def test_shards_and_seeds_without_a_process_group():
    assert shard_sizes(5, 2) == [3, 2] and shard_sizes(6, 4) == [2, 2, 1, 1]
    assert shard_bounds(5, 2, 1) == (3, 5)
    shard = chain_shard(7)  # no process group: everything is local
    assert (shard.start, shard.stop, shard.world, shard.seed(5)) == (0, 7, 1, 5)
    assert rank_seed(0, 0) != rank_seed(0, 1) != rank_seed(1, 0)
    assert rank_seed(3, 1) == rank_seed(3, 1) < 2**63
    x = torch.ones(2, 3)
    assert all_gather_rows(x) is x
    with failure_guard("nothing"):  # no process group: exceptions pass through unchanged
        pass
    with pytest.raises(KeyError), failure_guard("nothing"):
        raise KeyError("plain")


# -- meta-training ----------------------------------------------------------------------------
def _reference_gradient(n_chains: int) -> tuple[dict[str, torch.Tensor], float]:
    """One process holding all chains, stepped with the ranks' streams (module docstring)."""
    settings = one_window(n_chains)
    shared = make_generator(SEED)
    problem = toy_family()(1, shared)
    target = problem.target
    sampler = new_sampler()
    streams = [make_generator(rank_seed(SEED, r)) for r in range(WORLD)]
    states = []
    for stream, size in zip(streams, shard_sizes(n_chains, WORLD), strict=True):
        states.append(sampler.init(problem.init(size, stream), target, stream))
    collector = InChainCollector(
        n_chains,
        burn_in=settings.in_chain_burn_in,
        thinning=settings.in_chain_thinning,
        n_select=settings.in_chain_chains,
        generator=shared,
    )
    positions, grads = [], []
    for _ in range(settings.unroll):
        previous = torch.cat([s.theta for s in states])
        states = [sampler.step(s, target, g) for s, g in zip(states, streams, strict=True)]
        grad = torch.cat([s.grad for s in states])
        t = states[0].step - 1
        if t == 0:  # the window's first position carries no meta-gradient
            continue
        if t % settings.cross_chain_every == 0:
            positions.append(previous)
            grads.append(grad)
        collector.collect(t, previous, grad)
    loss = combined_loss(cross_chain_loss(positions, grads, **STEIN), collector.loss(**STEIN))
    loss.backward()
    return {n: p.grad for n, p in sampler.named_parameters()}, float(loss.detach())


@pytest.mark.parametrize("case, n_chains", [("gradient_even", 6), ("gradient_uneven", 5)])
def test_two_ranks_give_the_meta_gradient_of_one_process_holding_all_chains(ranks, case, n_chains):
    reference, loss = _reference_gradient(n_chains)
    results = [_value(r[case]) for r in ranks]
    for result in results:
        assert result["loss"][0] == pytest.approx(loss, rel=1e-5)
        for name, grad in reference.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=1e-6)
    assert any(g.abs().max() > 1e-3 for g in reference.values())  # a real gradient
    for name, param in results[0]["params"].items():  # the ranks' Adam steps agree exactly
        assert torch.equal(param, results[1]["params"][name]), name


def test_resume_with_the_same_world_size_continues_exactly(ranks):
    for rank in ranks:
        result = _value(rank["resume"])
        assert result["done"] == 2
        assert result["resumed"] == result["straight"] and len(result["straight"]) == 3
        assert result["same_params"]


def test_resume_with_another_world_size_is_refused(ranks):
    run_dir = Path(ranks[0]["tmp"]) / "resume_run"
    # (as many epochs as the checkpoint holds: only the world size differs)
    trainer = MetaTrainer(new_sampler(), toy_family(), one_window(6, epochs=3), run_dir=run_dir)
    with pytest.raises(ValueError, match="written by 2 process.*--nproc_per_node=2"):
        trainer.resume()


def test_schedules_other_than_the_default_are_refused_under_torchrun(ranks):
    for rank in ranks:
        result = rank["paper_schedule"]
        assert result["error"] == "ConfigError"
        assert "only the default truncation schedule" in result["message"]


# -- failures -------------------------------------------------------------------------------
def test_a_diverging_rank_stops_every_rank_with_a_clear_message(ranks):
    bad, good = ranks[1]["nan_chain"], ranks[0]["nan_chain"]
    assert bad["error"] == good["error"] == TrainingDivergedError.__name__
    assert "chain diverged" in bad["message"] and "on rank 1" in bad["message"]
    assert good["message"].startswith("rank 1:") and "chain diverged" in good["message"]
    bad, good = ranks[1]["nan_loss"], ranks[0]["nan_loss"]
    assert bad["error"] == good["error"] == TrainingDivergedError.__name__
    assert "non-finite meta-loss nan (from rank 1)" in good["message"]
    for result in (ranks[0]["nan_chain"], ranks[0]["nan_loss"]):
        assert result["seconds"] < 30  # no rank waited for the collective timeout (60 s)


def test_an_exception_on_one_rank_stops_every_rank(ranks):
    bad, good = ranks[1]["exception"], ranks[0]["exception"]
    assert bad["error"] == "RuntimeError" and "simulated failure" in bad["message"]
    assert good["error"] == "PeerFailureError"
    assert "rank 1 failed while unrolling the chains" in good["message"]
    assert "simulated failure" in good["message"] and good["seconds"] < 30
    assert ranks[0]["guard"]["error"] == "ValueError"
    assert ranks[1]["guard"]["error"] == "PeerFailureError"
    assert "rank 0 failed while testing the guard: ValueError" in ranks[1]["guard"]["message"]


def test_all_gather_rows_keeps_the_local_autograd_path(ranks):
    expected = torch.tensor([[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]])
    for rank, result in enumerate(ranks):
        value = _value(result["gather"])
        torch.testing.assert_close(value["everyone"], expected)
        # d/dx of sum_i (i + 1) * row_i over this rank's own rows only
        rows = [[1.0], [2.0, 3.0]][rank]
        torch.testing.assert_close(value["grad"], torch.tensor(rows)[:, None].expand(-1, 2))


# -- evaluation -------------------------------------------------------------------------------
def test_sharded_evaluation_gives_the_metrics_of_all_chains_pooled(ranks):
    problem = classification()
    data, target = problem.data, problem.target
    budget = EVAL_BUDGET
    final_lp, final_ood, average, ood_average = [], [], RunningAverage(), RunningAverage()
    for rank in range(WORLD):
        size = shard_sizes(budget["n_chains"], WORLD)[rank]
        run = sample(
            SGHMC(lr=0.02, friction=1.0),
            target,
            size,
            budget["n_steps"],
            init=lambda g, size=size: problem.init(size, g),
            burn_in=budget["burn_in"],
            thin=budget["thin"],
            seed=rank_seed(3, rank),
            progress=False,
            dtype=target.dtype,
        )
        for theta in run.theta:
            average.update(predict_log_probs(target, theta, data.x_test))
            ood_average.update(predict_log_probs(target, theta, data.ood_x))
        final_lp.append(predict_log_probs(target, run.final_state.theta, data.x_test))
        final_ood.append(predict_log_probs(target, run.final_state.theta, data.ood_x))
    expected = {}
    ensemble = ensemble_log_probs_from_lp(torch.cat(final_lp))
    for prefix, lp in (("ensemble", ensemble), ("average", average.log_mean())):
        for name, value in metrics_from_log_probs(lp, data.y_test).items():
            expected[f"{prefix}_{name}"] = value
    expected["ood_entropy"] = float(predictive_entropy(ood_average.log_mean()).mean())
    ood_ensemble = ensemble_log_probs_from_lp(torch.cat(final_ood))
    expected["ood_entropy_ensemble"] = float(predictive_entropy(ood_ensemble).mean())
    expected["n_averaged"] = float(average.count)
    for result in ranks:
        final = _value(result["evaluation"])["final"]
        for key, value in expected.items():
            assert final[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    curves = [_value(r["evaluation"])["curves"] for r in ranks]
    assert curves[0][-1]["ensemble_nll"] == pytest.approx(expected["ensemble_nll"], rel=1e-9)
    assert [row["ensemble_nll"] for row in curves[0]] == [row["ensemble_nll"] for row in curves[1]]
    # the chains' own NLLs are pooled over the ranks too
    pooled = torch.cat(final_lp)
    labels = data.y_test.view(1, -1, 1).expand(pooled.shape[0], -1, 1)
    member = float(-pooled.gather(-1, labels).double().mean())
    for rank_curves in curves:
        assert rank_curves[-1]["member_nll"] == pytest.approx(member, rel=1e-9)


def test_a_diverging_rank_ends_the_sharded_evaluation_on_every_rank(ranks):
    results = [_value(r["evaluation_diverges"]) for r in ranks]
    assert results[0] == results[1]  # same step, same message on both ranks
    assert results[0]["diverged_at"] is not None
    assert results[0]["message"].startswith("rank 1: non-finite")
    assert math.isfinite(ranks[0]["evaluation_diverges"]["seconds"])


def test_world_size_one_under_torchrun_variables_changes_nothing(monkeypatch):
    """``init_from_env`` without torchrun's variables is a no-op returning the device."""
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert not distributed.launched_by_torchrun()
    assert distributed.init_from_env("auto", "cpu") == torch.device("cpu")
    assert distributed.world_size() == 1 and distributed.is_main_process()
    assert distributed.choose_backend("auto", "cpu") == "gloo"
    assert distributed.choose_backend("nccl", "cpu") == "nccl"
    with pytest.raises(ValueError, match="backend"):
        distributed.choose_backend("mpi", "cpu")
    assert os.environ.get("RANK") is None


# -- the command-line scripts under torchrun --------------------------------------------------
def _torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.run(
        [*command, f"--nproc_per_node={WORLD}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_torchrun_train_meta_and_evaluate_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    tiny = [
        "train.sub_epochs=1",
        "train.steps_per_sub_epoch=20",
        "train.unroll=10",
        "train.n_chains=6",
        "train.in_chain_burn_in=4",
        "train.in_chain_chains=3",
        "train.eval_every=0",
        "train.checkpoint_every=1",
        "progress=false",
        "threads=1",
        "sampler.q_hidden=[8]",
        "sampler.d_hidden=[8]",
        # (only the default truncation schedule is sharded, not the config's paper schedule)
        "train.accumulate=false",
        "train.step_per_loss=false",
        "train.continue_chains=false",
        "train.in_chain_span=window",
    ]
    config = str(ROOT / "configs" / "toy_gaussian.yaml")
    train = ["train_meta.py", "--config", config, "--run-dir", str(run_dir), *tiny]
    done = _torchrun(*train, "train.epochs=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("sampler saved") == 1  # rank 0 alone reports and writes
    state = read_checkpoint(run_dir / "checkpoint.pt")
    assert state["world_size"] == WORLD and len(state["ranks"]) == WORLD
    resumed = _torchrun(*train, "train.epochs=3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after epoch 2" in resumed.stdout
    config_yaml = tmp_path / "tiny.yaml"
    config_yaml.write_text(
        f"""
name: tiny
seeds: [0]
threads: 1
progress: false
out_dir: {tmp_path / "out"}
synthetic: {{n_train: 120, n_val: 60, n_test: 60, n_ood: 40, n_features: 4, batch_size: 30}}
budget: {{n_chains: 4, n_steps: 12, burn_in: 4, thin: 2, eval_every: 4}}
tune: {{n_steps: 8, burn_in: 4, thin: 2}}
methods:
  nnsghmc: {{enabled: false}}
  nnsghmc_constant: {{enabled: false}}
  sgld: {{lr_grid: [0.3, 0.1]}}
  psgld: {{enabled: false}}
  sghmc: {{enabled: false}}
  msgnht: {{enabled: false}}
  csgld: {{enabled: false}}
  csghmc: {{enabled: false}}
  sgdm: {{enabled: false}}
  adam: {{enabled: false}}
"""
    )
    evaluated = _torchrun("evaluate.py", "--config", str(config_yaml))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "over 2 processes" in evaluated.stdout
    summary = json.loads((tmp_path / "out" / "tiny" / "results.json").read_text())
    assert summary["environment"]["processes"] == WORLD
