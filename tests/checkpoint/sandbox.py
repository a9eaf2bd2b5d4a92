"""Run checkpoint payloads in a sandboxed subprocess
(``tests/checkpoint/sandbox_child.py``) and collect what happened to each:
the outcome of its load, whether its marker file appeared, whether its
watched file or MessageHub's statistics changed, what it printed.

A payload during which the child died (a crash, a kill at the overall
timeout) has the outcome ``'crashed'`` or ``'killed'``; the payloads after
it are run again in a fresh child, so one crash hides nothing.
"""
import json
import os
import os.path as osp
import sys
from typing import Dict, Optional

from tests.checkpoint.payloads import watched_state
from tests.utils import REPO_ROOT, run_command

CHILD = osp.join(osp.dirname(osp.abspath(__file__)), 'sandbox_child.py')


def run_sandbox(payloads: Dict[str, dict], mode: str, folder: str,
                root: str = REPO_ROOT, python: Optional[str] = None,
                timeout: float = 300) -> Dict[str, dict]:
    """Load each of ``payloads`` (from :func:`payloads.write_all`) in
    sandboxed children; name -> record (see the module docstring)."""
    records: Dict[str, dict] = {}
    initial = {name: watched_state(item['watched'])
               for name, item in payloads.items()}
    left = dict(payloads)
    round_no = 0
    while left:
        round_no += 1
        spec = osp.join(folder, f'spec_{mode}_{round_no}.json')
        out = osp.join(folder, f'out_{mode}_{round_no}.jsonl')
        with open(spec, 'w') as f:
            json.dump(left, f)
        result = run_command([python or sys.executable, CHILD, spec, out,
                              mode, root], timeout=timeout,
                             env=dict(PYTHONPATH=root + os.pathsep +
                                      REPO_ROOT))
        done = []
        if osp.exists(out):
            with open(out) as f:
                done = [json.loads(line) for line in f if line.strip()]
        printed = _printed_by_payload(result.output)
        for record in done:
            record['printed'] = printed.get(record['name'], '')
            records[record['name']] = record
            left.pop(record['name'], None)
        if not left:
            break
        # the child died during the first payload it did not report
        victim = next(iter(left))
        records[victim] = dict(
            name=victim, outcome='killed' if result.timed_out else 'crashed',
            returncode=result.returncode,
            printed=printed.get(victim, result.output[-2000:]),
            marker=osp.exists(payloads[victim]['marker']))
        left.pop(victim)
    for name, record in records.items():
        record['watched_changed'] = \
            watched_state(payloads[name]['watched']) != initial[name]
    return records


def _printed_by_payload(output: str) -> Dict[str, str]:
    found: Dict[str, str] = {}
    current = None
    for line in output.splitlines():
        if line.startswith('### '):
            current = line[4:].strip()
            found[current] = ''
        elif current is not None:
            found[current] += line + '\n'
    return found
