"""Moved to :mod:`libreyolo.comparison.matching` (the one comparison package); this name is an alias of
that module (the same module object, so a patch through either name reaches both)."""
from __future__ import annotations

import sys

from libreyolo.comparison import matching

sys.modules[__name__] = matching
