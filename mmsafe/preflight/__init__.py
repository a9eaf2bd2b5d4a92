"""Preflight: catch in seconds what would otherwise fail hours into a run.

``tools/preflight.py CONFIG`` (and ``tools/train.py --preflight``) resolve a
config as training does and run static checks: registry names, data files,
DataLoader arguments, batch size, AMP, checkpoints, work dir, vis backends,
distributed settings, mmsafe guards and the console encoding. Each finding is
a :class:`CheckRow` (ok / info / warn / error, what, where in the config, how
to fix); :class:`PreflightReport` holds them.
"""
from .context import PreflightContext
from .report import STATUSES, CheckRow, PreflightReport
from .runner import CHECKS, preflight_gate, run_preflight

__all__ = [
    'CHECKS', 'STATUSES', 'CheckRow', 'PreflightContext', 'PreflightReport',
    'preflight_gate', 'run_preflight'
]
