# mmsafe safety runtime: every mmsafe guard with safe defaults, in one
# fragment. Add it to any MMDetection 3.x config:
#
#   _base_ = ['./your_config.py', 'path/to/mmsafe/configs/_base_/safety_runtime.py']
#   optim_wrapper = dict(type='NaNSkipOptimWrapper')  # or AmpNaNSkipOptimWrapper
#
# The LLVIP configs in configs/llvip/ use it this way. Notes on MMEngine's config inheritance:
# * two bases may not define the same key (KeyError "Duplicate key is not
#   allowed among bases"), so this fragment sets no key that MMDetection's
#   bases set (no optim_wrapper: its type is switched in the child config,
#   the second line above; the child's dict merges into the base's, keeping
#   the optimizer). A config that already has `custom_imports` or
#   `custom_hooks` in a base must add 'mmsafe' / these hooks itself.
# * lists are replaced, not merged: a child config that sets its own
#   `custom_hooks` must append to these:
#   `custom_hooks = _base_.custom_hooks + [dict(type='MyHook')]`
#   (in a pure-python config, `{{_base_.custom_hooks}} + [...]`).

# Registers mmsafe's components (importing mmsafe changes nothing else).
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)

# MMEngine's Runner plus mmsafe's run-level guarantees: DDP on CPU (gloo)
# and a finite distributed timeout; torch>=2.6 weights_only loading of
# MMEngine/MMDetection checkpoints, atomic checkpoint writes, auto-resume
# that skips a corrupt newest checkpoint; pretrained weights from the torch
# hub cache or one clear error; one monitoring all-reduce per log interval
# for all hooks; a clean stop on a hook's request; the crash report.
# MMDetection's tools/train.py and mmsafe's build the runner from this key.
runner_type = 'SafeRunner'

# Under DDP: seconds a rank may go on after another rank failed (to fail with
# its own message) before it ends itself instead of waiting out the
# distributed timeout; the failed rank's error is named on rank 0. Every
# SafeRunner run also gets a RankFaultHook (a loss term that one rank stops
# producing, DDP's unused-parameter error explained); list it in
# custom_hooks to set policy='raise'.
mmsafe_peer_grace = 10

# Gradient-norm spikes, for the NaN-skip optim wrappers (the
# `optim_wrapper = dict(type='NaNSkipOptimWrapper')` line above, or
# AmpNaNSkipOptimWrapper / --amp): a step whose global gradient norm is above
# mean + 6 std of the last 128 applied steps (OLMo-core's rule) and 20x their
# mean (healthy detection steps were measured up to 13.8x) is skipped on every
# rank like a NaN step, with no communication added; judged once 128 steps were
# applied. The log and the event log name the batch's files, value ranges and
# boxes. `mmsafe_spike_skip = None` turns it off; optim_wrapper.spike_skip
# (False or a dict) wins over this line.
mmsafe_spike_skip = dict(window=128, sigmas=6.0, min_ratio=20.0)

# Extra objects a checkpoint may hold beyond what MMEngine/MMDetection need
# (dotted names). Empty = refuse anything else. Only for files you trust;
# weights_only stays on. Same as MMSAFE_TRUSTED_GLOBALS=a.B,c.D.
mmsafe_trusted_globals = []

custom_hooks = [
    # Probes each DataLoader before use; falls back to num_workers=0 when it
    # deadlocks (Windows spawn), loudly. policy='off' disables.
    dict(type='DataLoaderProbeHook'),
    # Stack dump of every thread when a rank makes no progress.
    dict(type='HangWatchdogHook'),
    # Empty batches under DDP: keeps the graph identical on every rank.
    dict(type='EmptyBatchSyncHook'),
    # First-iteration lint of the loss dict (double counting, dead terms).
    dict(type='LossDictLintHook'),
    # Per-modality statistics of the first batch.
    dict(type='FirstBatchStatsHook'),
    # loss_macl present, finite and below chance (dual-modality models).
    dict(type='MACLCheckHook'),
    # Every evaluation scores the whole dataset, from all ranks.
    dict(type='EvalCoverageHook'),
    # Counts samples that ValidInstanceResampleDataset replaced (idle without
    # that wrapper).
    dict(type='ValidInstanceResampleHook'),
    # {work_dir}/safety_report.json + a log table, at the end and on a crash;
    # it lists the images named in 2+ skipped steps (repeated offenders).
    dict(type='SafetyReportHook'),
    # SIGTERM / SIGINT / SIGUSR1 (Ctrl+C, Ctrl+Break on Windows): every rank
    # stops at the same iteration (at most one log interval later), saves
    # {work_dir}/preempted_iter_N.pth and exits with code 75; `--resume`
    # continues exactly there.
    dict(type='PreemptionHook'),
    # Off unless configured: a diverging run (more than 5 unstable skips in
    # 50 iterations, or the loss above 2x its rolling median for 5
    # iterations) goes back to its last good snapshot, past the data that
    # preceded it, at most 3 times. Turn it on in your config with
    #   custom_hooks = _base_.custom_hooks + [
    #       dict(type='DivergenceRollbackHook')]
]
