# mmsafe safety runtime, pure-Python style: every mmsafe guard with safe
# defaults. The text twin is configs/_base_/safety_runtime.py (its comments
# say what each guard does). In a pure-Python config:
#
#   from mmengine.config import read_base
#   with read_base():
#       from .my_model_and_data import *
#       from mmsafe.configs._base_.safety_runtime import *
#   optim_wrapper.type = NaNSkipOptimWrapper   # or AmpNaNSkipOptimWrapper
#
# (import NaNSkipOptimWrapper from mmsafe.engine.optimizers). A config that
# has its own custom_hooks appends to these:
#   custom_hooks = custom_hooks + [dict(type=MyHook)]
from mmsafe.engine.hooks import (DataLoaderProbeHook, EmptyBatchSyncHook,
                                 EvalCoverageHook, FirstBatchStatsHook,
                                 HangWatchdogHook, LossDictLintHook,
                                 MACLCheckHook, PreemptionHook,
                                 SafetyReportHook, ValidInstanceResampleHook)
from mmsafe.engine.runner import SafeRunner

custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)

runner_type = SafeRunner

mmsafe_peer_grace = 10

mmsafe_spike_skip = dict(window=128, sigmas=6.0, min_ratio=20.0)

mmsafe_trusted_globals = []

custom_hooks = [
    dict(type=DataLoaderProbeHook),
    dict(type=HangWatchdogHook),
    dict(type=EmptyBatchSyncHook),
    dict(type=LossDictLintHook),
    dict(type=FirstBatchStatsHook),
    dict(type=MACLCheckHook),
    dict(type=EvalCoverageHook),
    dict(type=ValidInstanceResampleHook),
    dict(type=SafetyReportHook),
    dict(type=PreemptionHook),
]
