"""scripts/paired_differences.py: seeds pooled per side, paired over the shared ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import paired_differences  # noqa: E402

sys.path.pop(0)


def _result(tmp_path: Path, name: str, method: str, nll_by_seed: dict[int, float | None]) -> str:
    """A results.json whose runs have the given average NLL per seed (``None``: diverged)."""
    runs = [
        {"seed": seed, "final": None if nll is None else {"average_nll": nll}}
        for seed, nll in nll_by_seed.items()
    ]
    directory = tmp_path / name
    directory.mkdir()
    methods = {method: {"label": method.upper(), "is_sampler": True, "runs": runs}}
    (directory / "results.json").write_text(json.dumps({"name": name, "methods": methods}))
    return f"{directory}:{method}"


def _row(table: str, start: str) -> list[str]:
    (line,) = [x for x in table.splitlines() if x.startswith(f"| {start}")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_differences_are_paired_by_seed_across_parts(tmp_path):
    # A's seeds in two parts, B's in one; seed 3 only in B is left out. Per-seed A - B:
    # 0.01, 0.02, 0.03 -> mean 0.02, se 0.01/sqrt(3) (B's own spread is far larger).
    a = [_result(tmp_path, "a1", "nnsghmc", {0: 0.11, 1: 0.52}),
         _result(tmp_path, "a2", "nnsghmc", {2: 0.33})]  # fmt: skip
    b = [_result(tmp_path, "b", "csghmc", {0: 0.10, 1: 0.50, 2: 0.30, 3: 9.0})]
    table = paired_differences.paired_table(a, b)
    assert table.startswith("Seeds [0, 1, 2] (3 paired).")
    assert _row(table, "A - B")[2] == "0.0200 ± 0.0058"
    assert _row(table, "B: CSGHMC")[2] == "0.3000 ± 0.1155"  # seed 3 not averaged in
    assert _row(table, "A: NNSGHMC")[1] == "–"  # no error metric in these runs


def test_a_diverged_run_is_not_paired(tmp_path):
    a = [_result(tmp_path, "a", "sghmc", {0: 0.2, 1: None, 2: 0.4})]
    b = [_result(tmp_path, "b", "sgld", {0: 0.1, 1: 0.1, 2: 0.1})]
    assert paired_differences.paired_table(a, b).startswith("Seeds [0, 2] (2 paired).")


def test_a_seed_given_twice_on_one_side_is_refused(tmp_path):
    a = [_result(tmp_path, "a1", "sghmc", {0: 0.2}), _result(tmp_path, "a2", "sghmc", {0: 0.3})]
    b = [_result(tmp_path, "b", "sgld", {0: 0.1})]
    with pytest.raises(paired_differences.PairingError, match="seed 0 appears twice"):
        paired_differences.paired_table(a, b)


def test_bad_parts_give_an_error_naming_them(tmp_path, capsys):
    a = _result(tmp_path, "a", "sghmc", {0: 0.2})
    b = _result(tmp_path, "b", "sgld", {1: 0.1})
    with pytest.raises(paired_differences.PairingError, match="no seed in common"):
        paired_differences.paired_table([a], [b])
    with pytest.raises(paired_differences.PairingError, match="has no method 'csghmc'"):
        paired_differences.paired_table([a], [b.replace(":sgld", ":csghmc")])
    missing = str(tmp_path / "nowhere") + ":sgld"
    assert paired_differences.main(["--a", a, "--b", missing]) == 2
    assert "results.json not found" in capsys.readouterr().err
    assert paired_differences.main(["--a", a, "--b", "no-colon"]) == 2
    assert "expected DIRECTORY:METHOD" in capsys.readouterr().err
