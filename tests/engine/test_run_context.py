"""run_context(runner): the runner's own context (SafeRunner's), or one of
local defaults per plain runner, kept while that runner lives and never set
on it; the crash protocol asks the hooks that define its methods, in hook
order."""
import gc
import weakref
from types import SimpleNamespace

from mmsafe.engine.run_context import (CrashReporter, FailureExplainer,
                                       RunContext, run_context)


class PlainRunner:
    """What a hook sees of MMEngine's plain Runner: a work dir, hooks."""

    def __init__(self, work_dir, hooks=()):
        self.work_dir = work_dir
        self.hooks = list(hooks)


def test_a_plain_runner_gets_local_defaults_kept_while_it_lives(tmp_path):
    runner = PlainRunner(str(tmp_path))
    before = dict(vars(runner))
    context = run_context(runner)
    assert run_context(runner) is context
    assert context.rank_channel is None and context.resume_plan is None
    assert context.monitor_sync is None
    assert vars(runner) == before  # nothing set on the runner
    # another runner, another context
    assert run_context(PlainRunner(str(tmp_path))) is not context

    # the context lives while the runner does, and no longer (other
    # runners' entries may go in the same collection: only ours is asked)
    alive = weakref.ref(context)
    key = weakref.ref(runner)
    del runner, context
    gc.collect()
    assert key() is None and alive() is None


def test_the_runners_own_context_is_returned_as_it_is():
    own = RunContext()
    runner = SimpleNamespace(mmsafe_context=own, work_dir='/elsewhere')
    assert run_context(runner) is own
    # something that is not a RunContext under that name is not taken
    odd = PlainRunner('/w')
    odd.mmsafe_context = 'not a context'
    assert isinstance(run_context(odd), RunContext)
    assert run_context(odd) is not own


def test_an_object_without_weak_references_gets_a_fresh_context():
    runner = SimpleNamespace(work_dir='/w')
    first, second = run_context(runner), run_context(runner)
    assert first is not second


class Explains:
    def __init__(self, answer, asked):
        self.answer, self.asked = answer, asked

    def explain_failure(self, runner, exc):
        self.asked.append(self)
        return self.answer


class Reports:
    def __init__(self, told):
        self.told = told

    def report_crash(self, runner, exc, root_cause=None):
        self.told.append((self, exc, root_cause))


def test_the_first_explaining_hook_in_hook_order_answers():
    asked = []
    silent, first, second = (Explains(None, asked),
                             Explains(dict(error=KeyError('a')), asked),
                             Explains(dict(error=KeyError('b')), asked))
    other = object()  # a hook of neither protocol
    runner = PlainRunner('/w', [silent, other, first, second])
    assert isinstance(first, FailureExplainer)
    assert not isinstance(other, FailureExplainer)
    answer = run_context(runner).explain_failure(runner, ValueError('x'))
    assert answer['error'].args == ('a', )
    assert asked == [silent, first]  # the later hook is not asked
    lone = PlainRunner('/w', [silent])
    assert run_context(lone).explain_failure(lone, ValueError('x')) is None


def test_every_reporting_hook_is_told_in_hook_order():
    told = []
    a, b = Reports(told), Reports(told)
    runner = PlainRunner('/w', [a, Explains(None, []), b])
    assert isinstance(a, CrashReporter)
    exc = RuntimeError('boom')
    run_context(runner).report_crash(runner, exc, root_cause=dict(rank=1))
    assert told == [(a, exc, dict(rank=1)), (b, exc, dict(rank=1))]
