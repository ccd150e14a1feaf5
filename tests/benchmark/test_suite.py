"""The suite table's verdicts and its adaptation rows, from results written by hand."""

from __future__ import annotations

from metasampler.benchmark.suite import adaptation_summary, suite_summary


def _entry(label: str, nll: float, temperature: float = 1.0, lr: float = 0.1, **extra) -> dict:
    summary = {
        "average_nll": {"mean": nll, "se": 0.001, "n": 3},
        "temperature": {"mean": temperature},
    }
    return {
        "label": label,
        "is_sampler": True,
        "error": None,
        "lr": lr,
        "summary": summary,
        **extra,
    }


def _task(**methods: dict) -> dict:
    return {"MNIST": {"methods": methods}}


def test_the_verdict_compares_the_learned_sampler_with_grid_tuned_baselines_at_t_1_only():
    tasks = _task(
        nnsghmc=_entry("NNSGHMC", 0.30),
        nnsghmc_constant=_entry("NNSGHMC, constant nets", 0.20),  # the ablation, not a baseline
        nnsghmc_adapted=_entry("NNSGHMC, adapted", 0.10),
        sghmc=_entry("SGHMC", 0.31),
        sghmc_adapted=_entry("SGHMC, adapted", 0.25),  # adapted rows are not the verdict's
        sgld=_entry("SGLD", 0.10, temperature=0.5),  # cold: not compared
    )
    row = suite_summary(None, tasks).splitlines()[-1]
    assert row.endswith("| **ahead** | **ahead** |")
    assert "SGHMC 0.3100" in row and "SGLD 0.1000 (0.50)" in row
    tasks["MNIST"]["methods"]["psgld"] = _entry("pSGLD", 0.29, temperature=1.05)
    assert suite_summary(None, tasks).splitlines()[-1].endswith("| behind pSGLD | **ahead** |")


def test_the_adapted_verdict_compares_the_adapted_rows_alone():
    tasks = _task(
        nnsghmc=_entry("NNSGHMC", 0.30),
        nnsghmc_adapted=_entry("NNSGHMC, adapted", 0.20),
        nnsghmc_constant_adapted=_entry("NNSGHMC, constant nets, adapted", 0.10),  # ablation
        sghmc=_entry("SGHMC", 0.15),  # a grid row: not the adapted verdict's
        sghmc_adapted=_entry("SGHMC, adapted", 0.19, temperature=1.08),
        sgld_adapted=_entry("SGLD, adapted", 0.05, temperature=0.3),  # cold: not compared
    )
    row = suite_summary(None, tasks).splitlines()[-1]
    assert row.endswith("| behind SGHMC | behind SGHMC, adapted |")
    tasks["MNIST"]["methods"]["sghmc_adapted"] = _entry("SGHMC, adapted", 0.19, temperature=0.5)
    row = suite_summary(None, tasks).splitlines()[-1]
    assert row.endswith("against all: behind SGHMC, adapted, SGLD, adapted |")
    del tasks["MNIST"]["methods"]["nnsghmc_adapted"]
    assert suite_summary(None, tasks).splitlines()[-1].endswith("| behind SGHMC | – |")


def test_adaptation_rows_give_the_change_from_the_grid_and_whether_it_is_within_3_percent():
    tasks = _task(
        sgld=_entry("SGLD", 0.200, lr=0.05),
        sgld_adapted=_entry("SGLD, adapted", 0.205, adapted=[{"lr": 0.04}, {"lr": 0.06}]),
        sghmc=_entry("SGHMC", 0.200),
        sghmc_adapted=_entry("SGHMC, adapted", 0.210, adapted=[{"lr": 0.3}]),
        psgld=_entry("pSGLD", 0.2),  # no adapted row: not listed
    )
    rows = adaptation_summary(tasks).splitlines()[2:]
    assert len(rows) == 2
    assert "| SGLD | 0.2000 | 0.2050 | +2.5 % | 0.05 | 0.04, 0.06 | yes |" in rows[0]
    assert rows[1].endswith("| +5.0 % | 0.1 | 0.3 | **no** |")
    assert adaptation_summary(_task(sgld=_entry("SGLD", 0.2))) == ""
