"""The fuzzer (tests/checkpoint/fuzz.py) on real checkpoints: a bounded run
here; ``MMSAFE_FUZZ_CASES`` / ``MMSAFE_FUZZ_SECONDS`` make it longer (or
``python -m tests.checkpoint.fuzz --seconds N``)."""
import os
import random

import torch

import mmsafe  # noqa: F401
from tests.checkpoint import fuzz

CASES = int(os.environ.get('MMSAFE_FUZZ_CASES', 250))
SECONDS = float(os.environ.get('MMSAFE_FUZZ_SECONDS', 4))


def test_mutated_checkpoints_load_as_data_or_are_refused(tmp_path):
    seed = str(tmp_path / 'seed.pth')
    torch.save(fuzz.runner_like_checkpoint(), seed)
    report = fuzz.fuzz([seed], CASES, SECONDS, str(tmp_path / 'fuzz'),
                       rng_seed=int(os.environ.get('MMSAFE_FUZZ_SEED', 0)))
    print(report)
    assert report.cases >= min(CASES, 50), report
    assert not report.findings, report
    assert report.outcomes['refused'] and report.outcomes['same'], report


def test_the_oracle_sees_what_it_must(tmp_path):
    """The fuzzer's own checks: non-data and a differing state are told
    apart from the original."""
    import collections

    import numpy as np
    assert fuzz.plain_data_problem(dict(a=[1, np.ones(2)])) is None
    assert 'object' in fuzz.plain_data_problem(
        np.array([None], dtype=object))
    assert fuzz.plain_data_problem(dict(f=print)) == \
        'a builtins.builtin_function_or_method'
    shadow = collections.OrderedDict()
    vars(shadow)['items'] = 1
    assert fuzz.plain_data_problem(shadow) == 'an OrderedDict with attributes'
    hooked = torch.ones(1)
    hooked.note = 1
    assert fuzz.plain_data_problem(hooked)
    assert fuzz.same_data(dict(a=torch.ones(2)), dict(a=torch.ones(2)))
    assert not fuzz.same_data(dict(a=torch.ones(2)),
                              dict(a=torch.ones(2, dtype=torch.float64)))
    # every mutation kind yields bytes that differ from the original
    raw = open(_seed(tmp_path), 'rb').read()
    rng = random.Random(1)
    kinds = set()
    for _ in range(200):
        what, mutant = fuzz.mutate_file(rng, raw)
        kinds.add(what.split(' ')[0])
        assert mutant != raw or 'truncated at' in what, what
    assert {'pickle', 'record', 'file'} <= kinds, kinds


def _seed(tmp_path):
    path = str(tmp_path / 'seed.pth')
    torch.save(fuzz.runner_like_checkpoint(), path)
    return path
