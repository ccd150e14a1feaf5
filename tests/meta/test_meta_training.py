"""Meta-training: meta-gradient correctness, learning, exact resume, divergence handling."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import metasampler as ms
from experiments.run_config import load_config
from metasampler.config import ConfigError, TrainConfig
from metasampler.learned import NNSGHMC, NNSGHMCArgs
from metasampler.meta import update as update_module
from metasampler.meta.checkpoint import CheckpointError, read_checkpoint
from metasampler.meta.trainer import MetaTrainer, TrainingDivergedError
from tasks.registry import ProblemFamily
from tasks.toy import gaussian

ROOT = Path(__file__).resolve().parents[2]


def small_settings(**overrides) -> TrainConfig:
    base = dict(
        epochs=4,
        sub_epochs=2,
        steps_per_sub_epoch=20,
        n_chains=10,
        unroll=10,
        cross_chain_every=2,
        in_chain_burn_in=4,
        in_chain_thinning=2,
        in_chain_chains=4,
        replay_prob=0.5,
        replay_capacity=50,
        checkpoint_every=2,
        eval_every=0,
        optimizer_lr=2e-3,
    )
    base.update(overrides)
    return TrainConfig(**base)


def toy_family(dim: int = 4) -> ProblemFamily:
    cfg = load_config(
        None,
        ["task.kind=gaussian", f"task.dim={dim}", "task.cov=diagonal", "task.grad_noise_std=1.0"],
    )
    return ProblemFamily(cfg.task)


def train(
    tmp_path: Path | None, settings: TrainConfig, seed: int = 0, **sampler_options
) -> MetaTrainer:
    sampler = NNSGHMC(eta=0.02, q_hidden=(8,), d_hidden=(8,), seed=seed, **sampler_options)
    trainer = MetaTrainer(
        sampler, toy_family(), settings, run_dir=tmp_path, seed=seed, progress=False
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("options", [{}, {"gamma": "exact", "thermostat": True}])
def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path, options):
    straight = train(None, small_settings(), **options)
    interrupted_dir = tmp_path / "run"
    first = train(interrupted_dir, small_settings(epochs=2), **options)
    assert (interrupted_dir / "checkpoint.pt").is_file()
    # a different init
    sampler = NNSGHMC(eta=0.02, q_hidden=(8,), d_hidden=(8,), seed=123, **options)
    resumed = MetaTrainer(
        sampler, toy_family(), small_settings(), run_dir=interrupted_dir, seed=99, progress=False
    )
    assert resumed.resume() == 2
    assert resumed.history.seconds == first.history.seconds > 0  # training time survives
    resumed.train()
    assert resumed.history.seconds > first.history.seconds
    assert first.history.loss == resumed.history.loss[:2]
    assert resumed.history.loss == straight.history.loss
    for (name, a), b in zip(
        straight.sampler.state_dict().items(), resumed.sampler.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_nan_loss_stops_training_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = update_module.cross_chain_loss

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        value = real(*args, **kwargs)
        return value * float("nan") if calls["n"] > 9 else value  # 2 windows x 2 sub-epochs

    monkeypatch.setattr(update_module, "cross_chain_loss", poisoned)
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDivergedError, match="non-finite meta-loss.*kept at"):
        train(run_dir, small_settings(checkpoint_every=1))
    state = read_checkpoint(run_dir / "checkpoint.pt")
    assert state["epoch"] == 2
    assert all(torch.isfinite(v).all() for v in state["sampler"].values() if v.is_floating_point())


def test_diverging_chain_stops_training_with_a_message(tmp_path):
    sampler = NNSGHMC(eta=50.0, q_hidden=(8,), d_hidden=(8,))  # absurd step
    trainer = MetaTrainer(sampler, toy_family(), small_settings(), run_dir=tmp_path, progress=False)
    with pytest.raises(TrainingDivergedError, match="chain diverged.*no checkpoint"):
        trainer.train()


@pytest.mark.slow
def test_short_training_lowers_loss_and_test_kl():
    task = gaussian(6, mean=3.0, cov="diagonal", seed=2, eig_range=(0.1, 1.0))

    def kl(sampler) -> float:
        result = ms.benchmark.gaussian_benchmark(
            sampler, task, n_chains=50, n_steps=600, kl_at=[600], seed=5
        )
        return result["kl@600"]

    cfg = load_config(
        None,
        [
            "task.kind=gaussian",
            "task.dim=6",
            "task.cov=diagonal",
            "task.seed=2",
            "task.grad_noise_std=1.0",
        ],
    )
    family = ProblemFamily(cfg.task)
    sampler = NNSGHMC(eta=0.02, q_hidden=(16,), d_hidden=(16,), seed=0)
    before = kl(sampler)
    trainer = MetaTrainer(
        sampler,
        family,
        small_settings(
            epochs=12,
            n_chains=30,
            steps_per_sub_epoch=60,
            unroll=15,
            in_chain_burn_in=20,
            optimizer_lr=5e-3,
        ),
        progress=False,
    )
    history = trainer.train()
    after = kl(sampler)
    assert sum(history.loss[-3:]) < sum(history.loss[:3])
    assert after < 0.7 * before, (before, after)


def test_config_rejects_unknown_keys_and_bad_values_naming_them():
    with pytest.raises(ConfigError, match="train.unrol"):
        load_config(None, ["train.unrol=5"])
    with pytest.raises(ConfigError, match="sampler.gamma"):
        load_config(None, ["sampler.gamma=magic"])
    with pytest.raises(ConfigError, match="train.replay_prob"):
        load_config(None, ["train.replay_prob=1.5"])
    with pytest.raises(ConfigError, match="sampler.eta"):
        load_config(None, ["sampler.lr=0.1"])  # both eta and lr given
    cfg = load_config(ROOT / "configs" / "toy_gaussian.yaml", ["train.epochs=3"])
    assert cfg.train.epochs == 3 and cfg.task.kind.value == "paper_train_gaussian"
    for override in ("sampler.d_clamp=0", "sampler.grad_input=raw", "sampler.friction_units=x"):
        with pytest.raises(ConfigError, match=override.split("=")[0]):
            load_config(None, [override])


def test_config_passes_the_sampler_arguments_to_the_sampler():
    from metasampler.meta.build import build_sampler

    overrides = [
        "sampler.curl_input=momentum",
        "sampler.thermostat=false",
        "sampler.gamma=finite_difference",
        "sampler.alpha=0.2",
        "sampler.friction_scale=0.05",
        "sampler.grad_input_scale=3.0",
    ]
    sampler = build_sampler(load_config(None, overrides).sampler)
    assert (sampler.curl_input, sampler.thermostat, sampler.gamma) == (
        "momentum",
        False,
        "finite_difference",
    )
    assert (sampler.alpha, sampler.friction_scale, sampler.grad_input_scale) == (0.2, 0.05, 3.0)
    with pytest.raises(ConfigError, match="sampler: thermostat needs exact Gamma"):
        load_config(None, ["sampler.curl_input=momentum", "sampler.gamma=finite_difference"])
    with pytest.raises(ConfigError, match="sampler: curl_input='stiffness' needs exact Gamma"):
        load_config(None, ["sampler.thermostat=false", "sampler.gamma=finite_difference"])
    # The switches of earlier designs are not config keys.
    for removed in (
        "leapfrog",
        "q_momentum_input",
        "grad_noise_estimate",
        "stiffness_freeze_after",
    ):
        with pytest.raises(ConfigError, match=removed):
            load_config(None, [f"sampler.{removed}=true"])
    default = build_sampler(load_config(None, []).sampler)
    assert default.arguments() == NNSGHMCArgs()
    assert default.uses_stiffness and default.thermostat and default.gamma == "exact"


def test_cli_fails_before_work_on_a_bad_config(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train_meta.py"),
            "--config",
            str(ROOT / "configs" / "toy_gaussian.yaml"),
            "train.epoch=3",
            f"out_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "train.epoch" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_cli_run_writes_logs_checkpoint_and_a_loadable_sampler(tmp_path):
    tiny = [
        "train.epochs=2",
        "train.sub_epochs=1",
        "train.steps_per_sub_epoch=20",
        "train.unroll=10",
        "train.n_chains=8",
        "train.in_chain_burn_in=4",
        "train.in_chain_chains=4",
        "train.eval_every=1",
        "train.checkpoint_every=1",
        "eval.n_steps=100",
        "eval.n_chains=8",
        "eval.kl_at=[50,100]",
        "progress=false",
        "sampler.q_hidden=[8]",
        "sampler.d_hidden=[8]",
    ]
    run_dir = tmp_path / "run"

    def cli(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "train_meta.py"),
                "--config",
                str(ROOT / "configs" / "toy_gaussian.yaml"),
                "--run-dir",
                str(run_dir),
                *tiny,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )

    done = cli()
    assert done.returncode == 0, done.stderr
    assert any((run_dir / "tb").iterdir())
    scalars = (run_dir / "scalars.csv").read_text()
    for tag in ("loss/total", "loss/cross_chain", "loss/in_chain", "eval/kl@100", "nets/Q_f_mean"):
        assert tag in scalars, tag
    loaded = ms.load_sampler(run_dir / "sampler.safetensors")
    trained = load_config(ROOT / "configs" / "toy_gaussian.yaml").sampler
    assert int(loaded.train_dim) == 10 and loaded.eta == trained.eta
    assert loaded.arguments() == NNSGHMCArgs.from_config(
        load_config(ROOT / "configs" / "toy_gaussian.yaml", tiny).sampler
    )
    # An existing run is never overwritten silently; --resume continues it.
    assert cli().returncode == 2
    # Resuming with another run's config is refused, naming the key; config.yaml is kept.
    config_before = (run_dir / "config.yaml").read_text()
    other = cli("--resume", "train.epochs=3", "sampler.q_hidden=[6]")
    assert other.returncode == 2 and "sampler.q_hidden" in other.stderr, other.stderr
    assert (run_dir / "config.yaml").read_text() == config_before
    resumed = cli("--resume", "train.epochs=3")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout and "after epoch 2" in resumed.stdout
    assert read_checkpoint(run_dir / "checkpoint.pt")["epoch"] == 3


def test_resume_refuses_an_altered_checkpoint_and_warns_on_an_unchecked_one(tmp_path):
    def trainer(epochs: int) -> MetaTrainer:
        return MetaTrainer(
            NNSGHMC(eta=0.02, q_hidden=(8,), d_hidden=(8,), seed=0),
            toy_family(),
            small_settings(epochs=epochs),
            run_dir=tmp_path,
            seed=0,
            progress=False,
        )

    trainer(1).train()
    path = tmp_path / "checkpoint.pt"
    good = path.read_bytes()
    assert trainer(2).resume() == 1
    altered = bytearray(good)
    altered[len(good) // 2] ^= 0x01  # one bit of the tensors torch.load would accept
    path.write_bytes(bytes(altered))
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        trainer(2).resume()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="checkpoint.pt"):
        trainer(2).resume()
    # A checkpoint written before the checksum line loads, with a warning.
    torch.save(read_checkpoint_body(good), path)
    with pytest.warns(UserWarning, match="no checksum line"):
        assert trainer(2).resume() == 1


def read_checkpoint_body(data: bytes) -> dict:
    """The payload of a checkpoint's bytes, as a file without the checksum line holds it."""
    return torch.load(io.BytesIO(data.partition(b"\n")[2]), weights_only=True)


