"""The README's promises, checked as a user would meet them: its "own model" path runs as written
in a fresh process outside the repository, and the main command's script runs (on a shortened
budget)."""

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
    ``research/`` beside it), a shipped sampler loaded by name, predictions, a summary,
    an ArviZ InferenceData whose ESS agrees with the summary's, the short run that warns, and the
    step tuned on held-out data (an interior choice)."""
    pytest.importorskip("arviz")
    pytest.importorskip("sklearn")
    main, *rest = _python_blocks(_section(OWN_MODEL_HEADING))
    tuning = next(block for block in rest if "tune_step_size" in block)
    short = next(block for block in rest if block is not tuning)
    assert len(rest) == 2, "the section's code blocks: the path, the step's tuning, the short run"
    user_lines = [line for line in main.splitlines() if line.strip()]
    assert len(user_lines) <= 8, "the README promises the whole path in at most 8 lines"
    assert 'load_sampler("mnist_mlp"' in main and "pretrained/" not in main
    for needed in (".predict(", "ms.summary(result)", "to_inference_data()"):
        assert needed in main
    check = textwrap.dedent(
        """
        import math, warnings, numpy as np, arviz as az
        assert ms.__file__.startswith(PACKAGE), ms.__file__
        accuracy = model.predict(result.theta, x).accuracy(y)
        assert accuracy > 0.85, accuracy
        assert dict(idata.posterior.sizes)["chain"] == 4
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
        exec(TUNING)  # continues the example: the step tuned on held-out data
        assert tuned.interior and 0.01 < tuned.best < 3.0, tuned
        assert all(math.isfinite(score) for _, score in tuned.scores), tuned.scores
        print("tuning ok", tuned.best)
        """
    )
    (tmp_path / "metasampler").symlink_to(ROOT / "metasampler", target_is_directory=True)
    program = (
        "import torch; torch.set_num_threads(1)\n"
        f"PACKAGE = {str(tmp_path / 'metasampler')!r}\nSHORT = {short!r}\nTUNING = {tuning!r}\n"
        + main
        + check
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
    assert "own model ok" in proc.stdout and "tuning ok" in proc.stdout


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


def test_quickstart_runs_each_noise_modes_file_inside_its_stored_thermostat(capsys):
    sys.path.insert(0, str(ROOT))
    try:
        import quickstart
    finally:
        sys.path.remove(str(ROOT))
    argv = ["--n-steps", "50", "--n-chains", "4", "--no-transfer", "--noise", "unknown"]
    assert quickstart.main(argv) == 0
    out = capsys.readouterr().out
    assert "toy_gaussian_stiffness.safetensors (inside its stored thermostat)" in out
    assert quickstart.main(argv[:-2]) == 0  # (the default: the noise-estimating file)
    out = capsys.readouterr().out
    assert "toy_gaussian_noise_estimate.safetensors (inside its stored thermostat)" in out


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
