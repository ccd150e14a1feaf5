"""research/scripts/paired_differences.py: seeds pooled per side, paired over the shared ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import paired_differences  # noqa: E402

sys.path.pop(0)


def _result(
    tmp_path: Path, name: str, method: str, nll_by_seed: dict[int, float | None], lr: float = 0.1
) -> str:
    """A results.json of one method at step ``lr`` whose runs have the given average NLL per
    seed (``None``: diverged, as evaluate.py writes it)."""
    runs = [
        {"seed": s, "final": {"average_nll": nll}, "curves": [], "message": None,
         "diverged_at": None if nll is not None else 7}
        for s, nll in nll_by_seed.items()
    ]  # fmt: skip
    entry = {"label": method.upper(), "is_sampler": True, "lr": lr, "runs": runs,
             "seeds": list(nll_by_seed)}  # fmt: skip
    summary = {
        "name": name,
        "seeds": list(nll_by_seed),
        "methods": {method: entry},
        "config": {"seeds": list(nll_by_seed), "methods": {method: {"lr_grid": [lr]}}},
    }
    directory = tmp_path / name
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps(summary))
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


def test_a_diverged_run_is_left_out_of_the_differences(tmp_path):
    a = [_result(tmp_path, "a", "sghmc", {0: 0.2, 1: None, 2: 0.4})]
    b = [_result(tmp_path, "b", "sgld", {0: 0.1, 1: 0.1, 2: 0.1})]
    table = paired_differences.paired_table(a, b)
    assert _row(table, "A - B")[2] == "0.2000 ± 0.1000"  # seeds 0 and 2 only
    assert _row(table, "B: SGLD")[2] == "0.1000 ± 0.0000"  # B keeps all three


def test_parts_that_do_not_merge_are_refused(tmp_path):
    b = [_result(tmp_path, "b", "sgld", {0: 0.1, 1: 0.1})]
    twice = [_result(tmp_path, "a1", "sghmc", {0: 0.2}), _result(tmp_path, "a2", "sghmc", {0: 0.3})]
    with pytest.raises(paired_differences.PairingError, match="repeat seeds"):
        paired_differences.paired_table(twice, b)
    retuned = [twice[0], _result(tmp_path, "a3", "sghmc", {1: 0.3}, lr=0.2)]
    with pytest.raises(paired_differences.PairingError, match="tuned differently"):
        paired_differences.paired_table(retuned, b)
    other = [twice[0], _result(tmp_path, "a4", "csghmc", {1: 0.3})]
    with pytest.raises(paired_differences.PairingError, match="different methods"):
        paired_differences.paired_table(other, b)


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
