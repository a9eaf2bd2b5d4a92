"""Load checkpoint payloads the way training does, in a process of its own
with memory and time limits; one JSON line per payload.

Run by :func:`tests.checkpoint.sandbox.run_sandbox` (never imported by the
tests)::

    python tests/checkpoint/sandbox_child.py SPEC.json OUT.jsonl MODE ROOT

``ROOT`` is the mmsafe checkout to load with (first on ``sys.path``), so
that the same payloads can be measured against another checkout. ``MODE``:

* ``loader``: MMEngine's ``_load_checkpoint`` through the CheckpointLoader
  schemes that SafeRunner registers, in SafeRunner's trust context (what
  ``load_from``, ``--resume PATH``, ``tools/test.py`` and pretrained
  weights do);
* ``resume``: the payload as the only checkpoint of a work dir
  (``epoch_1.pth`` named by ``last_checkpoint``), found by auto-resume,
  then loaded (what ``--resume`` does);
* ``convert``: ``tools/convert_checkpoint.py``'s conversion (the output
  must not appear for a refused file).

Before each payload a line ``### <name>`` goes to stdout (a payload's own
output follows it); the address space is limited to what the imports
took plus ``MEM_HEADROOM``; a load that takes longer than
``PER_PAYLOAD_S`` is interrupted.
"""
import json
import os
import os.path as osp
import resource
import shutil
import signal
import stat
import sys
import time

MEM_HEADROOM = 3 << 30
PER_PAYLOAD_S = 20


def _vm_size() -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmSize:'):
                return int(line.split()[1]) * 1024
    return 0


def _watched(path: str) -> list:
    info = os.stat(path)
    with open(path, 'rb') as f:
        return [info.st_mode, info.st_uid, info.st_gid, info.st_mtime,
                f.read().decode('latin-1')]


def _summary(obj) -> dict:
    """What came back: the type of each top-level value and whether
    anything in it is not plain data."""
    import collections

    import numpy as np
    import torch
    kinds = {}
    notes = []
    items = obj.items() if isinstance(obj, dict) else [('', obj)]
    for key, value in items:
        kind = type(value)
        kinds[str(key)] = f'{kind.__module__}.{kind.__qualname__}'
        if isinstance(value, np.ndarray) and value.dtype.hasobject:
            notes.append(f'{key}: object array')
        if isinstance(value, np.dtype) and value.hasobject:
            notes.append(f'{key}: object dtype')
        if isinstance(value, torch.Tensor) and (
                getattr(value, '_backward_hooks', None) or vars(value)):
            notes.append(f'{key}: tensor with hooks or attributes')
        if isinstance(value, collections.OrderedDict) and \
                set(vars(value)) - {'_metadata'}:
            notes.append(f'{key}: OrderedDict attributes '
                         f'{sorted(vars(value))}')
    return dict(kinds=kinds, notes=notes)


def _register():
    import mmsafe.checkpoint as ckpt
    if hasattr(ckpt, 'register_checkpoint_schemes'):
        ckpt.register_checkpoint_schemes()
    else:  # an older checkout
        ckpt.register_local_weights_only_scheme()
        ckpt.register_remote_weight_schemes()


def _load(path: str, mode: str, scratch: str):
    from mmengine.runner.checkpoint import _load_checkpoint

    from mmsafe.checkpoint import (explain_refusals,
                                   find_latest_loadable_checkpoint,
                                   trusted_checkpoint_globals)
    target = path
    if mode == 'convert':
        from mmsafe.checkpoint.convert import convert_checkpoint
        out = osp.join(scratch, osp.basename(path) + '.converted')
        try:
            return dict(converted=convert_checkpoint(path, out)[1])
        finally:
            if osp.exists(out):
                raise AssertionError(f'{out} was written')
    if mode == 'resume':
        work_dir = osp.join(scratch, 'work_' + osp.basename(path))
        os.makedirs(work_dir)
        target = osp.join(work_dir, 'epoch_1.pth')
        if stat.S_ISFIFO(os.stat(path).st_mode):
            os.mkfifo(target)
        else:
            shutil.copyfile(path, target)
        with open(osp.join(work_dir, 'last_checkpoint'), 'w') as f:
            f.write(target)
        with trusted_checkpoint_globals(), explain_refusals(work_dir):
            target = find_latest_loadable_checkpoint(work_dir)
    with trusted_checkpoint_globals(), explain_refusals(target):
        return _load_checkpoint(target, map_location='cpu')


def _timeout(signum, frame):
    raise TimeoutError(f'the load took more than {PER_PAYLOAD_S} s')


def main(spec_file: str, out_file: str, mode: str, root: str) -> None:
    sys.path.insert(0, root)
    with open(spec_file) as f:
        spec = json.load(f)
    import torch  # noqa: F401
    import mmsafe  # noqa: F401
    from mmengine.logging import HistoryBuffer
    _register()
    HistoryBuffer()  # the built-in statistics, as any run has them
    limit = _vm_size() + MEM_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _timeout)
    scratch = osp.join(osp.dirname(out_file), f'scratch_{mode}')
    os.makedirs(scratch, exist_ok=True)
    with open(out_file, 'a') as out:
        for name, item in spec.items():
            print(f'### {name}', flush=True)
            table = {k: id(v) for k, v in
                     HistoryBuffer._statistics_methods.items()}
            before = _watched(item['watched'])
            saved_env = {k: os.environ.get(k) for k in item['env']}
            os.environ.update(item['env'])
            record = dict(name=name)
            start = time.monotonic()
            signal.alarm(PER_PAYLOAD_S)
            try:
                record.update(outcome='loaded',
                              result=_summary(_load(item['path'], mode,
                                                    scratch)))
            except TimeoutError as err:
                record.update(outcome='timeout', error=str(err))
            except MemoryError as err:
                record.update(outcome='memory', error=repr(err)[:300])
            except Exception as err:  # recorded for the test to judge
                record.update(outcome='error', type=type(err).__name__,
                              error=str(err)[:1500])
            finally:
                signal.alarm(0)
                for key, value in saved_env.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
            record['seconds'] = round(time.monotonic() - start, 3)
            record['marker'] = osp.exists(item['marker'])
            record['watched_changed'] = _watched(item['watched']) != before
            record['statistics_changed'] = table != {
                k: id(v) for k, v in HistoryBuffer._statistics_methods.items()}
            out.write(json.dumps(record) + '\n')
            out.flush()


if __name__ == '__main__':
    main(*sys.argv[1:5])
