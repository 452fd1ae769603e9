"""The one rule for a test whose prerequisite is missing: it fails.

`scripts/install-prereqs.sh` installs everything the suite needs, so a missing
piece is a broken setup, not a reason to pass quietly.  A developer who cannot
install it may set GPUSHARE_ALLOW_SKIP=1 to skip such tests instead; that is
ignored when CI=true.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(why: str) -> NoReturn:
    why += " (run scripts/install-prereqs.sh)"
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if os.environ.get("GPUSHARE_ALLOW_SKIP") == "1" and not ci:
        pytest.skip(why)
    pytest.fail(why, pytrace=False)
