"""Keep pandas out of a command that only hands pyarrow Arrow and numpy data.

The first time pyarrow builds an array it imports pandas, if pandas is
installed, to ask whether the input is a pandas object: 0.4–0.8 CPU s and
about 45 MB of resident memory, paid by every ``dspark-obs ingest`` for
nothing (the importers give pyarrow numpy arrays and typed Python lists).
:func:`keep_pandas_out` lets pyarrow try that import once while it fails, so
pyarrow takes pandas as absent.  pyarrow's own pandas functions
(``to_pandas``, ``from_pandas``) still import it when called; only its sniffing
of inputs stays off, so call this only in a command that never passes a pandas
object to pyarrow, and before anything else in the process has imported pandas
(else it does nothing).
"""

from __future__ import annotations

import sys

__all__ = ["keep_pandas_out"]


class _NoPandas:
    """A finder that refuses ``pandas`` (installed first on ``sys.meta_path``, for one call)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (dspark_obs.arrow_startup)")
        return None


def keep_pandas_out() -> bool:
    """Make pyarrow take pandas as absent in this process; True if it did (pandas was not imported yet)."""
    if "pandas" in sys.modules:
        return False
    # here, not at module level: the CLI imports this module before it knows it will use Arrow
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([], pa.int8())  # pyarrow's one attempt to import pandas happens here, and fails
    finally:
        sys.meta_path.remove(finder)
    return "pandas" not in sys.modules
