"""Preflight checks: one module per check, each a function
``check_*(ctx) -> Iterable[CheckRow]``."""
