"""The README's promises, checked as a user would meet them: its "own model" path runs as written
in a fresh process outside the repository, its sampling blocks run, every documented command
names files that exist and entries that start, and the main command's script runs (on a
shortened budget)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN_MODEL_HEADING = "## Use it on your own model"


def _section(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    assert heading in text, f"README.md lost its section {heading!r}"
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _python_blocks(section: str) -> list[str]:
    """The python code blocks of ``section`` (also those indented under a list item)."""
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", section, flags=re.S | re.M)
    return [textwrap.dedent(body) for _indent, body in blocks]


def test_readme_own_model_path_runs_from_an_empty_directory(tmp_path):
    """The "own model" section as a user meets it: a fresh process in an empty directory where
    only the ``metasampler`` package is importable (no ``pretrained/``, ``tasks/`` or
    ``research/`` beside it), a shipped sampler loaded by name whose step is adapted during the
    burn-in, predictions, a summary, an ArviZ InferenceData whose ESS agrees with the
    summary's, the short run that warns, and the logistic regression adapted from the chains
    alone whose summary watches its parameters."""
    pytest.importorskip("arviz")
    pytest.importorskip("sklearn")
    main, *rest = _python_blocks(_section(OWN_MODEL_HEADING))
    assert len(rest) == 2, "the section's code blocks: the path, the short run, the regression"
    short = next(block for block in rest if "n_steps=100" in block)
    regression = next(block for block in rest if "bernoulli" in block)
    user_lines = [line for line in main.splitlines() if line.strip()]
    assert len(user_lines) <= 8, "the README promises the whole path in at most 8 lines"
    assert 'load_sampler("feedforward")' in main and "pretrained/" not in main
    for needed in ("adapt=True", ".predict(", "ms.summary(result)", "to_inference_data()"):
        assert needed in main
    check = textwrap.dedent(
        """
        import math, warnings, numpy as np, arviz as az
        assert ms.__file__.startswith(PACKAGE), ms.__file__
        accuracy = model.predict(result.theta, x).accuracy(y)
        assert accuracy > 0.85, accuracy
        assert result.adapted is not None
        assert dict(idata.posterior.sizes)["chain"] == 8
        assert dict(idata.posterior.sizes)["draw"] == result.theta.shape[0]
        names = list(model.spec.names)
        az_ess = np.concatenate([az.ess(idata)[n].values.ravel() for n in names])
        ours = ms.summary(result, warn=False).param_ess
        assert np.allclose(az_ess, ours, rtol=0.05), np.abs(az_ess / ours - 1).max()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(SHORT)
        assert any(issubclass(w.category, ms.ConvergenceWarning) for w in caught), caught
        print("own model ok", accuracy)
        exec(REGRESSION)
        held_out = logreg.predict(fit.theta, xb[300:])
        assert held_out.nll(yb[300:, None]) < 0.4 and held_out.accuracy(yb[300:, None]) > 0.8
        assert ms.summary(fit, warn=False).watched == "parameters"
        print("regression ok")
        """
    )
    (tmp_path / "metasampler").symlink_to(ROOT / "metasampler", target_is_directory=True)
    program = (
        "import torch; torch.set_num_threads(1)\n"
        f"PACKAGE = {str(tmp_path / 'metasampler')!r}\nSHORT = {short!r}\n"
        f"REGRESSION = {regression!r}\n" + main + check
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "own model ok" in proc.stdout and "regression ok" in proc.stdout


def test_readme_sampling_and_nnsghmc_blocks_run():
    """The "Sampling" and "NNSGHMC" sections' code runs as written from the repository root
    (shortened: the same calls at fewer steps)."""
    code = "\n".join(
        _python_blocks(_section("## Sampling")) + _python_blocks(_section("## NNSGHMC"))
    )
    code = code.replace("n_steps=2000, burn_in=500", "n_steps=200, burn_in=50")
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; torch.set_num_threads(1)\n" + code],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def _commands(path: Path) -> list[str]:
    """The command lines of ``path``'s bash blocks (comments and continuations dropped)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


@pytest.mark.parametrize("doc", ["README.md", "pretrained/README.md", "docs/RESULTS.md",
                                 "BENCHMARKS.md", "docs/DISTRIBUTED.md"])  # fmt: skip
def test_documented_commands_name_files_that_exist_and_entries_that_start(doc):
    """Every command the documents give names files that exist, and each Python entry it runs
    answers ``--help`` (running them all is the suite's job, minutes to hours)."""
    if not (ROOT / doc).exists():
        pytest.skip(f"{doc} not written")
    for command in _commands(ROOT / doc):
        for path in re.findall(r"(?:configs|scripts|speed|docs|pretrained)/[\w./-]+", command):
            assert (ROOT / path).exists(), f"{doc}: {command!r} names {path}, which is missing"
        module = re.search(r"python -m ([\w.]+)", command)
        script = re.search(r"python ([\w/]+\.py)", command)
        if module and module.group(1) not in ("pytest", "pip", "metasampler.prebuild"):
            entry = ["-m", module.group(1)]
        elif script:
            entry = [script.group(1)]
        else:
            continue
        proc = subprocess.run(
            [sys.executable, *entry, "--help"], cwd=ROOT, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, f"{doc}: {command!r}: {proc.stderr[-1000:]}"


def test_quickstart_toy_part_runs(capsys):
    sys.path.insert(0, str(ROOT))
    try:
        import quickstart
    finally:
        sys.path.remove(str(ROOT))
    code = quickstart.main(["--n-steps", "300", "--n-chains", "10", "--no-transfer"])
    out = capsys.readouterr().out
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("| NNSGHMC")]
    assert len(rows) == 1
    values = [float(v) for v in rows[0].strip("|").split("|")[1:]]
    assert all(v == v and v >= 0 for v in values)  # KL, ESS and seconds are finite numbers


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--n-steps", "-5"), ("--n-chains", "x"), ("--eta", "nan"), ("--threads", "0")],
)
def test_quickstart_rejects_a_bad_number_before_any_work(flag, value, capsys):
    sys.path.insert(0, str(ROOT))
    try:
        import quickstart
    finally:
        sys.path.remove(str(ROOT))
    with pytest.raises(SystemExit) as exit_:
        quickstart.main([flag, value, "--no-transfer"])
    assert exit_.value.code == 2
    assert f"argument {flag}: must be" in capsys.readouterr().err
