"""The transfer benchmark: metrics, running average, step-size tuner, ``run_method`` and the
``evaluate.py`` command line (synthetic task, subprocess)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.benchmark_config import load_benchmark_config
from metasampler import NNSGHMC, sample, staging
from metasampler.benchmark import (
    EvalSet,
    RunningAverage,
    TuningError,
    build_method,
    ensemble_log_probs,
    ensemble_metrics,
    error_rate,
    expected_calibration_error,
    format_mean_se,
    member_and_ensemble_nll,
    member_nll,
    negative_log_likelihood,
    predict_log_probs,
    predictive_entropy,
    run_method,
    synthetic_classification_problem,
    tune_step_size,
)
from metasampler.config import ConfigError
from metasampler.targets import NonFiniteError

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# Metrics against hand-computed values
# --------------------------------------------------------------------------------------------
def test_error_and_nll_of_known_probabilities():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.4, 0.1]], dtype=torch.float64)
    y = torch.tensor([0, 2, 1])
    # predictions 0, 1, 0: the first is right, the other two wrong
    assert error_rate(probs.log(), y) == pytest.approx(2 / 3)
    expected = -(math.log(0.7) + math.log(0.3) + math.log(0.4)) / 3
    assert negative_log_likelihood(probs.log(), y) == pytest.approx(expected, rel=1e-12)


def test_member_nll_averages_each_members_nll_not_their_average():
    # Two members on one example of class 0: probabilities 0.8 and 0.2 for it.
    log_probs = torch.tensor([[[0.8, 0.2]], [[0.2, 0.8]]], dtype=torch.float64).log()
    y = torch.tensor([0])
    members = -(math.log(0.8) + math.log(0.2)) / 2
    assert member_nll(log_probs, y) == pytest.approx(members)
    assert member_and_ensemble_nll(log_probs, y) == pytest.approx((members, math.log(2.0)))
    with pytest.raises(ValueError, match="K, B, C"):
        member_nll(log_probs[0], y)


def test_ensemble_averages_probabilities_not_logits():
    # chain 1 predicts [0.9, 0.1], chain 2 [0.3, 0.7]: the ensemble is [0.6, 0.4]
    p1 = torch.tensor([0.9, 0.1], dtype=torch.float64)
    p2 = torch.tensor([0.3, 0.7], dtype=torch.float64)
    logits = torch.stack([p1.log(), p2.log()]).unsqueeze(1)  # (K=2, B=1, C=2)
    lp = ensemble_log_probs(logits)
    assert lp.exp().squeeze(0).tolist() == pytest.approx([0.6, 0.4], rel=1e-12)
    m = ensemble_metrics(logits, torch.tensor([0]))
    assert m["error"] == 0.0
    assert m["nll"] == pytest.approx(-math.log(0.6), rel=1e-12)
    entropy = -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))
    assert m["entropy"] == pytest.approx(entropy, rel=1e-12)
    # averaging logits instead would predict [0.643, 0.357]: a different NLL
    assert m["nll"] != pytest.approx(-torch.log_softmax(logits.mean(0), -1)[0, 0].item(), rel=1e-3)


def _constant_confidence(confidence: float, n_correct: int, n: int = 100) -> tuple:
    """n examples over 2 classes, each predicted as class 0 with ``confidence``."""
    probs = torch.tensor([[confidence, 1 - confidence]], dtype=torch.float64).repeat(n, 1)
    y = torch.ones(n, dtype=torch.long)
    y[:n_correct] = 0
    return probs.log(), y


def test_ece_calibrated_vs_overconfident():
    calibrated = _constant_confidence(0.8, n_correct=80)
    assert expected_calibration_error(*calibrated, n_bins=15) == pytest.approx(0.0, abs=1e-12)
    overconfident = _constant_confidence(0.99, n_correct=50)
    assert expected_calibration_error(*overconfident, n_bins=15) == pytest.approx(0.49)
    # two bins by hand: 50 at confidence 0.95 (all right), 50 at 0.55 (10 right)
    probs = torch.tensor([[0.95, 0.05]] * 50 + [[0.55, 0.45]] * 50, dtype=torch.float64)
    y = torch.tensor([0] * 50 + [0] * 10 + [1] * 40)
    expected = 0.5 * abs(1.0 - 0.95) + 0.5 * abs(0.2 - 0.55)
    assert expected_calibration_error(probs.log(), y, n_bins=15) == pytest.approx(expected)


def test_entropy_uniform_is_log_c_and_certain_is_zero():
    for c in (2, 10):
        uniform = torch.full((3, c), 1.0 / c, dtype=torch.float64).log()
        assert predictive_entropy(uniform).tolist() == pytest.approx([math.log(c)] * 3)
    certain = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64).log()  # log 0 = -inf
    assert predictive_entropy(certain).tolist() == [0.0]


def test_metrics_reject_bad_shapes():
    with pytest.raises(ValueError, match=r"\(K, B, C\)"):
        ensemble_log_probs(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="labels"):
        error_rate(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))


# --------------------------------------------------------------------------------------------
# Running average
# --------------------------------------------------------------------------------------------
def test_running_average_equals_mean_over_stored_samples():
    g = torch.Generator().manual_seed(0)
    # extreme logits: probabilities down to e^-60, fine in log space
    logits = 30.0 * torch.randn(7, 4, 5, 3, generator=g, dtype=torch.float64)  # (S, K, B, C)
    acc = RunningAverage()
    for s in range(logits.shape[0]):
        acc.update(torch.log_softmax(logits[s], -1))
    stored = torch.softmax(logits, -1).reshape(-1, 5, 3).mean(0)
    assert acc.count == 7 * 4
    torch.testing.assert_close(acc.mean(), stored, rtol=1e-12, atol=1e-300)
    torch.testing.assert_close(acc.log_mean(), stored.log(), rtol=1e-10, atol=0)


def test_running_average_empty_raises():
    with pytest.raises(ValueError, match="empty"):
        RunningAverage().log_mean()


# --------------------------------------------------------------------------------------------
# Step-size tuner
# --------------------------------------------------------------------------------------------
def test_tuner_picks_lowest_validation_nll():
    scores = {0.1: 0.9, 0.2: 0.4, 0.4: 0.7}
    calls = []

    def objective(lr: float) -> float:
        calls.append(lr)
        return scores[lr]

    result = tune_step_size(objective, [0.1, 0.2, 0.4])
    assert result.best == 0.2 and calls == [0.1, 0.2, 0.4]
    assert result.scores == [(0.1, 0.9), (0.2, 0.4), (0.4, 0.7)]


def test_tuner_scores_divergence_as_inf_and_fails_when_all_diverge():
    def objective(lr: float) -> float:
        if lr > 1:
            raise NonFiniteError("non-finite position in chain 0 at step 3")
        return float("nan") if lr == 1 else 2.0 - lr

    result = tune_step_size(objective, [0.5, 1.0, 5.0])
    assert result.best == 0.5
    assert result.scores[1][1] == math.inf and result.scores[2][1] == math.inf
    assert "step 3" in result.errors[5.0]
    with pytest.raises(TuningError, match="lower the grid"):
        tune_step_size(objective, [1.0, 5.0])
    # one value: nothing to tune, the objective is not run
    assert tune_step_size(lambda lr: 1 / 0, [0.3]).best == 0.3


def _tiny_problem(**kw):
    args = dict(n_train=120, n_val=60, n_test=60, n_ood=40, n_features=4, batch_size=30)
    args.update(kw)
    return synthetic_classification_problem(**args)


def sgld_validation_objective(problem, nlls: dict[float, float]):
    """``lr -> validation NLL`` of a short 3-chain SGLD run on ``problem`` (recorded in
    ``nlls``); a diverged run raises :class:`NonFiniteError`, as the tuner expects."""
    val = EvalSet(problem.data.x_val, problem.data.y_val)

    def objective(lr: float) -> float:
        run = run_method(
            build_method("sgld", {}, lr, n_data=problem.target.n_data, n_steps=40),
            problem.target,
            problem.init,
            main=val,
            n_chains=3,
            n_steps=40,
            burn_in=20,
            thin=5,
            eval_every=40,
            seed=0,
        )
        if run.diverged_at is not None:
            raise NonFiniteError(run.message)
        nlls[lr] = run.final["average_nll"]
        return nlls[lr]

    return objective


def test_tuner_with_real_runs_picks_the_working_step():
    """SGLD on a synthetic task: a step too small barely leaves the initialisation, a huge
    one diverges; the tuner must pick the middle value by validation NLL."""
    problem = _tiny_problem()
    nlls: dict[float, float] = {}
    objective = sgld_validation_objective(problem, nlls)
    result = tune_step_size(objective, [1e-5, 0.3, 1e6])
    assert result.best == 0.3
    assert result.scores[2][1] == math.inf  # diverged
    assert nlls[0.3] < nlls[1e-5]


# --------------------------------------------------------------------------------------------
# run_method
# --------------------------------------------------------------------------------------------
def test_run_method_streams_curves_and_matches_stored_samples():
    problem = _tiny_problem()
    target, data = problem.target, problem.data
    test = EvalSet(data.x_test, data.y_test)
    K, n_steps, burn_in, thin = 3, 30, 10, 4
    run = run_method(
        build_method("sghmc", {"momentum_decay": 0.05}, 0.05, n_data=target.n_data, n_steps=30),
        target,
        problem.init,
        main=test,
        extra={"ood": EvalSet(data.ood_x)},
        n_chains=K,
        n_steps=n_steps,
        burn_in=burn_in,
        thin=thin,
        eval_every=7,
        seed=3,
    )
    assert run.diverged_at is None
    assert [r["step"] for r in run.curves] == [7, 14, 21, 28, 30]
    assert math.isnan(run.curves[0]["average_nll"])  # before burn-in: no average yet
    kept = [k for k in range(1, n_steps + 1) if k > burn_in and (k - burn_in) % thin == 0]
    assert run.final["n_averaged"] == K * len(kept)
    seconds = [r["seconds"] for r in run.curves]
    assert seconds == sorted(seconds) and seconds[0] > 0

    # the same run with stored samples (same seed: same chains) gives the same average
    sampler = build_method(
        "sghmc", {"momentum_decay": 0.05}, 0.05, n_data=target.n_data, n_steps=30
    )
    stored = sample(
        sampler,
        target,
        K,
        n_steps,
        init=lambda g: problem.init(K, g),
        burn_in=burn_in,
        thin=thin,
        seed=3,
        progress=False,
    )
    assert stored.steps.tolist() == kept
    probs = torch.stack(
        [predict_log_probs(target, theta, data.x_test).exp() for theta in stored.theta]
    )  # (S, K, B, C)
    mean = probs.mean(dim=(0, 1))
    expected_nll = -mean.gather(1, data.y_test.unsqueeze(1)).log().mean().item()
    assert run.final["average_nll"] == pytest.approx(expected_nll, rel=1e-6)
    ens = torch.log_softmax(target.forward(stored.final_state.theta, data.x_test).double(), -1)
    ens_nll = ensemble_metrics(ens, data.y_test)["nll"]
    assert run.final["ensemble_nll"] == pytest.approx(ens_nll, rel=1e-6)
    # each chain's own NLL, averaged over the chains: never below the ensemble's (Jensen)
    member = -ens.gather(-1, data.y_test.view(1, -1, 1).expand(K, -1, 1)).mean().item()
    assert run.curves[-1]["member_nll"] == pytest.approx(member, rel=1e-6)
    assert all(r["member_nll"] >= r["ensemble_nll"] for r in run.curves)
    assert run.entropies["ood"].shape == (data.ood_x.shape[0],)
    assert 0 <= run.final["ood_entropy"] <= math.log(data.n_classes) + 1e-9


def test_run_method_records_divergence():
    problem = _tiny_problem()
    run = run_method(
        build_method("sgld", {}, 1e8, n_data=problem.target.n_data, n_steps=20),
        problem.target,
        problem.init,
        main=EvalSet(problem.data.x_test, problem.data.y_test),
        n_chains=2,
        n_steps=20,
        burn_in=5,
        thin=1,
        eval_every=5,
        seed=0,
    )
    assert run.diverged_at is not None and 1 <= run.diverged_at <= 20
    assert "non-finite" in run.message
    assert math.isnan(run.final["average_nll"])


def _run_tiny(problem, sampler, n_steps: int, **kwargs):
    """``run_method`` on ``_tiny_problem``'s test set: 2 chains, every step averaged, one
    learning-curve row at the end."""
    return run_method(
        sampler,
        problem.target,
        problem.init,
        main=EvalSet(problem.data.x_test, problem.data.y_test),
        n_chains=2,
        n_steps=n_steps,
        burn_in=0,
        thin=1,
        eval_every=n_steps,
        seed=0,
        **kwargs,
    )


def test_cyclical_methods_average_only_sampling_stages():
    problem = _tiny_problem()
    options = {"n_cycles": 2, "explore_fraction": 0.5}
    sampler = build_method("csgld", options, 0.1, n_data=problem.target.n_data, n_steps=40)
    run = _run_tiny(problem, sampler, 40)
    # cycles of 20 steps, the first half of each explores: 10 sampling steps per cycle
    assert run.final["n_averaged"] == 2 * 20


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------
def test_benchmark_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="methods.sgld.lr_grd"):
        load_benchmark_config(None, ["methods.sgld.lr_grd=[0.1]"])
    with pytest.raises(ConfigError, match="budget.burn_in"):
        load_benchmark_config(None, ["budget.n_steps=10", "budget.burn_in=10"])
    with pytest.raises(ConfigError, match="methods.sghmc.lr_grid"):
        load_benchmark_config(None, ["methods.sghmc.lr_grid=[0.1,-1]"])
    with pytest.raises(ConfigError, match="budget.n_chains"):
        load_benchmark_config(None, ["budget.n_chains=many"])
    for bad in ("-0.1", "nan", "inf"):
        with pytest.raises(ConfigError, match="tune.edge_tolerance"):
            load_benchmark_config(None, [f"tune.edge_tolerance={bad}"])
    # Options of earlier NNSGHMC designs, and the cyclical NNSGHMC, are gone: unknown keys.
    for removed, key in (
        ("methods.nnsghmc.alpha_per_step=0.01", "methods.nnsghmc.alpha_per_step"),
        ("methods.nnsghmc.grad_noise_estimate=true", "methods.nnsghmc.grad_noise_estimate"),
        ("methods.nnsghmc.thermostat=true", "methods.nnsghmc.thermostat"),
        ("methods.sghmc.grad_noise_friction=true", "methods.sghmc.grad_noise_friction"),
        ("methods.cnnsghmc.enabled=true", "methods.cnnsghmc"),
    ):
        with pytest.raises(ConfigError, match=f"invalid config key '{re.escape(key)}'"):
            load_benchmark_config(None, [removed])


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "eval").glob("*.yaml")))
def test_shipped_eval_configs_load_and_state_their_budget(path):
    cfg = load_benchmark_config(path)
    text = path.read_text()
    assert "CPU budget" in text and "Paper settings" in text or path.name == "quick.yaml"
    assert cfg.budget.n_chains >= 1 and len(cfg.seeds) >= 1
    assert all(len(cfg.methods[m].lr_grid) == 3 for m in cfg.methods if m != "nnsghmc")


# --------------------------------------------------------------------------------------------
# evaluate.py end to end
# --------------------------------------------------------------------------------------------
def _write_config(tmp_path: Path, name: str = "tiny") -> Path:
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        f"""
name: {name}
seeds: [0, 1]
threads: 1
progress: false
out_dir: {tmp_path / "out"}
synthetic: {{n_train: 120, n_val: 60, n_test: 60, n_ood: 40, n_features: 4, batch_size: 30}}
budget: {{n_chains: 2, n_steps: 16, burn_in: 6, thin: 2, eval_every: 4}}
tune: {{n_steps: 10, burn_in: 4, thin: 2}}
methods:
  nnsghmc: {{lr_grid: [0.01, 0.05], compile: false}}  # (eager: no package build)
  nnsghmc_constant: {{lr_grid: [0.03], compile: false}}
  sgld: {{lr_grid: [0.3]}}
  psgld: {{enabled: false}}
  sghmc: {{enabled: false}}
  msgnht: {{lr_grid: [0.02]}}
  csgld: {{lr_grid: [0.3], n_cycles: 2}}
  csghmc: {{enabled: false}}
  sgdm: {{enabled: false}}
  adam: {{lr_grid: [0.003]}}
