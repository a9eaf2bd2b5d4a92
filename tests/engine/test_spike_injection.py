"""Out-of-range images in real training: raw 16-bit infrared frames among
8-bit ones (``tests/engine/spike_toys.py``), on the demo detector with the
LLVIP recipe's BatchNorm setting and optimizer (``tests/engine/
spike_runs.py``), through ``tools/train.py``.

* without the spike skip the gradient norm jumps at each faulty batch, the
  loss follows and the final mAP50 falls far below the clean run's;
* with it (``mmsafe_spike_skip``) exactly those steps are skipped, on
  every rank, each naming the faulty file and its value range, and the
  final mAP50 is within noise of the clean run's, where nothing is skipped;
* the safety report lists the faulty files as repeated offenders, and
  ``tools/check_dataset.py --files`` takes the run's event log.
"""
import json
import os.path as osp
import statistics

import pytest

from mmsafe.events import read_events
from tests.engine import spike_runs as runs
from tests.utils import logged_messages

SINGLE = runs.faulty_samples(world=1, max_iters=runs.MAX_ITERS)
STEMS = [runs.stem(i) for i in SINGLE]
# iterations (1-based, as logged) whose batch holds a faulty image
FAULTY_ITERS = sorted(it + 1 for occ in SINGLE.values() for _, it in occ)
# the first time each faulty image comes
FIRST_ITERS = sorted(min(it for _, it in occ) + 1 for occ in SINGLE.values())
SPIKE = f'dict(window={runs.WINDOW})'

DDP_ITERS = 75
DDP = runs.faulty_samples(world=2, max_iters=DDP_ITERS, count=2,
                          min_occurrences=1)


def clean_run():
    return runs.train('clean', [], SPIKE)


def unguarded_run():
    return runs.train('unguarded', STEMS, 'False')


def guarded_run():
    return runs.train('guarded', STEMS, SPIKE)


def ok(run):
    work_dir, result = run
    assert not result.timed_out, result
    assert result.returncode == 0, result
    return work_dir, result


# the control: what the fault does without the guard does not depend on
# the stack (run at one end, tests/conftest.py)
@pytest.mark.one_end
@pytest.mark.timeout(900)
def test_without_the_skip_the_gradient_jumps_and_the_loss_follows():
    _, clean = ok(clean_run())
    _, bad = ok(unguarded_run())
    norms = runs.per_iteration(bad, 'grad_norm')
    losses = runs.per_iteration(bad, 'loss')
    clean_losses = runs.per_iteration(clean, 'loss')
    healthy = statistics.median(v for it, v in norms.items()
                                if it < FIRST_ITERS[0])
    # each faulty image, the first time it comes: the gradient jumps
    for it in FIRST_ITERS:
        assert norms[it] > 20 * healthy, (it, norms[it], healthy)
        assert losses[it] > 3 * clean_losses[it], (it, losses[it])
    # the loss follows: from the first faulty batch on, the run trains
    # worse than the clean run on the same data in the same order, and it
    # ends far below it
    later = range(FIRST_ITERS[0] + 1, runs.MAX_ITERS + 1)
    assert statistics.mean(losses[i] for i in later) > \
        1.1 * statistics.mean(clean_losses[i] for i in later)
    assert runs.map50(bad) < runs.map50(clean) - 0.2, (
        runs.map50(bad), runs.map50(clean))


@pytest.mark.timeout(900)
def test_spikes_are_skipped_named_and_the_run_ends_as_the_clean_one():
    clean_dir, clean = ok(clean_run())
    work_dir, guarded = ok(guarded_run())
    # a healthy run of the same recipe: nothing skipped
    assert not read_events(clean_dir, 'step_skip'), clean
    events = read_events(work_dir, 'step_skip')
    assert sorted(e['iter'] + 1 for e in events) == FAULTY_ITERS, events
    for event in events:
        assert event['reasons'] == ['grad_spike']
        spike = event['spike']
        assert spike['steps'] == runs.WINDOW and spike['ratio'] > 20
        faulty = [img for img in event['images']
                  if any(s in img['file'] for s in STEMS)]
        assert len(faulty) == 1, event['images']
        # the raw counts, as loaded, in the summary
        assert faulty[0]['range']['infrared'][1] > 50000
        assert faulty[0]['range']['visible'][1] <= 255
        others = [img for img in event['images'] if img is not faulty[0]]
        assert all(img['range']['infrared'][1] <= 255 for img in others)
    assert 'the gradient norm' in guarded.output and \
        'standard deviations above the mean' in guarded.output
    assert abs(runs.map50(guarded) - runs.map50(clean)) <= 0.05, (
        runs.map50(guarded), runs.map50(clean))
    # the report lists the faulty files: named at both passes
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    offenders = report['repeated_offenders']
    named = {o['file'] for o in offenders if o['skips'] >= 2}
    for s in STEMS:
        assert any(f'/{s}.jpg' in name for name in named), offenders
    assert 'repeat offenders' in guarded.output


@pytest.mark.timeout(900)
def test_check_dataset_takes_the_runs_event_log():
    from mmsafe.tools.check_dataset import main
    work_dir, _ = ok(guarded_run())
    with logged_messages() as messages:
        code = main([runs.DEMO, '--cfg-options',
                     f'train_dataloader.dataset.data_root={runs.data_root()}',
                     '--files', osp.join(work_dir, 'mmsafe_events.jsonl'),
                     '--workers', '0', '--no-progress', '--no-alignment'])
    assert code == 0, messages
    skipped = {f for e in read_events(work_dir, 'step_skip')
               for f in e['files']}
    assert any(f'{len(skipped)} samples of the train split named in' in m
               for m in messages), messages


@pytest.mark.timeout(900)
def test_ddp_both_ranks_skip_the_same_steps_and_name_every_rank():
    stems = [runs.stem(i) for i in DDP]
    work_dir, result = ok(runs.train('ddp', stems, SPIKE, nproc=2,
                                     max_iters=DDP_ITERS))
    events = read_events(work_dir, 'step_skip')
    expected = sorted({it + 1 for occ in DDP.values() for _, it in occ})
    for rank in (0, 1):
        mine = sorted(e['iter'] + 1 for e in events if e['rank'] == rank)
        assert mine == expected, (rank, events)
    for index, occurrences in DDP.items():
        for rank, it in occurrences:
            event = [e for e in events
                     if e['rank'] == rank and e['iter'] == it][0]
            assert any(f'/{runs.stem(index)}.jpg' in f
                       for f in event['files']), event
            # rank 0's log names the faulty file, whichever rank loaded it
            line = [ln for ln in result.output.splitlines()
                    if f'skipped the optimizer step of Iter(train) {it + 1} '
                    in ln]
            assert line and f'rank {rank}: loss=' in line[0]
            assert f'/{runs.stem(index)}.jpg' in line[0]
