"""A user's own SQL over a run set: the read-only check, the sandboxed child, background runs."""
