"""The read path's errors: what a query or the runs it reads can go wrong with, in one line each."""

from __future__ import annotations


class QueryError(Exception):
    """A user-facing problem with a query or the runs it reads (bad path, bad SQL, refused statement)."""


class CorruptPartWarning(UserWarning):
    """A Parquet part could not be read and is skipped."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
