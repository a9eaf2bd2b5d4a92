"""A fuzzer for mmsafe's checkpoint loader.

It mutates real checkpoints (``torch.save`` of what an MMEngine runner
saves, or the files of a real run) at the opcode level of their pickle
and at the record level of their zip container, loads each mutant with
:func:`mmsafe.checkpoint.load_checkpoint_file` (read and memory-mapped in
turn) and checks the outcome:

* a refusal: :class:`~mmsafe.checkpoint.UntrustedCheckpointError` or
  :class:`~mmsafe.checkpoint.CheckpointFormatError`;
* or a result that is plain data (checked here independently of the
  loader's own check): the original state, or other plain data (a mutated
  number in the pickle is still a checkpoint);
* and never another exception, a load longer than :data:`CASE_SECONDS`,
  a change of the process (MessageHub's statistics table, the imported
  modules, the working directory) or of the file system (the fuzz
  folder's listing).

A finding is ``(mutation, what happened)``; the mutant is kept under
``findings/`` for a rerun. From the command line (longer runs)::

    python -m tests.checkpoint.fuzz --seconds 600 [--files A.pth ...]
"""
import argparse
import collections
import io
import os
import os.path as osp
import pickletools
import random
import signal
import sys
import tempfile
import time
import warnings
import zipfile
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch

CASE_SECONDS = 10
_OPCODES = [op.code.encode('latin-1') for op in pickletools.opcodes]
_INT_ARGS = ('BININT', 'BININT1', 'BININT2', 'LONG1', 'BINPUT', 'BINGET',
             'LONG_BINPUT', 'LONG_BINGET')
_BOUNDARY_INTS = (0, 1, -1, 255, 65535, 2**31 - 1, -2**31, 2**40, 2**62,
                  2**63, 2**64 + 3)


# ---------------------------------------------------------------- seeds --
def runner_like_checkpoint() -> dict:
    """What MMEngine's ``Runner.save_checkpoint`` writes, built from real
    MMEngine objects: a model's state dict (with ``_metadata``), SGD with
    momentum after a step, two parameter schedulers, the message hub (its
    HistoryBuffers, numpy scalars and arrays), and meta."""
    from mmengine.logging import MessageHub
    from mmengine.optim import LinearLR, MultiStepLR
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3),
                                torch.nn.BatchNorm2d(4),
                                torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3, 4, 4)).sum().backward()
    optimizer.step()
    schedulers = [LinearLR(optimizer, start_factor=0.5, end=2),
                  MultiStepLR(optimizer, milestones=[3, 5])]
    hub = MessageHub.get_instance('mmsafe-fuzz-seed')
    for step in range(3):
        hub.update_scalar('train/loss', 1.0 / (step + 1))
        hub.update_scalar('train/lr', 0.1)
    hub.update_info('iter', 3)
    hub.update_info('seed_array', np.arange(4, dtype=np.int64))
    hub.update_info('scale', np.float32(0.5))
    return dict(
        meta=dict(epoch=1, iter=3, seed=np.int64(7), cfg='model = dict()',
                  dataset_meta=dict(classes=('person', 'car'),
                                    palette=[(220, 20, 60), (0, 0, 142)]),
                  mmengine_version='0.10.7'),
        state_dict=model.state_dict(),
        optimizer=optimizer.state_dict(),
        param_schedulers=[s.state_dict() for s in schedulers],
        message_hub=hub.state_dict())


