"""research/scripts/chain_fit.py: the first-layer split by input frequency and the chains' NLLs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from metasampler import BayesianModel
from tasks.bnn import make_mlp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import chain_fit  # noqa: E402

sys.path.pop(0)


def test_first_layer_split_groups_weights_by_how_often_their_input_is_on() -> None:
    # Input 0 is never on, input 1 on in 5 examples, input 2 in 50, input 3 in all 1,200.
    n = 1200
    x = torch.zeros(n, 4)
    x[:5, 1], x[:50, 2], x[:, 3] = 1.0, 2.0, -1.0
    target = BayesianModel(make_mlp(4, [3], 2), (x, torch.zeros(n, dtype=torch.long)))
    split = chain_fit.first_layer_split(target, x)
    assert [label.split(" (")[0] for label, _ in split] == [
        "0",
        "1-9",
        "10-99",
        "100-999",
        ">= 1000",
    ]
    assert [len(i) for _, i in split] == [3, 3, 3, 0, 3]  # (3 hidden units per input)
    weight = torch.arange(12).view(3, 4)  # the first layer's flat indices, row-major
    for (_, indices), column in zip(split, [0, 1, 2, None, 3], strict=True):
        expected = [] if column is None else weight[:, column].tolist()
        assert indices.tolist() == expected


def test_first_layer_split_skips_models_whose_first_parameter_is_not_on_the_inputs() -> None:
    x = torch.zeros(10, 1, 4, 4)
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    target = BayesianModel(conv, (x, torch.zeros(10, dtype=torch.long)))
    assert chain_fit.first_layer_split(target, x) is None


def test_nlls_are_the_mean_member_nll_and_the_ensemble_nll() -> None:
    # A 1-input, 2-class logistic model: chain k predicts class 1 with logit theta_k * x.
    x = torch.ones(2, 1)
    y = torch.tensor([1, 1])
    target = BayesianModel(torch.nn.Linear(1, 2, bias=False), (x, y))
    theta = torch.tensor([[0.0, 1.0], [0.0, -1.0]])  # logits (0, 1) and (0, -1)
    member, ensemble = chain_fit.nlls(target, theta, x, y)
    p1 = 1 / (1 + math.exp(-1.0))  # each chain's P(class 1): p1 and 1 - p1
    assert math.isclose(member, -(math.log(p1) + math.log(1 - p1)) / 2, rel_tol=1e-9)
    assert math.isclose(ensemble, math.log(2.0), rel_tol=1e-9)  # (their average is 1/2)


def test_parameter_slices_cover_theta_in_the_targets_order() -> None:
    x = torch.zeros(10, 4)
    target = BayesianModel(make_mlp(4, [3], 2), (x, torch.zeros(10, dtype=torch.long)))
    slices = chain_fit.labelled_slices(target)
    named = list(target.module.named_parameters())
    assert [label for label, _ in slices] == [f"{name} ({p.numel()})" for name, p in named]
    assert [sl.stop - sl.start for _, sl in slices] == [p.numel() for _, p in named]
    assert slices[0][1].start == 0 and slices[-1][1].stop == target.dim
    # a tensor's slice of theta is that tensor (the target's flattening)
    theta = torch.arange(target.dim, dtype=torch.float32)
    params = target.spec.unflatten(theta)
    for (name, _), (_, sl) in zip(named, slices, strict=True):
        assert torch.equal(params[name].flatten(), theta[sl])


def test_mean_and_se_over_chains() -> None:
    mean, se = chain_fit.mean_and_se(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert mean == 2.5
    assert math.isclose(se, torch.tensor([1.0, 2.0, 3.0, 4.0]).std().item() / 2)


def test_chains_start_from_saved_states_or_the_configs_initialisation(tmp_path) -> None:
    from types import SimpleNamespace

    from metasampler.files import save_checksummed

    x = torch.zeros(4, 3)
    target = BayesianModel(make_mlp(3, [2], 2), (x, torch.zeros(4, dtype=torch.long)))
    problem = SimpleNamespace(
        target=target, data=SimpleNamespace(x_test=x), init=lambda n, gen: torch.ones(n, 1)
    )
    n, init = chain_fit.chain_starts(None, problem, 5)
    assert n == 5 and init(None).shape == (5, 1)  # the config's, drawn by sample()
    saved = torch.randn(3, target.dim)
    save_checksummed(tmp_path / "s.pt", {"theta": saved})
    n, init = chain_fit.chain_starts(str(tmp_path / "s.pt"), problem, 5)
    assert n == 3 and torch.equal(init, saved)  # as many chains as the file holds
    save_checksummed(tmp_path / "wide.pt", {"theta": torch.zeros(3, target.dim + 1)})
    with pytest.raises(ValueError, match="do not fit this model"):
        chain_fit.chain_starts(str(tmp_path / "wide.pt"), problem, 5)


def test_curl_medians_show_the_preconditioner_per_tensor() -> None:
    # A constant curl Q_f = 1 preconditioned with power 1: a tensor whose squared gradients
    # are 100 times the median coordinate's moves 10 times slower, a median one at 1.
    from metasampler.learned import NNSGHMC
    from metasampler.samplers import SamplerState

    x = torch.zeros(10, 4)
    target = BayesianModel(make_mlp(4, [3], 2), (x, torch.zeros(10, dtype=torch.long)))
    sampler = NNSGHMC(
        eta=0.05, q_hidden=(4,), d_hidden=(4,), q_momentum_input=False, beta_off=1.0,
        precondition_power=1.0, seed=0, compile=False,
    )  # fmt: skip
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    slices = chain_fit.labelled_slices(target)
    grad_sq = torch.ones(2, target.dim)
    grad_sq[:, slices[2][1]] = 100.0  # the output layer's 6 weights of 23 coordinates
    theta = torch.zeros(2, target.dim)
    state = SamplerState(theta, torch.zeros_like(theta), {"grad_sq": grad_sq}, 0, 0.05)
    medians = chain_fit.curl_medians(sampler, state, target, slices)
    assert medians == ["1.000", "1.000", "0.100", "1.000"]


def test_per_chain_averages_and_the_split_by_temperature(capsys) -> None:
    # Two states of each of three chains on one example of label 0; the chains predict
    # P(label) 0.9, 0.5 and 0.1 at every state, chain 2 is hot.
    probs = torch.tensor([0.9, 0.5, 0.1], dtype=torch.float64)
    per_state = torch.stack([probs, 1 - probs], -1).log().unsqueeze(1)  # (K, 1, C)
    log_sums = per_state + math.log(2.0)  # two states each
    y = torch.tensor([0])
    chain_fit.print_per_chain(log_sums, 2, torch.tensor([1.0, 1.05, 3.0]), y, hot=1.2)
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and "chain" not in line]
    own = [float(r[2]) for r in rows]
    assert own == pytest.approx([-math.log(0.9), -math.log(0.5), -math.log(0.1)], abs=1e-4)
    without = [float(r[3].rstrip(" |")) for r in rows]
    assert without == pytest.approx(
        [-math.log(0.3), -math.log(0.5), -math.log(0.7)], abs=1e-4
    )  # (the mean of the other two chains' P(label))
    summary = lines[-1]
    assert f"All chains: 3 chains: test NLL {-math.log(0.5):.4f}" in summary
    assert f"temperature <= 1.2: 2 chains: test NLL {-math.log(0.7):.4f}" in summary
    assert f"hotter: 1 chains: test NLL {-math.log(0.1):.4f}, error 100.00 %" in summary


def test_per_chain_needs_the_averaged_steps(capsys) -> None:
    assert chain_fit.main(["--config", "configs/eval/quick.yaml", "--method", "sghmc",
                           "--lr", "0.1", "--per-chain"]) == 2  # fmt: skip
    assert "--per-chain needs --average-from" in capsys.readouterr().err