"""
    )
    return config


def _save_sampler(path: Path) -> Path:
    """A small sampler file with the nets' means of a training run (as ``train_meta.py``
    stores them), so that its constant-nets ablation runs too."""
    sampler = NNSGHMC(lr=0.01, q_hidden=[4], d_hidden=[4], seed=0)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(0.1)
        sampler.f_q.head.bias.fill_(1.0)
    sampler.save(str(path), provenance={"net_means": {"q": 1.0, "f_d": 0.7}})
    return path


def _evaluate(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _evaluate_main(capsys, *args: str) -> tuple[int, str]:
    """``evaluate.main(args)`` in this process (error paths: no interpreter start-up)."""
    spec = importlib.util.spec_from_file_location("evaluate_cli", ROOT / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    code = module.main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_evaluate_cli_writes_every_result(tmp_path):
    config = _write_config(tmp_path)
    sampler = _save_sampler(tmp_path / "sampler.safetensors")
    # A previous result (replaced as a whole) and the staging directory of a killed run.
    out = tmp_path / "out" / "tiny"
    out.mkdir(parents=True)
    (out / "from_an_earlier_run.txt").write_text("old")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    host = staging.owner_tag().rsplit("-", 2)[0]
    killed = tmp_path / "out" / f".tiny.partial-{host}-{int(ended.stdout)}-0123abcd"
    killed.mkdir()
    proc = _evaluate("--config", str(config), "--sampler", str(sampler))
    assert proc.returncode == 0, proc.stderr
    assert not (out / "from_an_earlier_run.txt").exists() and not killed.exists()
    for name in (
        "results.json",
        "summary.csv",
        "curves.csv",
        "tuning.csv",
        "table.md",
        "config.yaml",
        "learning_curves.png",
        "learning_curves_ensemble.png",
        "entropy_cdf.png",
        "calibration.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert any((out / "tb").rglob("events.out.tfevents*"))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["tiny"]  # no staging left
    results = json.loads((out / "results.json").read_text())
    methods = results["methods"]
    assert list(methods) == ["nnsghmc", "nnsghmc_constant", "sgld", "msgnht", "csgld", "adam"]
    nn = methods["nnsghmc"]
    # the grid [0.01, 0.05], extended beyond an edge while the best value sits there
    assert nn["tuning_grid"] == [0.01, 0.05]
    assert len(nn["tuning"]) == 2 + len(nn["tuning_extensions"])
    assert nn["lr"] in [row["lr"] for row in nn["tuning"]]
    assert sum(row["chosen"] for row in nn["tuning"]) == 1
    for entry in methods.values():
        assert [r["seed"] for r in entry["runs"]] == [0, 1]
        assert 0 <= entry["summary"]["average_error"]["mean"] <= 1
        assert entry["runs"][0]["curves"][-1]["step"] == 16
    # the prior-only check: a number for every sampler, none for the optimiser
    assert all(0 < methods[k]["prior_variance"] < 10 for k in methods if k != "adam")
    assert "prior_variance" not in methods["adam"]
    table = (out / "table.md").read_text()
    for label in (
        "NNSGHMC",
        "NNSGHMC, constant nets",
        "SGLD",
        "mSGNHT-S",
        "cSGLD",
        "Adam (optimiser)",
    ):
        assert f"| {label} |" in table
    assert "| prior var | temp |" in table
    # the final chains' temperature, per seed and over seeds (16 steps: a transient, so any
    # finite value; its value is tested in tests/benchmark/test_temperature.py)
    for entry in methods.values():
        runs = [r["final"]["temperature"] for r in entry["runs"]]
        assert all(math.isfinite(t) for t in runs)
        assert entry["summary"]["temperature"]["mean"] == pytest.approx(sum(runs) / len(runs))
    assert f"| {format_mean_se(methods['sgld']['summary']['temperature'], 1, 2)} |" in table
    assert f"| {methods['sgld']['prior_variance']:.2f} |" in table
    assert "±" in table
    curves = (out / "curves.csv").read_text().splitlines()
    assert curves[0].startswith("method,seed,step,epoch,seconds")
    assert len(curves) == 1 + 6 * 2 * 4  # methods x seeds x evaluations
    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_cli_corrupted_sampler_exits_2_and_writes_nothing(tmp_path, capsys):
    config = _write_config(tmp_path)
    sampler = _save_sampler(tmp_path / "sampler.safetensors")
    blob = bytearray(sampler.read_bytes())
    blob[-40:] = b"\x00" * 40  # damage tensor data: the checksum no longer matches
    sampler.write_bytes(bytes(blob))
    code, err = _evaluate_main(capsys, "--config", str(config), "--sampler", str(sampler))
    assert code == 2
    assert "not a valid sampler file" in err and "checksum" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

    sampler.write_bytes(b"not a safetensors file at all")
    code, err = _evaluate_main(capsys, "--config", str(config), "--sampler", str(sampler))
    assert code == 2 and "not a valid sampler file" in err

    missing = str(tmp_path / "missing.safetensors")
    code, err = _evaluate_main(capsys, "--config", str(config), "--sampler", missing)
    assert code == 2 and "sampler file not found" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_evaluate_cli_bad_config_exits_2(tmp_path, capsys):
    config = _write_config(tmp_path)
    code, err = _evaluate_main(capsys, "--config", str(config), "budget.n_stepz=3")
    assert code == 2 and "budget.n_stepz" in err
    code, err = _evaluate_main(capsys, "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "not found" in err


def test_evaluate_cli_missing_data_prints_install_command(tmp_path, capsys):
    pytest.importorskip("tasks.data")
    empty = tmp_path / "no-data"
    empty.mkdir()
    code, err = _evaluate_main(
        capsys,
        "--config",
        str(ROOT / "configs" / "eval" / "fmnist_cnn_nt.yaml"),
        f"task.data_dir={empty}",
        f"out_dir={tmp_path / 'out'}",
        "methods.nnsghmc.enabled=false",
        "methods.nnsghmc_constant.enabled=false",
    )
    assert code == 2, err
    assert "apt-get install" in err
    assert not (tmp_path / "out").exists()


def test_nnsghmc_compile_option_reaches_the_loaded_sampler(tmp_path):
    """``methods.nnsghmc.compile`` is a valid config key and sets the loaded sampler's
    ``use_compile`` (its numerical equivalence to the eager step is tested in
    tests/learned/test_nnsghmc.py); the benchmark's default is the compiled step from the
    first step."""
    path = tmp_path / "s.safetensors"
    NNSGHMC(eta=0.01, q_hidden=(4,), d_hidden=(4,), seed=0).save(str(path))

    def built(options):
        return build_method("nnsghmc", options, 0.01, n_data=100, n_steps=5, sampler_path=path)

    assert built({}).use_compile is True
    assert built({"compile": False}).use_compile is False
    assert built({"compile": None}).use_compile is None
    quick = Path(__file__).resolve().parents[2] / "configs" / "eval" / "quick.yaml"
    assert load_benchmark_config(quick).methods.nnsghmc.compile is True
    cfg = load_benchmark_config(quick, ["methods.nnsghmc.compile=false"])
    assert cfg.methods.nnsghmc.compile is False


def _finals(results: dict) -> dict:
    """Every method's per-seed final metrics, wall-clock times left out."""
    return {
        key: [{k: v for k, v in run["final"].items() if "seconds" not in k} for run in m["runs"]]
        for key, m in results["methods"].items()
    }


