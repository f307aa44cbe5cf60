"""The one error a build reports to its user. It lives here, not in any stage, so that every stage can raise
it without importing another stage (prep/load.py re-exports it for older imports)."""
from __future__ import annotations


class BuildError(Exception):
    """A problem with the user's input, reported as one line by the CLI."""
