"""research/scripts/nnsghmc_friction.py: the heat the gradient noise adds, against a measured one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from metasampler import EnergyTarget, sample
from metasampler.samplers import SGHMC

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import nnsghmc_friction  # noqa: E402

sys.path.pop(0)


@pytest.mark.parametrize("friction", [0.5, 0.25])
def test_noise_heat_predicts_the_momentum_temperature_of_a_noisy_sghmc(friction: float) -> None:
    # SGHMC is NNSGHMC with Q = 1 and D = C. On N(0, I) with gradient noise of variance
    # V = 16 and no noise correction, the momenta run at T + eta V / (2 C): 1.8 at C = 0.5 and
    # 2.6 at C = 0.25 for eta = 0.05 (the modified Euler step adds O(eta C) to that: 1.82, 2.64).
    eta, sigma = 0.05, 4.0
    target = EnergyTarget(lambda x: 0.5 * x.square().sum(-1), 40, grad_noise_std=sigma)
    theta, measured = _excess_momentum_temperature(SGHMC(eta=eta, friction=friction), target)
    q = torch.ones_like(theta)
    heat, heat_p90, left = nnsghmc_friction.noise_heat_summary(target, theta, q, friction * q, eta)
    assert heat == pytest.approx(eta * sigma**2 / (2 * friction), rel=0.05)  # from V's estimate
    assert heat_p90 > heat  # (per-coordinate values, spread by the estimate's noise)
    assert measured == pytest.approx(heat, rel=0.08)  # ... the heat the chains show
    # A correction that knows V cancels the heat only where h <= T (here T = 1): at h = 1.6
    # it injects no noise at all and 0.6 of the heat stays.
    corrected = SGHMC(eta=eta, friction=friction, grad_noise_estimate=True)
    _, measured_left = _excess_momentum_temperature(corrected, target)
    assert measured_left == pytest.approx(max(heat - 1.0, 0.0), abs=0.08)
    assert left == pytest.approx(measured_left, abs=0.08)  # what the script says stays
    # Dissipated as friction instead (grad_noise_friction: C + B), the heat goes at any h
    # (measured 0.022 and 0.017: the modified Euler step's O(eta (C + B)) at B = 0.4).
    cooled = SGHMC(eta=eta, friction=friction, grad_noise_estimate=True, grad_noise_friction=True)
    _, measured_cooled = _excess_momentum_temperature(cooled, target)
    assert measured_cooled == pytest.approx(0.0, abs=0.05)


def _excess_momentum_temperature(sampler, target) -> tuple[torch.Tensor, float]:
    """The final positions and the mean of ``p^2 - 1`` over steps 1,001-3,000 of 20 chains."""
    squares: list[torch.Tensor] = []

    def collect(state) -> None:
        if state.step > 1000:
            squares.append(state.momentum.square().mean())

    result = sample(
        sampler, target, 20, 3000, seed=0, progress=False, callback=collect, store=False
    )
    return result.final_state.theta, float(torch.stack(squares).mean()) - 1.0


def test_config_overrides_set_the_friction_the_script_reports(capsys) -> None:
    # methods.nnsghmc.momentum_decay replaces the file's constant friction c (a = eta c per
    # step at the test step): two values 0.1 apart move the table's `eta (s_D f_D + c)` column
    # by 0.1 once the config's 7 warm-up steps (at sqrt(0.47) of the step) are over.
    config = Path(__file__).resolve().parents[3] / "configs" / "eval" / "quick.yaml"

    def constant_friction_column(decay: float) -> float:
        argv = ["--config", str(config), "--lr", "0.3", "--n-chains", "2", "--n-steps", "8"]
        assert nnsghmc_friction.main([*argv, f"methods.nnsghmc.momentum_decay={decay}"]) == 0
        row = capsys.readouterr().out.strip().splitlines()[-1].split("|")
        return float(row[8])  # | step | eta_k | Q_f | clamped | eta D_f | p90 | alpha Q^2 | c |

    low, high = constant_friction_column(0.001), constant_friction_column(0.101)
    assert high - low == pytest.approx(0.1, abs=0.005)


def test_quantiles_take_more_entries_than_torch_quantile_does() -> None:
    # 20 chains of a 1M-parameter network: torch.quantile refuses more than 2^24 entries.
    x = torch.arange(20_000_001, dtype=torch.float32)
    assert nnsghmc_friction.quantiles(x, 0.1, 0.5) == pytest.approx([2_000_000.0, 10_000_000.0])