def test_an_interrupted_evaluation_resumes_with_the_methods_it_finished(
    tmp_path, capsys, monkeypatch
):
    from metasampler.benchmark import transfer

    sampler = _save_sampler(tmp_path / "sampler.safetensors")
    run = transfer.MethodBenchmark.run
    ran: list[str] = []

    def interrupted_at(stop: str | None):
        def run_or_stop(self):
            if self.spec.key == stop:
                raise KeyboardInterrupt
            ran.append(self.spec.key)
            return run(self)

        monkeypatch.setattr(transfer.MethodBenchmark, "run", run_or_stop)

    config = _write_config(tmp_path)
    args = ("--config", str(config), "--sampler", str(sampler))
    interrupted_at("msgnht")
    code, err = _evaluate_main(capsys, *args)
    assert (
        code == 130 and "finished methods kept for --resume: nnsghmc, nnsghmc_constant, sgld" in err
    )
    out = tmp_path / "out"
    assert not (out / "tiny").exists()
    kept = out / ".tiny.finished"
    assert sorted(p.name for p in kept.glob("*.pt")) == [
        "nnsghmc.pt",
        "nnsghmc_constant.pt",
        "sgld.pt",
    ]

    # Another config, or an altered stored method, is refused; so is a run that would start
    # afresh over the stored methods. Nothing is run.
    ran.clear()
    code, err = _evaluate_main(capsys, *args)
    assert code == 2 and "pass --resume" in err
    code, err = _evaluate_main(capsys, *args, "budget.n_steps=12", "--resume")
    assert code == 2 and "another run" in err and "budget" in err
    good = (kept / "sgld.pt").read_bytes()
    (kept / "sgld.pt").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    code, err = _evaluate_main(capsys, *args, "--resume")
    assert code == 2 and "does not match its SHA-256" in err
    (kept / "sgld.pt").write_bytes(good)
    assert ran == []  # (nnsghmc was taken back before sgld's file was refused)

    # Resumed: only the unfinished methods run, the result is the uninterrupted one's.
    shutil.rmtree(kept / "nnsghmc.tb", ignore_errors=True)  # (its logs may be gone: still fine)
    ran.clear()
    interrupted_at(None)
    code, err = _evaluate_main(capsys, *args, "--resume")
    assert code == 0, err
    assert ran == ["msgnht", "csgld", "adam"]
    assert not kept.exists()
    resumed = json.loads((out / "tiny" / "results.json").read_text())
    assert any((out / "tiny" / "tb" / "sgld").rglob("events.out.tfevents*"))

    whole = _write_config(tmp_path, name="whole")
    code, err = _evaluate_main(capsys, "--config", str(whole), "--sampler", str(sampler))
    assert code == 0, err
    uninterrupted = json.loads((out / "whole" / "results.json").read_text())
    assert _finals(resumed) == _finals(uninterrupted)
    assert resumed["methods"]["sgld"]["lr"] == uninterrupted["methods"]["sgld"]["lr"]
    rows = [  # (the table's last columns: time per step, divergences)
        [line.split("|")[:-3] for line in (out / run / "table.md").read_text().splitlines()]
        for run in ("tiny", "whole")
    ]
    assert rows[0][4:] == rows[1][4:]  # (after the title and the data line)

    # Without --resume nothing stored is used; --resume with nothing stored is refused.
    code, err = _evaluate_main(capsys, *args, "--resume")
    assert code == 2 and "no finished methods" in err