def _config_dict(*overrides: str) -> dict:
    from omegaconf import OmegaConf

    cfg = load_config(None, list(overrides))
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def test_resume_refuses_a_checkpoint_of_another_config_naming_the_keys(tmp_path):
    run_dir = tmp_path / "run"
    saved_cfg = _config_dict("train.n_chains=10", "train.unroll=10")
    first = MetaTrainer(
        NNSGHMC(eta=0.02, q_hidden=(8,), d_hidden=(8,), seed=0),
        toy_family(),
        small_settings(epochs=2),
        run_dir=run_dir,
        seed=0,
        progress=False,
        extra_checkpoint={"config": saved_cfg},
    )
    first.train()

    def resume(sampler=None, settings=None, config=None):
        trainer = MetaTrainer(
            sampler or NNSGHMC(eta=0.02, q_hidden=(8,), d_hidden=(8,), seed=1),
            toy_family(),
            settings or small_settings(),
            run_dir=run_dir,
            seed=0,
            progress=False,
            extra_checkpoint={"config": config or saved_cfg},
        )
        return trainer.resume()

    other = _config_dict("train.n_chains=20", "train.unroll=10", "sampler.d_hidden=[9]")
    with pytest.raises(ValueError, match=r"sampler\.d_hidden.*train\.n_chains: 10 -> 20"):
        resume(config=other)
    # Keys that only say where or how long the run goes may change (e.g. more epochs).
    extended = _config_dict("train.n_chains=10", "train.unroll=10", "train.epochs=8", "seed=0")
    assert resume(config={**extended, "device": "cpu", "progress": False}) == 2
    # Another architecture is named even without a config in the checkpoint.
    with pytest.raises(ValueError, match=r"another architecture.*f_d"):
        resume(sampler=NNSGHMC(eta=0.02, q_hidden=(8,), d_hidden=(6,), seed=1), config={})
    # A checkpoint past train.epochs would train the wrong number of epochs.
    with pytest.raises(ValueError, match="after epoch 2 but train.epochs is 1"):
        resume(settings=small_settings(epochs=1))
