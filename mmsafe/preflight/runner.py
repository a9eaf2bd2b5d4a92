"""Run the preflight checks on a resolved config."""
import os
import sys
import time
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from .checks.amp import check_amp
from .checks.batch_size import check_batch_size
from .checks.checkpoints import check_checkpoints
from .checks.console_encoding import check_console_encoding
from .checks.data_files import check_data_files
from .checks.dataloader_args import check_dataloader_args
from .checks.distributed import check_distributed
from .checks.guards import check_guards
from .checks.model_build import check_model_build
from .checks.paired_pipeline import check_paired_pipeline
from .checks.registry_types import check_registry_types
from .checks.vis_backends import check_vis_backends
from .checks.work_dir import check_work_dir
from .context import PreflightContext
from .report import CheckRow, PreflightReport

CheckFn = Callable[[PreflightContext], Iterable[CheckRow]]

#: ``(name, function)`` in run order. Later checks reuse what earlier ones
#: learned (registry errors, the built model, whether the data is paired).
CHECKS: List[Tuple[str, CheckFn]] = [
    ('console', check_console_encoding),
    ('registry', check_registry_types),
    ('model', check_model_build),
    ('data', check_data_files),
    ('pairing', check_paired_pipeline),
    ('dataloader', check_dataloader_args),
    ('batch', check_batch_size),
    ('amp', check_amp),
    ('checkpoint', check_checkpoints),
    ('work_dir', check_work_dir),
    ('visualizer', check_vis_backends),
    ('distributed', check_distributed),
    ('guards', check_guards),
]


def run_preflight(cfg,
                  launcher: Optional[str] = None,
                  samples: int = 4,
                  skip: Sequence[str] = (),
                  system: Optional[str] = None,
                  full_index: bool = False) -> PreflightReport:
    """Run every preflight check on ``cfg``.

    Nothing is trained and nothing runs forward: the model is built on CPU,
    each dataset indexes its annotations, a few items are opened and one
    goes through the pipeline.

    Args:
        cfg (Config): the config as ``tools/train.py`` resolves it
            (``build_cfg(args)``: ``--cfg-options``, ``--work-dir``,
            ``--amp`` and ``--resume`` applied).
        launcher (str, optional): ``'none'``, ``'pytorch'``, ``'slurm'``,
            ``'mpi'``. Defaults to ``cfg.launcher`` or ``'none'``.
        samples (int): items to open per dataset. Defaults to 4.
        skip (Sequence[str]): names of checks to leave out (see
            :data:`CHECKS`).
        system (str, optional): ``platform.system()`` to assume; for tests.
        full_index (bool): build each dataset's whole index as training
            does. By default datasets with one annotation file per image
            (LLVIP, VOC) index only the sampled images.

    Returns:
        PreflightReport: ``report.has_errors`` tells whether training must
        not start; ``str(report)`` is the table.

    A check that itself fails (a bug in the check, or an unexpected config
    shape) yields an error row naming the exception and the ``skip`` name:
    nothing is swallowed.
    """
    launcher = launcher or cfg.get('launcher', None) or 'none'
    ctx = PreflightContext(cfg, launcher=launcher, samples=samples,
                           system=system, full_index=full_index)
    report = PreflightReport(config=getattr(cfg, 'filename', '') or '',
                             launcher=launcher)
    start = time.perf_counter()
    for name, check in CHECKS:
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            for row in check(ctx):
                report.add(row)
        except Exception as err:
            report.add(CheckRow(
                'error', name, f'The {name} check failed: '
                f'{type(err).__name__}: {err}', '',
                f'This is a preflight bug or an unusual config; skip this '
                f'check with --skip {name} and report it.'))
        report.timings[name] = time.perf_counter() - t0
    report.seconds = time.perf_counter() - start
    return report


def _is_main_process() -> bool:
    return int(os.environ.get('RANK', os.environ.get('LOCAL_RANK', 0))) == 0


def preflight_gate(cfg,
                   launcher: Optional[str] = None,
                   strict: bool = True,
                   stream=None,
                   opt_out: str = '--ignore-preflight-errors'
                   ) -> PreflightReport:
    """Run the checks before training; refuse to start on errors.

    Every rank runs the checks (they are deterministic and cheap), so every
    rank refuses together; only rank 0 prints the table.

    Args:
        cfg (Config): the resolved config (``build_cfg(args)``).
        launcher (str, optional): the ``--launcher`` of the run.
        strict (bool): raise ``SystemExit(1)`` when a row is an error.
            ``False`` prints the errors and lets training start.
        stream: where to print (default ``sys.stdout``).
        opt_out (str): the command-line flag that starts anyway, named in
            the refusal.

    Returns:
        PreflightReport: when training may start.
    """
    report = run_preflight(cfg, launcher)
    if _is_main_process():
        report.print(stream or sys.stdout)
    if report.has_errors and strict:
        raise SystemExit(
            f'[mmsafe] preflight found {len(report.errors)} error(s); '
            f'training was not started. Fix them, or start anyway with '
            f'{opt_out}.')
    return report
