"""The Bayesian GRU sequence task (``tasks.chorales``): the vmappable GRU, the per-frame
Bernoulli likelihood with padding, per-frame ensemble scoring in ``metasampler.benchmark``,
and the problem end to end on synthetic piano rolls. The music21 tests skip without the
``music`` extra (CI does not install it)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from torch import nn

from experiments.benchmark_config import load_benchmark_config
from experiments.run_config import TaskConfig, load_config
from metasampler import BayesianModel
from metasampler.bayesian import bernoulli_frame_log_lik, bernoulli_sequence_log_lik
from metasampler.benchmark import (
    EvalSet,
    build_method,
    ensemble_log_probs_from_lp,
    frame_metrics,
    frame_targets,
    markdown_table,
    predict_frame_log_probs,
    run_benchmark,
    run_method,
)
from metasampler.config import ConfigError
from tasks import chorales
from tasks.chorales import GRUModel, build_chorale_problem, make_sequences, piano_roll
from tasks.data import DataUnavailableError
from tasks.registry import build_problem

try:
    import music21  # noqa: F401  (project extra "music")

    HAVE_MUSIC21 = True
except ImportError:
    HAVE_MUSIC21 = False
needs_music21 = pytest.mark.skipif(
    not HAVE_MUSIC21, reason="the chorale corpus needs music21: pip install -e '.[music]'"
)


def synthetic_rolls(n: int = 12, seed: int = 0) -> list[np.ndarray]:
    """Pieces of 10-30 frames: a random walk of three-note chords (learnable structure)."""
    rng = np.random.default_rng(seed)
    rolls = []
    for _ in range(n):
        length = int(rng.integers(10, 31))
        roll = np.zeros((length, 88), np.uint8)
        root = int(rng.integers(30, 50))
        for t in range(length):
            roll[t, [root, root + 4, root + 7]] = 1
            root = int(np.clip(root + rng.integers(-2, 3), 20, 70))
        rolls.append(roll)
    return rolls


def tiny_cfg(**overrides) -> TaskConfig:
    values = {"kind": "chorale_gru", "hidden": [6], "seq_len": 8, "batch_size": 4}
    values.update(overrides)
    return TaskConfig(**values)


# --------------------------------------------------------------------------------------------
# Model and likelihood
# --------------------------------------------------------------------------------------------
def test_gru_model_matches_torch_gru():
    torch.manual_seed(0)
    model = GRUModel(5, n_in=7, n_out=3)
    reference = nn.GRU(7, 5, batch_first=True)
    with torch.no_grad():
        reference.weight_ih_l0.copy_(model.weight_ih)
        reference.weight_hh_l0.copy_(model.weight_hh)
        reference.bias_ih_l0.copy_(model.bias_ih)
        reference.bias_hh_l0.copy_(model.bias_hh)
    x = torch.randn(4, 9, 7)
    states, _ = reference(x)
    assert torch.allclose(model(x), model.readout(states), atol=1e-6)


def test_gru_bayesian_model_matches_per_chain_loop():
    torch.manual_seed(1)
    x, y = make_sequences(synthetic_rolls(4), seq_len=8)
    module = GRUModel(4).double()
    model = BayesianModel(
        module, (x, y), likelihood="bernoulli_sequence", prior_std=0.7, dtype=torch.float64
    )
    theta = model.init_positions(3, torch.Generator().manual_seed(0))
    ev = model.evaluate(theta)
    for k in range(3):
        th = theta[k].clone().requires_grad_(True)
        params = model.spec.unflatten(th)
        logits = torch.func.functional_call(module, params, (x.double(),))
        energy = -bernoulli_sequence_log_lik(logits, y.double()).sum() + (th * th).sum() / (
            2 * 0.7**2
        )
        (grad,) = torch.autograd.grad(energy, th)
        assert torch.allclose(ev.energy[k], energy.detach(), rtol=1e-10)
        assert torch.allclose(ev.grad[k], grad, rtol=1e-8, atol=1e-10)


def test_bernoulli_frame_log_lik_hand_case():
    # two keys, logit log(3) -> P(on) = 3/4; frame 1 has keys (on, off), frame 2 is padding
    logits = torch.full((1, 2, 2), math.log(3.0), dtype=torch.float64)
    y = torch.tensor([[[1.0, 0.0], [-1.0, -1.0]]], dtype=torch.float64)
    frame = bernoulli_frame_log_lik(logits, y)
    assert torch.allclose(frame, torch.tensor([[math.log(0.75 * 0.25), 0.0]], dtype=torch.float64))
    assert torch.allclose(bernoulli_sequence_log_lik(logits, y), frame.sum(-1))
    # zero logits: every real frame of 88 keys has log-likelihood -88 log 2
    y88 = torch.zeros(2, 3, 88)
    y88[1, 2] = -1.0
    seq = bernoulli_sequence_log_lik(torch.zeros(2, 3, 88), y88)
    assert torch.allclose(seq, torch.tensor([-3 * 88 * math.log(2), -2 * 88 * math.log(2)]))
    # padding frames get no gradient
    out = torch.zeros(1, 2, 2, requires_grad=True)
    bernoulli_sequence_log_lik(out, y.float()).sum().backward()
    assert out.grad[0, 1].abs().sum() == 0 and out.grad[0, 0].abs().sum() > 0
    with pytest.raises(ValueError, match="same shape"):
        bernoulli_frame_log_lik(torch.zeros(1, 2, 3), torch.zeros(1, 2, 2))


def test_make_sequences_shift_chunks_and_padding():
    roll = np.zeros((5, 88), np.uint8)
    roll[np.arange(5), np.arange(5)] = 1  # key t on in frame t
    x, y = make_sequences([roll], seq_len=3)
    assert x.shape == y.shape == (2, 3, 88)
    flat_x, flat_y = x.reshape(6, 88), y.reshape(6, 88)
    assert flat_x[0].sum() == 0  # nothing before the first frame
    assert torch.equal(flat_x[1:5], torch.from_numpy(roll[:4]).float())  # previous frame
    assert torch.equal(flat_y[:5], torch.from_numpy(roll).float())
    assert (flat_y[5] == -1).all() and (flat_x[5] == 0).all()  # padding
    assert torch.equal(frame_targets(y), torch.from_numpy(roll).bool())


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
def test_ensemble_frame_nll_equals_direct_computation():
    torch.manual_seed(2)
    x, y = make_sequences(synthetic_rolls(3), seq_len=8)
    model = BayesianModel(GRUModel(5), (x, y), likelihood="bernoulli_sequence")
    theta = model.init_positions(4, torch.Generator().manual_seed(1)) * 3.0  # spread chains
    lp = predict_frame_log_probs(model, theta, x, y, batch_size=2)
    valid = (y >= 0).all(-1)
    assert lp.shape == (4, int(valid.sum()), 89)
    metrics = frame_metrics(ensemble_log_probs_from_lp(lp), frame_targets(y))
    # direct: mixture over chains of the product of 88 Bernoullis, per real frame
    probs = torch.sigmoid(model.forward(theta, x).double())  # (K, B, T, 88)
    target = y.double().clamp(min=0)
    per_key = torch.where(target > 0.5, probs, 1 - probs)
    frame_prob = per_key.prod(-1)[:, valid]  # (K, F)
    direct = -torch.log(frame_prob.mean(0)).mean()
    assert math.isclose(metrics["nll"], float(direct), rel_tol=1e-9)
    # frame accuracy from the mixture's marginals
    on = probs.mean(0)[valid] > 0.5
    truth = target[valid] > 0.5
    tp, wrong = int((on & truth).sum()), int((on ^ truth).sum())
    assert math.isclose(metrics["error"], 1 - tp / (tp + wrong), rel_tol=1e-12)
    assert math.isnan(metrics["ece"]) and math.isnan(metrics["entropy"])


def test_frame_metrics_hand_case():
    # two frames, three keys; predictive marginals 0.9 / 0.2 / 0.6 in both frames
    marg = torch.tensor([0.9, 0.2, 0.6], dtype=torch.float64).log()
    frame = torch.tensor([[math.log(0.5)], [math.log(0.25)]], dtype=torch.float64)
    lp = torch.cat([frame, marg.expand(2, 3)], 1)
    targets = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    m = frame_metrics(lp, targets)
    assert math.isclose(m["nll"], -(math.log(0.5) + math.log(0.25)) / 2)
    # predicted on: keys 0 and 2 in both frames; TP = 1 + 2, FP = 1, FN = 1 -> acc 3/5
    assert math.isclose(m["error"], 1 - 3 / 5)


# --------------------------------------------------------------------------------------------
# The problem, end to end
# --------------------------------------------------------------------------------------------
def test_problem_on_synthetic_rolls_runs_through_run_method():
    rolls = synthetic_rolls(15)
    problem = build_chorale_problem(tiny_cfg(), seed=3, rolls=rolls)
    data = problem.data
    assert data.pieces == {"train": 9, "val": 3, "test": 3}
    assert sum(data.frames.values()) == sum(len(r) for r in rolls)
    assert int((data.y_test >= 0).all(-1).sum()) == data.frames["test"]
    assert problem.target.dim == 3 * (88 * 6 + 6 * 6 + 2 * 6) + 6 * 88 + 88
    again = build_chorale_problem(tiny_cfg(), seed=3, rolls=rolls)
    assert torch.equal(again.data.y_val, data.y_val)  # deterministic split
    other = build_chorale_problem(tiny_cfg(), seed=4, rolls=rolls)
    assert not torch.equal(other.data.y_test, data.y_test) or data.y_test.shape[0] == 0

    sampler = build_method(
        "sghmc", {"momentum_decay": 0.05}, 0.05, n_data=problem.target.n_data, n_steps=30
    )
    result = run_method(
        sampler,
        problem.target,
        problem.init,
        main=EvalSet(data.x_test, data.y_test),
        n_chains=3,
        n_steps=30,
        burn_in=10,
        thin=5,
        eval_every=10,
        seed=0,
        eval_batch_size=4,
    )
    assert result.diverged_at is None and len(result.curves) == 3
    first, last = result.curves[0]["ensemble_nll"], result.final["average_nll"]
    assert math.isfinite(last) and last < first < 88 * math.log(2) + 1  # it learns
    assert 0 <= result.final["average_error"] <= 1
    assert math.isnan(result.final["average_ece"]) and result.calibration is None
    assert result.entropies == {}


def test_run_benchmark_writes_frame_table(tmp_path):
    problem = build_chorale_problem(tiny_cfg(), seed=0, rolls=synthetic_rolls(12))
    overrides = [
        "seeds=[0]",
        "tensorboard=false",
        "progress=false",
        "budget.n_chains=2",
        "budget.n_steps=12",
        "budget.burn_in=4",
        "budget.thin=4",
        "budget.eval_every=6",
        "budget.eval_batch_size=8",
        "tune.n_steps=6",
        "tune.burn_in=2",
        "tune.thin=2",
        "methods.sgld.lr_grid=[0.01,0.02]",
        "methods.adam.lr_grid=[0.001]",
    ]
    overrides += [
        f"methods.{m}.enabled=false"
        for m in (
            "nnsghmc",
            "nnsghmc_constant",
            "psgld",
            "sghmc",
            "msgnht",
            "csgld",
            "csghmc",
            "sgdm",
        )
    ]
    cfg = load_benchmark_config(None, overrides)
    result = run_benchmark(cfg, problem, sampler_path=None, out_dir=tmp_path, progress=False)
    summary = result.summary
    assert summary["scoring"] == "frames"
    assert summary["n_test_frames"] == int((problem.data.y_test >= 0).all(-1).sum())
    for key in ("sgld", "adam"):
        stats = summary["methods"][key]["summary"]
        assert math.isfinite(stats["average_nll"]["mean"])
    sgld = summary["methods"]["sgld"]
    assert sgld["tuning_grid"] == [0.01, 0.02]
    assert len(sgld["tuning"]) == 2 + len(sgld["tuning_extensions"])  # grid + its extensions
    assert "nats per frame" in markdown_table(summary)


def test_registry_dispatch_and_config(monkeypatch):
    monkeypatch.setattr(chorales, "load_piano_rolls", lambda ds: (synthetic_rolls(6), ["a"] * 6))
    problem = build_problem(tiny_cfg(batch_size=2), seed=0)
    assert problem.target.likelihood == "bernoulli_sequence"
    assert problem.data.dataset == "bach"
    with pytest.raises(ValueError, match="task.hidden must be"):
        build_problem(tiny_cfg(hidden=[4, 4]))
    with pytest.raises(ValueError, match="exceeds"):
        build_problem(tiny_cfg(batch_size=1000))
    with pytest.raises(ConfigError, match="task.dataset"):
        load_config(None, ["task.kind=chorale_gru", "task.dataset=mozart"])
    with pytest.raises(ConfigError, match="task.seq_len"):
        load_config(None, ["task.seq_len=0"])


# --------------------------------------------------------------------------------------------
# music21 (optional)
# --------------------------------------------------------------------------------------------
@needs_music21
def test_piano_roll_of_a_music21_stream():
    from music21 import chord, note, stream

    part = stream.Stream()
    part.append(note.Note("C4", quarterLength=1.0))  # MIDI 60 -> key 39, frame 0
    part.append(note.Note("E4", quarterLength=2.0))  # frames 1, 2
    part.append(note.Note("D4", quarterLength=0.5))  # frame 3 (sounds at t = 3)
    part.append(note.Note("F4", quarterLength=0.5))  # between frames: skipped
    part.append(chord.Chord(["A0", "C8"], quarterLength=1.0))  # frame 4, keys 0 and 87
    roll = piano_roll(part)
    assert roll.shape == (5, 88) and roll.dtype == np.uint8
    expected = np.zeros((5, 88), np.uint8)
    expected[0, 39] = expected[1, 43] = expected[2, 43] = expected[3, 41] = 1
    expected[4, [0, 87]] = 1
    assert np.array_equal(roll, expected)


@needs_music21
def test_bach_corpus_files_parse():
    paths = chorales.corpus_paths("bach")
    assert len(paths) > 350 and all(p.suffix == ".mxl" for p in paths)
    assert len(chorales.corpus_paths("palestrina")) == chorales.PALESTRINA_PIECES
    arrays = chorales._parse(paths[:2])  # two chorales only: the whole corpus takes ~1 min
    rolls = np.unpackbits(arrays["packed"], axis=-1, count=88)
    assert rolls.shape[0] == arrays["lengths"].sum() and 20 < arrays["lengths"].min()
    voices = rolls.sum(1)  # at most one key per part (voices in unison share a key)
    assert voices.max() <= arrays["parts"].max() and voices.mean() > 3
    assert arrays["parts"].min() >= 4 and list(arrays["names"]) == [p.name for p in paths[:2]]


def test_missing_music21_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "music21", None)  # `import music21` now fails
    with pytest.raises(DataUnavailableError, match=r"pip install -e '\.\[music\]'"):
        chorales.load_piano_rolls("bach")
    with pytest.raises(ValueError, match="task.dataset must be one of"):
        chorales.corpus_paths("mozart")


@needs_music21
def test_piano_rolls_are_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("METASAMPLER_CACHE", str(tmp_path))
    two = chorales.corpus_paths("bach")[1:3]  # four-part chorales
    monkeypatch.setattr(chorales, "corpus_paths", lambda dataset: two)
    rolls, names = chorales.load_piano_rolls("bach")
    assert names == [p.name for p in two] and all(r.shape[1] == 88 for r in rolls)
    assert len(list(tmp_path.glob("bach-rolls-quarter-*.npz"))) == 1

    def no_parse(paths):
        raise AssertionError("parsed again despite the cache")

    monkeypatch.setattr(chorales, "_parse", no_parse)
    again, _ = chorales.load_piano_rolls("bach")
    assert all(np.array_equal(a, b) for a, b in zip(rolls, again, strict=True))