def test_an_interrupted_suite_resumes_keeping_what_it_published(tmp_path, capsys, monkeypatch):
    """``evaluate.py --suite S --resume``: a task published under the same run key and the toy
    are kept, a task interrupted part way takes back its finished methods, and a task whose
    config changed runs again."""
    from metasampler.benchmark import transfer

    sampler = _save_sampler(tmp_path / "sampler.safetensors")
    run = transfer.MethodBenchmark.run
    ran: list[str] = []

    def interrupted_at(stop: str | None):
        def run_or_stop(self):
            if self.spec.key == stop and "second" in str(self.setting.cfg.name):
                raise KeyboardInterrupt
            ran.append(f"{self.setting.cfg.name}:{self.spec.key}")
            return run(self)

        monkeypatch.setattr(transfer.MethodBenchmark, "run", run_or_stop)

    config = _write_config(tmp_path)
    suite = tmp_path / "suite.yaml"
    out = tmp_path / "suite_out"

    def write_suite(first_steps: int) -> None:
        suite.write_text(
            f"out_dir: {out}\nseeds: [0]\n"
            "toy: {sampler: toy_gaussian, eta: 0.025, n_chains: 4, n_steps: 300}\n"
            "tasks:\n"
            f"  first: {{config: {config}, overrides: [sampler_path={sampler}, "
            f"budget.n_steps={first_steps}]}}\n"
            f"  second: {{config: {config}, overrides: [sampler_path={sampler}]}}\n"
        )

    write_suite(16)
    interrupted_at("msgnht")
    code, _ = _evaluate_main(capsys, "--suite", str(suite))
    assert code == 1  # the second task was interrupted: left out of the table
    first = out / "suite_first"
    published, toy = (first / "results.json").read_bytes(), (out / "toy.json").read_bytes()
    assert (first / "run_key.json").is_file() and (out / ".suite_second.finished").is_dir()

    ran.clear()
    interrupted_at(None)
    code, _ = _evaluate_main(capsys, "--suite", str(suite), "--resume")
    assert code == 0
    assert ran == ["suite_second:msgnht", "suite_second:csgld", "suite_second:adam"]
    assert (first / "results.json").read_bytes() == published
    assert (out / "toy.json").read_bytes() == toy  # kept, not run again
    table = (out / "table.md").read_text()
    assert "| first (" in table and "| second (" in table and "| toy Gaussian (" in table

    # A changed task runs again; the others are kept.
    ran.clear()
    write_suite(18)
    code, _ = _evaluate_main(capsys, "--suite", str(suite), "--resume")
    assert code == 0
    assert ran and all(r.startswith("suite_first:") for r in ran)
    assert json.loads((first / "results.json").read_text())["budget"]["n_steps"] == 18
