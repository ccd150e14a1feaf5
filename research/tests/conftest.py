"""Research tests: ``research/`` itself is on ``sys.path`` so that ``import reproduce`` and
``import reproduction`` find the moved modules (the repository root comes from pyproject's
``pythonpath``; each script test puts ``research/scripts`` there itself)."""

from __future__ import annotations

import sys
from pathlib import Path

RESEARCH = Path(__file__).resolve().parents[1]
if str(RESEARCH) not in sys.path:
    sys.path.insert(0, str(RESEARCH))
