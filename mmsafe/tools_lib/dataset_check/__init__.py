"""Audit a paired (visible + infrared) detection dataset through its pipeline.

The engine of ``tools/check_dataset.py``. Every sample of a split is checked
twice:

* as stored: both image files exist and decode, visible and infrared have the
  same size, the annotated boxes lie in their own image, are not degenerate
  and have labels inside the class range;
* as training sees it: the dataset's own pipeline is run on the sample and
  the output is checked again (both modalities the same shape, at least one
  valid instance, boxes inside ``img_shape``, labels in range).

The walk runs in a ``torch.utils.data.DataLoader`` with worker processes, so
decoding scales with the cores. A fault in one sample is recorded for that
sample, with its file names, and the audit goes on; it never stops the walk
and it is never dropped: it reaches the summary, the JSON report and the exit
code. Over the whole split, where the boxes meet the image borders tells
whether the dataset reads them with the right coordinate base.

Modules: :mod:`.checks` (the checks of one sample), :mod:`.audit` (the
walk with workers), :mod:`.coordinates` (the coordinate base from the
boxes at the borders), :mod:`.build` (building the split's dataset,
findings from the config), :mod:`.report` (summary and formatting).
"""
from .audit import PairAuditDataset, audit  # noqa: F401
from .build import (annotation_findings, annotation_summary,  # noqa: F401
                    build_dataset, dataset_config, static_findings)
from .checks import CHECKS, ERROR, WARNING, issue  # noqa: F401
from .coordinates import base_shift, border_contacts  # noqa: F401
from .report import (add_findings, build_failure_report,  # noqa: F401
                     format_report, summarize)
