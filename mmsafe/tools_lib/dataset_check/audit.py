"""Walk a dataset through its pipeline in a DataLoader with workers and
collect the audit record of every sample."""
import os
import os.path as osp
import time
import traceback
from typing import Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from mmsafe.analysis.flat_images import NEAR_CONSTANT_STD, near_constant
from mmsafe.datasets.walk import leaf_datasets, resolve_index
from mmsafe.errors import MMSafeOSError
from .checks import (ERROR, WARNING, check_packed, check_raw, class_names,
                     issue, unpack_result)
from .coordinates import coordinate_findings
from .report import summarize


class PairAuditDataset(Dataset):
    """Map-style dataset whose item ``i`` is the audit record of sample
    ``i`` of ``dataset``; run it in a DataLoader to audit with workers.

    Args:
        dataset: the built dataset (as training builds it).
        show_indices (Sequence[int]): samples to draw into ``show_dir``.
        show_dir (str, optional): where to write ``visible | infrared``
            images with boxes, as the pipeline outputs them.
        box_tolerance (float): pixels a box may reach past the image
            border as ``box_past_border`` (a warning), whatever its size;
            a box that reaches farther, and farther than a quarter of its
            own width/height, is ``out_of_image_box`` (an error).
    """

    def __init__(self,
                 dataset,
                 show_indices: Sequence[int] = (),
                 show_dir: Optional[str] = None,
                 box_tolerance: float = 1.0,
                 alignment: bool = True,
                 max_offset: float = 8.0) -> None:
        self.alignment = alignment
        self.max_offset = max_offset
        self.dataset = dataset
        self.show_indices = frozenset(show_indices)
        self.show_dir = show_dir
        self.box_tolerance = box_tolerance
        self.class_names = class_names(dataset)
        self.leaves = leaf_datasets(dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> dict:
        owner, local = resolve_index(self.dataset, idx)
        record = dict(index=idx, issues=[], leaf=self._leaf_index(owner))
        try:
            info = owner.get_data_info(local)
        except Exception as exc:  # noqa: BLE001 - recorded per sample
            record['issues'].append(issue(
                'pipeline_error', f'get_data_info({local}) raised '
                f'{type(exc).__name__}: {exc}', 'dataset',
                traceback=traceback.format_exc(limit=8)))
            return record
        record['img_path'] = info.get('img_path')
        record['ir_img_path'] = info.get('ir_img_path')
        num_classes = len(self.class_names)
        raw = check_raw(info, num_classes, self.box_tolerance)
        record['issues'] += raw.pop('issues')
        record.update(raw)
        if any(i['kind'] in ('missing_image', 'missing_partner',
                             'unreadable_image') for i in record['issues']):
            # The pipeline would only fail on the same file again.
            return record
        try:
            if hasattr(owner, 'prepare_data'):
                result = owner.prepare_data(local)
            else:
                result = owner[local]
        except Exception as exc:  # noqa: BLE001 - recorded per sample
            record['issues'].append(issue(
                'pipeline_error', f'{type(exc).__name__}: {exc}', 'pipeline',
                traceback=traceback.format_exc(limit=8)))
            return record
        if result is not None:
            for found in record['issues']:
                if found['kind'] == 'size_mismatch':
                    # the loader resized it (on_size_mismatch='resize')
                    found['severity'] = WARNING
                    found['message'] += ' (the pipeline resized it)'
        packed = check_packed(result, num_classes, self.box_tolerance,
                              bool(getattr(owner, 'test_mode', False)))
        record['issues'] += packed.pop('issues')
        record.update(packed)
        flat = self._nearly_constant(result) if self.alignment else []
        if flat:
            record['issues'].append(issue(
                'nearly_constant_modality', f'{"/".join(flat)} is nearly '
                'constant after the pipeline (its values\' standard '
                f'deviation is below {NEAR_CONSTANT_STD:g}); the pairing '
                'checks abstain on this pair', 'alignment', modalities=flat))
        elif self.alignment and result is not None:
            from mmsafe.analysis.pair_alignment import audit_alignment
            record['alignment'], found = audit_alignment(
                unpack_result(result)[0])
            record['issues'] += [issue(kind, message, 'alignment')
                                 for kind, message in found]
            from mmsafe.analysis.object_offsets import audit_offsets
            mods, sample = unpack_result(result)
            record['offsets'], found = audit_offsets(mods, sample,
                                                     self.max_offset)
            record['issues'] += [issue(
                kind, message, 'object_offsets',
                median_d=record['offsets']['median_d'],
                offsets=[[b['dx'], b['dy']] for b in
                         record['offsets']['boxes'] if b['confident']])
                for kind, message in found]
        if idx in self.show_indices and self.show_dir and result is not None:
            record['shown'] = self._show(idx, result, record)
        return record

    @staticmethod
    def _nearly_constant(result) -> list:
        """The modalities of a pipeline output that are nearly constant
        (nothing to align), as ``FirstBatchStatsHook`` judges them."""
        mods = unpack_result(result)[0] if result is not None else None
        return [name for name, img in (mods or {}).items()
                if near_constant(img, NEAR_CONSTANT_STD) is not None]

    def _leaf_index(self, owner) -> Optional[int]:
        """Which of :attr:`leaves` reads the sample ``owner`` holds (its
        coordinate statistics are kept per leaf dataset)."""
        for leaf in leaf_datasets(owner):
            for i, known in enumerate(self.leaves):
                if known is leaf:
                    return i
        return None

    def show_again(self, idx: int, record: dict,
                   prefix: str = '') -> Optional[str]:
        """Run sample ``idx`` through the pipeline again and draw it."""
        owner, local = resolve_index(self.dataset, idx)
        result = owner.prepare_data(local) if hasattr(
            owner, 'prepare_data') else owner[local]
        if result is None:
            return None
        return self._show(idx, result, record, prefix)

    def _show(self, idx: int, result: dict, record: dict,
              prefix: str = '') -> Optional[str]:
        import cv2
        from mmsafe.analysis.pair_vis import draw_pair
        mods, sample = unpack_result(result)
        if mods is None:
            return None
        gt = getattr(sample, 'gt_instances', None)
        ignored = getattr(sample, 'ignored_instances', None)
        stem = osp.splitext(osp.basename(record.get('img_path') or ''))[0]
        kinds = sorted({i['kind'] for i in record['issues']})
        canvas = draw_pair(
            mods.get('visible'), mods.get('infrared'),
            getattr(gt, 'bboxes', None), getattr(gt, 'labels', None),
            self.class_names, getattr(ignored, 'bboxes', None),
            title=f'#{idx} {stem} ' + ' '.join(kinds))
        if self.alignment and mods.get('visible') is not None:
            # each box's offset as an arrow on the infrared half, measured
            # on this very output (a redraw draws its random flip again)
            from mmsafe.analysis.object_offsets import (audit_offsets,
                                                        draw_offsets)
            from mmsafe.analysis.pair_vis import GAP, to_hwc_uint8
            meta = getattr(sample, 'metainfo', None) or {}
            drawn = audit_offsets(mods, sample, self.max_offset)[0]
            draw_offsets(canvas, drawn,
                         to_hwc_uint8(mods['visible']).shape[1], GAP,
                         meta.get('scale_factor'),
                         meta.get('flip_direction') if meta.get('flip')
                         else None)
        path = osp.join(self.show_dir, f'{prefix}{idx:06d}_{stem}.png')
        if not cv2.imwrite(path, canvas):
            raise MMSafeOSError(f'could not write {path}')
        return path


def _identity(x):
    return x


def _seed_worker(worker_id: int) -> None:
    import random
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


# ------------------------------------------------------------------- walk
def audit(dataset,
          workers: int = 2,
          show_dir: Optional[str] = None,
          show: int = 0,
          box_tolerance: float = 1.0,
          limit: Optional[int] = None,
          progress: bool = True,
          seed: int = 0,
          findings: Sequence[dict] = (),
          multiprocessing_context: Optional[str] = None,
          alignment: bool = True,
          max_offset: float = 8.0,
          indices: Optional[Sequence[int]] = None) -> dict:
    """Walk ``dataset`` through its pipeline and collect every finding.

    Args:
        dataset: the built dataset.
        workers (int): DataLoader worker processes (0: in this process).
        show_dir (str, optional): write side-by-side pairs here.
        show (int): how many samples (the first ones) to draw.
        box_tolerance (float): see :class:`PairAuditDataset`.
        limit (int, optional): audit only the first ``limit`` samples.
        progress (bool): show a progress bar on stderr.
        seed (int): seed of the pipeline's random augmentations.
        findings (Sequence[dict]): dataset-level findings made before the
            walk (see :func:`build_dataset`).
        multiprocessing_context (str, optional): worker start method
            (``'spawn'``, ``'fork'``); the platform default when None.
        alignment (bool): measure the image-content alignment of every
            pair (see :mod:`.pair_alignment`); with ``show_dir``, the
            flagged pairs (up to ``max(show, 20)``) are drawn as
            ``misaligned_*.png``; and the per-box visible/infrared offsets
            of every pair with boxes (:mod:`..object_offsets`): a pair
            whose median ``|d|`` exceeds ``max_offset`` pixels (original
            resolution) is flagged ``pair_objects_offset``; with
            ``show_dir``, a histogram of ``|d|`` is written as
            ``object_offsets_hist.png``.
        max_offset (float): see ``alignment``.
        indices (Sequence[int], optional): audit only these samples
            (``--files``); ``limit`` then caps how many.

    Returns:
        dict: the report (see :func:`summarize`).
    """
    chosen = range(len(dataset)) if indices is None else list(indices)
    n = len(chosen) if limit is None else min(limit, len(chosen))
    chosen = chosen[:n]
    if show_dir:
        os.makedirs(show_dir, exist_ok=True)
    audit_ds = PairAuditDataset(dataset, chosen[:show], show_dir,
                                box_tolerance, alignment, max_offset)
    generator = torch.Generator()
    generator.manual_seed(seed)
    loader = DataLoader(
        torch.utils.data.Subset(audit_ds, chosen),
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        collate_fn=_identity,
        worker_init_fn=_seed_worker,
        generator=generator,
        multiprocessing_context=multiprocessing_context if workers else None,
        prefetch_factor=4 if workers > 0 else None)
    records = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit='pair', dynamic_ncols=True,
                   desc='check_dataset')
    start = time.perf_counter()
    errors = 0
    for record in loader:
        records.append(record)
        errors += sum(i['severity'] == ERROR for i in record['issues'])
        if bar is not None:
            bar.update(1)
            if errors:
                bar.set_postfix(errors=errors, refresh=False)
    elapsed = time.perf_counter() - start
    if bar is not None:
        bar.close()
    offsets = None
    if alignment:
        from mmsafe.analysis.object_offsets import (FINDING,
                                                    offsets_summary,
                                                    write_histogram)
        from mmsafe.analysis.pair_alignment import (add_unrelated_findings,
                                                    flagged_records)
        add_unrelated_findings(records, issue)
        offsets = offsets_summary(records)
        offsets['max_offset'] = float(max_offset)
        if show_dir:
            flagged = {r['index'] for r in flagged_records(records)}
            flagged |= {r['index'] for r in records
                        if any(i['kind'] == FINDING for i in r['issues'])}
            for record in [r for r in records
                           if r['index'] in flagged][:max(show, 20)]:
                shown = audit_ds.show_again(record['index'], record,
                                            prefix='misaligned_')
                if shown:
                    record['shown'] = shown
            if offsets['pairs']:
                offsets['histogram'] = write_histogram(
                    os.path.join(show_dir, 'object_offsets_hist.png'),
                    offsets['d'], max_offset)
    borders, base_findings = coordinate_findings(
        records, audit_ds.leaves, issue)
    report = summarize(records, elapsed, workers, dataset,
                       list(findings) + base_findings)
    report['box_borders'] = borders
    if offsets is not None:
        report['object_offsets'] = offsets
    return report
