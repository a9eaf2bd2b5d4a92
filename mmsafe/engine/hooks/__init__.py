"""mmsafe hooks, one per file (macl_signals.py and first_batch_checks.py
hold what MACLCheckHook and FirstBatchStatsHook compute)."""
from .empty_batch_sync_hook import EmptyBatchSyncHook  # noqa: F401,E402
from .safety_report_hook import SafetyReportHook  # noqa: F401,E402
from .dataloader_probe_hook import DataLoaderProbeHook  # noqa: F401,E402
from .hang_watchdog_hook import HangWatchdogHook  # noqa: F401,E402
from .eval_coverage_hook import EvalCoverageHook  # noqa: F401
from .loss_dict_lint_hook import LossDictLintHook  # noqa: F401
from .macl_check_hook import MACLCheckHook  # noqa: F401
from .scalar_bands_hook import ScalarBandsHook  # noqa: F401
from .first_batch_stats_hook import FirstBatchStatsHook  # noqa: F401
from .valid_instance_resample_hook import ValidInstanceResampleHook  # noqa: F401
from .skip_aware_param_scheduler_hook import SkipAwareParamSchedulerHook  # noqa: F401
from .rank_fault_hook import RankFaultHook  # noqa: F401
from .preemption_hook import PreemptionHook  # noqa: F401
from .divergence_rollback_hook import DivergenceRollbackHook  # noqa: F401
