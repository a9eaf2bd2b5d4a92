"""No transform of a paired pipeline moves or mixes one modality only.

MMDetection's ``RandomFlip`` placed in a visible + infrared pipeline flips
the visible image and its boxes, never the infrared one, and training goes
on without a sign. The dataset refuses such a pipeline when it is built;
this check finds it from the config, in every dataloader, with the config
path of the step and the paired transform to use instead (see
:mod:`mmsafe.datasets.pipeline_check`).
"""
from typing import Iterator

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'pairing'


def check_paired_pipeline(ctx: PreflightContext) -> Iterator[CheckRow]:
    """One error row per transform that breaks the pairing."""
    from mmengine.registry import init_default_scope
    from mmsafe.datasets.pipeline_check import config_pipeline_problems
    init_default_scope(ctx.default_scope)
    checked = errors = 0
    for name, loader in ctx.dataloaders():
        dataset = loader.get('dataset')
        if not isinstance(dataset, dict):
            continue
        checked += 1
        for problem in config_pipeline_problems(dataset, f'{name}.dataset'):
            where, _, what = problem.partition(': ')
            where = where.split(' ')[0]
            errors += 1
            yield CheckRow(
                'error', NAME, what, where,
                what.split('Fix: ')[-1] if 'Fix: ' in what else
                'Use the Paired* transforms (or PairedGeometric) for every '
                'geometric step; ModalityTransform only for photometric '
                'ones.')
    if checked and not errors:
        yield CheckRow('ok', NAME, 'No transform moves or mixes one modality '
                       f'only ({checked} dataloader pipeline(s) checked).')
