"""The README's promises, checked as a user would meet them: its loading snippet runs as written
in a fresh process, and the main command's script runs (on a shortened budget)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD_HEADING = "## Loading a trained sampler for your own model"


def _python_block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    assert heading in text, f"README.md lost its section {heading!r}"
    section = text.split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match, f"no python block under {heading!r}"
    return match.group(1)


def test_readme_loading_snippet_runs_in_a_fresh_process():
    snippet = _python_block_after(LOAD_HEADING)
    # The snippet must load a shipped file and sample a model the sampler never saw.
    assert "load_sampler(" in snippet and "pretrained/" in snippet
    check = (
        "\nimport torch as _t\n"
        "assert isinstance(sampler, ms.NNSGHMC) and not sampler.training\n"
        "assert all(not p.requires_grad for p in sampler.parameters())\n"
        "assert result.theta.ndim == 3 and result.theta.shape[1] == 10\n"
        "assert _t.isfinite(result.theta).all()\n"
        "print('snippet ok', tuple(result.theta.shape))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; torch.set_num_threads(1)\n" + snippet + check],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "snippet ok" in proc.stdout


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
