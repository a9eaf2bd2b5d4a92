"""The DataLoaders of a :class:`~mmsafe.engine.runner.SafeRunner` run,
after MMEngine's build:

* a dataset wrapper whose own pipeline would move or mix one modality of
  the pairs it wraps (a plain ``Mosaic``/``MixUp`` in
  ``MultiImageMixDataset``) is refused when the loader is built, naming
  ``PairedGeometric``, instead of failing at the first sample
  (:func:`~mmsafe.datasets.pipeline_check.assert_wrapper_pipelines_paired`);
* loader workers ignore stop signals
  (:class:`~mmsafe.datasets.loader.processes.IgnoreStopSignals` wraps the
  loader's ``worker_init_fn``): a cluster signals every process of a job,
  Ctrl+C the whole console, and the training process decides how the run
  stops.
"""
from mmsafe.datasets.loader.processes import IgnoreStopSignals
from mmsafe.datasets.pipeline_check import assert_wrapper_pipelines_paired


def guard_built_loader(loader):
    """Check and prepare ``loader``, just built by MMEngine, before any of
    its iterators exists (see the module docstring); returns it."""
    assert_wrapper_pipelines_paired(getattr(loader, 'dataset', None))
    if getattr(loader, 'num_workers', 0) > 0:
        loader.worker_init_fn = IgnoreStopSignals(loader.worker_init_fn)
    return loader
