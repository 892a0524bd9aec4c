"""hpctrain's version: the package's metadata (pyproject reads it from here) and every record
that names the software a run ran with (summary.json)."""

__version__ = "0.1.0"
