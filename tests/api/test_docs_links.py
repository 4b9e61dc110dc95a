"""The repository's Markdown is self-contained: `scripts/check_links.py` finds every relative
link and image of every tracked `*.md` file in the repository (no path above its root, such as
`../shared/...`), and every `#fragment` names a heading of its target. Uses no server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_markdown_links_resolve_inside_the_repository():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "check_links.py"), str(REPO)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"broken links in the docs:\n{r.stdout}{r.stderr}"
