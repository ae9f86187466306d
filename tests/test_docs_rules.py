"""Rules of the repository's docs that a reader relies on:

- Every relative link in README.md and docs/ names a file of the checkout: a clone
  is all a reader has, so nothing may point outside it or at a file since renamed.
- docs/performance.md stays under `PERFORMANCE_BYTES_MAX`: it holds the figures of
  the code as it is, with their commands and the reasons behind the code's choices;
  their history is git log's.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE_BYTES_MAX = 20_000

#: a markdown link's target: [text](target), the target up to its first space
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_of_the_docs_names_a_file_of_the_checkout() -> None:
    broken: list[str] = []
    for page in _markdown_files():
        for target in _LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).resolve().exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif not (page.parent / path).resolve().is_relative_to(ROOT):
                broken.append(f"{page.relative_to(ROOT)}: {target} (outside the checkout)")
    assert not broken, "links to no file of the checkout:\n" + "\n".join(broken)


def test_the_performance_page_stays_under_its_size() -> None:
    size = len((ROOT / "docs" / "performance.md").read_bytes())
    assert size < PERFORMANCE_BYTES_MAX, (
        f"docs/performance.md is {size} bytes, over {PERFORMANCE_BYTES_MAX}: keep the "
        "figures of now and the reasons for the choices, and leave history to git log"
    )
