"""Replace training samples that have no valid instance after the pipeline.

A sample whose boxes all disappear in the pipeline (a random crop, a filter,
an image with no people) can leave one DDP rank with an empty batch while
the other ranks wait for it in a collective. This wrapper swaps such a
sample for another one, deterministically, and marks the replacement so
that :class:`mmsafe.engine.hooks.ValidInstanceResampleHook` counts it in the
main process (workers cannot write to the runner's message hub).
"""
from typing import Any, List, Optional, Union

import numpy as np
import torch
from mmengine.dataset import BaseDataset

from mmsafe.registry import DATASETS, builds_in_mmsafe_scope
from mmsafe.errors import MMSafeRuntimeError, MMSafeTypeError, MMSafeValueError
from mmsafe.events import log

#: metainfo keys set on a replacement sample's ``DetDataSample``
RESAMPLED_FROM = 'resampled_from'
RESAMPLED_FROM_PATH = 'resampled_from_path'
RESAMPLE_TRIES = 'resample_tries'


@DATASETS.register_module()
class ValidInstanceResampleDataset:
    """Dataset wrapper that resamples training samples without valid
    instances after the pipeline.

    ``dataset[idx]`` runs the inner pipeline on ``idx``. When the result is
    ``None`` (a transform filtered it) or has fewer than ``min_instances``
    ground-truth instances, candidates are drawn from
    ``numpy.random.default_rng([seed, idx])`` until one is valid, at most
    ``max_tries`` times; the same ``(seed, idx)`` always draws the same
    candidates, in any worker and any process. The replacement's data sample
    carries ``resampled_from`` (``idx``), ``resampled_from_path`` and
    ``resample_tries`` in its metainfo, which
    ``ValidInstanceResampleHook`` counts and logs. When every try fails,
    a ``RuntimeError`` names the sample and the candidates.

    In test mode (validation / test datasets) the wrapper passes samples
    through unchanged: evaluation must see every image.

    Args:
        dataset (dict | BaseDataset): the dataset to wrap (config or object).
        max_tries (int): candidates drawn per invalid sample. Defaults to 10.
        min_instances (int): instances a sample needs to be valid. Defaults
            to 1.
        seed (int, optional): resampling seed. Defaults to the run's seed:
            ``torch.initial_seed()`` when the wrapper is built, which
            MMEngine's Runner has set from ``randomness.seed`` (or its
            synced random seed) before it builds the dataloaders.
        lazy_init (bool): defer the inner dataset's ``full_init``.
    """

    @builds_in_mmsafe_scope
    def __init__(self,
                 dataset: Union[dict, BaseDataset],
                 max_tries: int = 10,
                 min_instances: int = 1,
                 seed: Optional[int] = None,
                 lazy_init: bool = False) -> None:
        if isinstance(dataset, dict):
            dataset = DATASETS.build(dataset)
        if max_tries < 1:
            raise MMSafeValueError(f'max_tries must be >= 1, got {max_tries}')
        self.dataset = dataset
        self.max_tries = int(max_tries)
        self.min_instances = int(min_instances)
        self.seed = int(torch.initial_seed() if seed is None else seed)
        self.test_mode = bool(getattr(dataset, 'test_mode', False))
        self._fully_initialized = False
        if not lazy_init:
            self.full_init()
        if not self.test_mode:
            log(f'ValidInstanceResampleDataset({type(dataset).__name__}): '
                f'samples with fewer than {self.min_instances} valid '
                f'instance(s) after the pipeline are replaced (seed '
                f'{self.seed}, at most {self.max_tries} tries). Add '
                "dict(type='ValidInstanceResampleHook') to custom_hooks to "
                'count them in the log.')

    @property
    def metainfo(self) -> dict:
        """The inner dataset's meta information."""
        return self.dataset.metainfo

    def full_init(self) -> None:
        """Fully initialise the inner dataset."""
        if self._fully_initialized:
            return
        if hasattr(self.dataset, 'full_init'):
            self.dataset.full_init()
        self._fully_initialized = True

    def get_data_info(self, idx: int) -> dict:
        """The inner data info of ``idx`` (before any resampling)."""
        return self.dataset.get_data_info(idx)

    def get_cat_ids(self, idx: int) -> List[int]:
        """Category ids of ``idx`` (for class-aware samplers)."""
        return self.dataset.get_cat_ids(idx)

    def __len__(self) -> int:
        return len(self.dataset)

    def _fetch(self, idx: int) -> Any:
        # prepare_data, not __getitem__: BaseDataset.__getitem__ would
        # replace a None result by a random (unseeded, uncounted) sample
        if hasattr(self.dataset, 'prepare_data'):
            return self.dataset.prepare_data(idx)
        return self.dataset[idx]

    def _num_valid(self, data: Any, idx: int) -> int:
        if data is None:
            return 0
        sample = data.get('data_samples') if isinstance(data, dict) else None
        if sample is None or not hasattr(sample, 'gt_instances'):
            raise MMSafeTypeError(
                'ValidInstanceResampleDataset needs pipeline outputs with '
                "'data_samples' holding gt_instances (end the pipeline with "
                'PackPairedDetInputs or PackDetInputs); sample '
                f'{idx} gave {type(data).__name__}')
        return len(sample.gt_instances)

    def _path(self, idx: int) -> Optional[str]:
        try:
            return self.dataset.get_data_info(idx).get('img_path')
        except Exception:  # noqa: BLE001 - a name for a message only
            return None

    def __getitem__(self, idx: int) -> Any:
        if not self._fully_initialized:
            self.full_init()
        if self.test_mode:
            return self.dataset[idx]
        data = self._fetch(idx)
        if self._num_valid(data, idx) >= self.min_instances:
            return data
        rng = np.random.default_rng([self.seed, int(idx)])
        tried = []
        for attempt in range(1, self.max_tries + 1):
            candidate = int(rng.integers(len(self)))
            tried.append(candidate)
            data = self._fetch(candidate)
            if self._num_valid(data, candidate) >= self.min_instances:
                data['data_samples'].set_metainfo({
                    RESAMPLED_FROM: int(idx),
                    RESAMPLED_FROM_PATH: self._path(idx),
                    RESAMPLE_TRIES: attempt
                })
                return data
        names = [self._path(i) for i in tried[:5]]
        raise MMSafeRuntimeError(
            f'ValidInstanceResampleDataset: sample {idx} '
            f'({self._path(idx)}) has fewer than {self.min_instances} valid '
            f'instance(s) after the pipeline, and so have all '
            f'{self.max_tries} resampled candidates {tried} (first: '
            f'{names}). The pipeline removes too many boxes or most images '
            'are empty: run tools/check_dataset.py on this config, or raise '
            'max_tries.')

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(dataset={type(self.dataset)},'
                f' max_tries={self.max_tries}, min_instances='
                f'{self.min_instances}, seed={self.seed})')


__all__ = ['ValidInstanceResampleDataset']
