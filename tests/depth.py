"""Property tests at two depths: a quick run of examples in the fast suite, and the
full run, marked slow, in the full suite (so the fast suite stays near a minute while
the full suite searches as widely as ever).

    @two_depths(full=300)
    def test_x(examples: int) -> None:
        @settings(max_examples=examples, deadline=None)
        @given(...)
        def check(...) -> None: ...

        check()
"""

from __future__ import annotations

import pytest

#: the quick run tries this share of the full run's examples
QUICK_SHARE = 5


def two_depths(full: int) -> pytest.MarkDecorator:
    """Parametrize `examples`: `full // QUICK_SHARE` (id "quick"), and `full` (id
    "full", marked slow)."""
    return pytest.mark.parametrize(
        "examples",
        [
            pytest.param(max(1, full // QUICK_SHARE), id="quick"),
            pytest.param(full, id="full", marks=pytest.mark.slow),
        ],
    )