# ------------------------------------------------------------- mutation --
def _ops(data: bytes) -> List[Tuple[int, int, str]]:
    """(start, end, name) of every opcode of ``data`` that parses."""
    found = []
    try:
        ops = list(pickletools.genops(data))
    except Exception:  # a mutant: take the prefix that parsed
        ops = []
    for i, (op, _, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(data)
        found.append((pos, end, op.name))
    return found


def _int_op(name: str, value: int) -> bytes:
    if name in ('BINPUT', 'BINGET'):
        return (b'q' if name == 'BINPUT' else b'h') + bytes([value % 256])
    if name in ('LONG_BINPUT', 'LONG_BINGET'):
        return (b'r' if name == 'LONG_BINPUT' else b'j') + \
            (value % 2**32).to_bytes(4, 'little')
    if -2**31 <= value < 2**31:
        return b'J' + value.to_bytes(4, 'little', signed=True)
    raw = value.to_bytes((value.bit_length() + 8) // 8, 'little', signed=True)
    return b'\x8a' + bytes([len(raw)]) + raw


def mutate_pickle(rng: random.Random, data: bytes) -> Tuple[str, bytes]:
    """One opcode-level mutation of a pickle."""
    ops = _ops(data)
    kind = rng.choice(['byte', 'opcode', 'drop', 'dup', 'int', 'swap',
                       'truncate', 'insert', 'splice'])
    if not ops or kind == 'byte':
        at = rng.randrange(len(data))
        return f'pickle byte {at} -> random', \
            data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
    start, end, name = rng.choice(ops)
    if kind == 'opcode':
        code = rng.choice(_OPCODES)
        return f'pickle {name}@{start} -> opcode {code!r}', \
            data[:start] + code + data[start + 1:]
    if kind == 'drop':
        return f'pickle drop {name}@{start}', data[:start] + data[end:]
    if kind == 'dup':
        return f'pickle dup {name}@{start}', \
            data[:end] + data[start:end] + data[end:]
    if kind == 'int':
        ints = [op for op in ops if op[2] in _INT_ARGS]
        if ints:
            start, end, name = rng.choice(ints)
            value = rng.choice(_BOUNDARY_INTS)
            return f'pickle {name}@{start} = {value}', \
                data[:start] + _int_op(name, value) + data[end:]
    if kind == 'swap':
        s2, e2, n2 = rng.choice(ops)
        if s2 > end:
            return f'pickle swap {name}@{start} {n2}@{s2}', (
                data[:start] + data[s2:e2] + data[end:s2] +
                data[start:end] + data[e2:])
    if kind == 'truncate':
        return f'pickle truncated at {start}', data[:start]
    if kind == 'insert':
        code = rng.choice(_OPCODES) + bytes(
            rng.randrange(256) for _ in range(rng.randrange(9)))
        return f'pickle insert {code!r}@{start}', \
            data[:start] + code + data[start:]
    a, b = sorted(rng.randrange(len(data)) for _ in range(2))
    return f'pickle splice [{a}:{b}]@{start}', \
        data[:start] + data[a:b] + data[start:]


def _records(raw: bytes) -> List[Tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        return [(i.filename, archive.read(i)) for i in archive.infolist()]


def write_zip(records: List[Tuple[str, bytes]],
              compress: Optional[str] = None) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # a duplicate name, on purpose
        with zipfile.ZipFile(buffer, 'w', zipfile.ZIP_STORED) as archive:
            for name, data in records:
                archive.writestr(name, data, zipfile.ZIP_DEFLATED
                                 if name == compress else zipfile.ZIP_STORED)
    return buffer.getvalue()


def mutate_file(rng: random.Random, raw: bytes) -> Tuple[str, bytes]:
    """One mutation of a checkpoint file: of its pickle (records rewritten
    with valid CRCs, so that the unpickler sees it) or of its records."""
    records = _records(raw)
    folder = records[0][0].split('/')[0]
    kind = rng.choice(['pickle'] * 6 + [
        'size', 'drop', 'rename', 'duplicate', 'byteorder', 'version',
        'extra', 'flip', 'truncate', 'compress', 'prefix'])
    if kind == 'pickle':
        index = [n for n, _ in records].index(f'{folder}/data.pkl')
        what, pkl = mutate_pickle(rng, records[index][1])
        records[index] = (records[index][0], pkl)
        return what, write_zip(records)
    storages = [i for i, (n, _) in enumerate(records) if '/data/' in n]
    if kind == 'size' and storages:
        i = rng.choice(storages)
        name, data = records[i]
        delta = rng.choice([-4, -1, 1, 4, len(data)])
        data = data[:max(0, len(data) + delta)] if delta < 0 else \
            data + bytes(delta)
        records[i] = (name, data)
        return f'record {name} size {delta:+d}', write_zip(records)
    if kind == 'drop':
        i = rng.randrange(len(records))
        return f'record {records[i][0]} dropped', \
            write_zip(records[:i] + records[i + 1:])
    if kind == 'rename':
        i = rng.randrange(len(records))
        name = records[i][0]
        records[i] = (name + rng.choice(['0', 'x', '/', '.py']), records[i][1])
        return f'record {name} renamed', write_zip(records)
    if kind == 'duplicate':
        i = rng.randrange(len(records))
        return f'record {records[i][0]} twice', \
            write_zip(records + [records[i]])
    if kind in ('byteorder', 'version'):
        value = rng.choice([b'big', b'', b'x' * 20, b'99\n', b'-1', b'3'])
        records = [(n, value if n.endswith('/' + kind) else d)
                   for n, d in records]
        return f'record {kind} = {value!r}', write_zip(records)
    if kind == 'extra':
        extra = rng.choice(['constants.pkl', 'code/x.py', 'extra/a',
                            'data/999', '.data/version', 'other'])
        return f'extra record {extra}', \
            write_zip(records + [(f'{folder}/{extra}', b'xx')])
    if kind == 'compress':
        name = rng.choice(records)[0]
        return f'record {name} deflated', write_zip(records, compress=name)
    if kind == 'prefix':
        return 'bytes before the first record', b'\x00' * 16 + raw
    if kind == 'truncate':
        at = rng.randrange(len(raw))
        return f'file truncated at {at}', raw[:at]
    at = rng.randrange(len(raw))
    return f'file byte {at} flipped', \
        raw[:at] + bytes([raw[at] ^ (1 << rng.randrange(8))]) + raw[at + 1:]


# --------------------------------------------------------------- oracle --
def plain_data_problem(obj: Any, depth: int = 0,
                       seen: Optional[set] = None) -> Optional[str]:
    """Why ``obj`` is not plain data (None when it is); written apart from
    the loader's own check."""
    from mmengine.logging import HistoryBuffer
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    if depth > 100:
        return 'nested deeper than 100'
    kind = type(obj)
    if kind in (type(None), bool, int, float, complex, str, bytes,
                bytearray, torch.dtype, torch.device, torch.Size):
        return None
    if kind in (torch.Tensor, torch.nn.Parameter):
        if obj._backward_hooks or vars(obj):
            return 'a tensor with hooks or attributes'
        return None
    if isinstance(obj, (np.ndarray, np.generic, np.dtype)):
        dtype = obj if isinstance(obj, np.dtype) else obj.dtype
        if kind is not np.ndarray and not isinstance(obj, (np.generic,
                                                           np.dtype)):
            return f'an ndarray subclass {kind}'
        return f'numpy {dtype}' if dtype.hasobject or dtype.names else None
    if kind is HistoryBuffer:
        logs, counts = obj.data
        return None if isinstance(logs, np.ndarray) and \
            isinstance(counts, np.ndarray) else 'a HistoryBuffer without data'
    if kind in (dict, collections.OrderedDict, collections.Counter):
        if set(vars(obj) if kind is collections.OrderedDict else ()) - {
                '_metadata'}:
            return 'an OrderedDict with attributes'
        for key, value in obj.items():
            problem = plain_data_problem(key, depth + 1, seen) or \
                plain_data_problem(value, depth + 1, seen)
            if problem:
                return problem
        return None
    if kind in (list, tuple, set, frozenset):
        for item in obj:
            problem = plain_data_problem(item, depth + 1, seen)
            if problem:
                return problem
        return None
    return f'a {kind.__module__}.{kind.__qualname__}'


def same_data(a: Any, b: Any) -> bool:
    """Whether two loaded checkpoints hold the same data."""
    from mmengine.logging import HistoryBuffer
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or \
                a.stride() != b.stride():
            return False
        try:
            return torch.equal(a, b)
        except (RuntimeError, NotImplementedError):  # bits, float8 ...
            return a.storage_offset() == b.storage_offset() and bytes(
                a.untyped_storage()) == bytes(b.untyped_storage())
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and \
            bool(np.array_equal(a, b))
    if isinstance(a, HistoryBuffer):
        return all(same_data(x, y) for x, y in zip(a.data, b.data))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_data(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same_data, a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


def process_state() -> tuple:
    """What a load must not change in the process."""
    from mmengine.logging import HistoryBuffer
    return (tuple((k, id(v)) for k, v in
                  HistoryBuffer._statistics_methods.items()),
            len(sys.modules), os.getcwd(), torch.get_default_dtype())


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


class Report:
    """What a fuzz run found."""

    def __init__(self):
        self.cases = 0
        self.outcomes: collections.Counter = collections.Counter()
        self.findings: List[Tuple[str, str]] = []
        self.seconds = 0.0

    def __str__(self) -> str:
        lines = [f'{self.cases} cases in {self.seconds:.1f} s: '
                 f'{dict(self.outcomes)}; {len(self.findings)} findings']
        lines += [f'  {what}: {problem}' for what, problem in self.findings]
        return '\n'.join(lines)


def fuzz(seeds: List[str], cases: int, seconds: float, folder: str,
         rng_seed: int = 0, load: Optional[Callable] = None) -> Report:
    """Run up to ``cases`` mutants (or until ``seconds`` passed) of the
    checkpoint files ``seeds``; mutants and findings go under ``folder``."""
    from mmsafe.checkpoint import (CheckpointFormatError,
                                   UntrustedCheckpointError,
                                   load_checkpoint_file)
    load = load or load_checkpoint_file
    refusals = (UntrustedCheckpointError, CheckpointFormatError)
    rng = random.Random(rng_seed)
    originals = []
    for path in seeds:
        with open(path, 'rb') as f:
            originals.append((f.read(), load(path, map_location='cpu')))
    work = osp.join(folder, 'case')
    os.makedirs(work, exist_ok=True)
    report = Report()
    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    try:
        while report.cases < cases and time.monotonic() - start < seconds:
            raw, expected = rng.choice(originals)
            what, mutant = mutate_file(rng, raw)
            path = osp.join(work, 'mutant.pth')
            with open(path, 'wb') as f:
                f.write(mutant)
            listing = sorted(os.listdir(folder)), sorted(os.listdir(work))
            before = process_state()
            outcome, problem = _one(load, path, report.cases % 2 == 1,
                                    expected, refusals)
            if process_state() != before:
                problem = 'the process state changed'
            elif (sorted(os.listdir(folder)), sorted(os.listdir(work))) != \
                    listing:
                problem = 'the file system changed'
            report.cases += 1
            report.outcomes[outcome] += 1
            if problem:
                report.findings.append((what, problem))
                keep = osp.join(folder, 'findings')
                os.makedirs(keep, exist_ok=True)
                os.replace(path, osp.join(
                    keep, f'finding_{len(report.findings)}.pth'))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
    report.seconds = time.monotonic() - start
    return report


def _one(load: Callable, path: str, mmap: bool, expected: Any,
         refusals: tuple) -> Tuple[str, Optional[str]]:
    signal.alarm(CASE_SECONDS)
    try:
        result = load(path, map_location='cpu', mmap=mmap)
    except refusals:
        return 'refused', None
    except _Timeout:
        return 'hang', f'no answer within {CASE_SECONDS} s'
    except Exception as err:  # a finding: reported, with the mutation
        return 'error', f'{type(err).__name__}: {str(err)[:300]}'
    finally:
        signal.alarm(0)
    problem = plain_data_problem(result)
    if problem:
        return 'non-data', problem
    return ('same' if same_data(result, expected) else 'other plain data',
            None)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--cases', type=int, default=10**9)
    parser.add_argument('--seconds', type=float, default=60)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--files', nargs='*', default=[],
                        help='checkpoints to mutate (default: a '
                        'runner-like checkpoint saved here)')
    args = parser.parse_args(argv)
    import mmsafe  # noqa: F401
    folder = tempfile.mkdtemp(prefix='mmsafe-fuzz-')
    seeds = list(args.files)
    if not seeds:
        seeds = [osp.join(folder, 'seed.pth')]
        torch.save(runner_like_checkpoint(), seeds[0])
    report = fuzz(seeds, args.cases, args.seconds, folder, args.seed)
    print(report)
    print(f'mutants of the findings: {folder}/findings')
    return 1 if report.findings else 0


if __name__ == '__main__':
    sys.exit(main())
