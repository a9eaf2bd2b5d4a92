"""Audit a paired (visible + infrared) detection dataset through its pipeline.

The engine of ``tools/check_dataset.py``. Every sample of a split is checked
twice:

* as stored: both image files exist and decode, visible and infrared have the
  same size, the annotated boxes lie in the image, are not degenerate and
  have labels inside the class range;
* as training sees it: the dataset's own pipeline is run on the sample and
  the output is checked again (both modalities the same shape, at least one
  valid instance, boxes inside ``img_shape``, labels in range).

The walk runs in a ``torch.utils.data.DataLoader`` with worker processes, so
decoding scales with the cores. A fault in one sample is recorded for that
sample, with its file names, and the audit goes on; it never stops the walk
and it is never dropped: it reaches the summary, the JSON report and the exit
code.
"""
import copy
import os
import os.path as osp
import time
import traceback
from collections import Counter, OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from mmsafe.datasets.walk import config_nodes, leaf_datasets, resolve_index

ERROR = 'error'
WARNING = 'warning'

# kind -> (severity, what it means). The order is the order of the summary.
CHECKS = OrderedDict([
    ('dataset_build', (ERROR, 'the dataset could not be built')),
    ('unpaired_transform', (ERROR, 'a geometric or mix transform acts on '
                            'one modality only (pipeline config)')),
    ('missing_image', (ERROR, 'visible image file does not exist')),
    ('missing_partner', (ERROR, 'infrared partner image does not exist')),
    ('no_partner_path', (ERROR, 'sample has no ir_img_path (single-modality '
                         'sample)')),
    ('unreadable_image', (ERROR, 'image file exists but cannot be decoded')),
    ('size_mismatch', (ERROR, 'visible and infrared images differ in size')),
    ('annotation_size_mismatch', (WARNING, 'annotated width/height differ '
                                  'from the image file')),
    ('degenerate_box', (ERROR, 'box with zero or negative width/height')),
    ('out_of_image_box', (ERROR, 'box outside the image')),
    ('label_out_of_range', (ERROR, 'label outside [0, num_classes)')),
    ('pipeline_error', (ERROR, 'the pipeline raised an exception')),
    ('pipeline_filtered', (WARNING, 'the pipeline returned None (training '
                           'silently draws another sample)')),
    ('unexpected_output', (ERROR, 'pipeline output has no inputs / '
                           'data_samples')),
    ('pair_shape_mismatch', (ERROR, 'modalities differ in shape after the '
                             'pipeline')),
    ('no_valid_instances', (WARNING, 'no valid instances after the pipeline '
                            '(an empty batch under DDP; see '
                            'ValidInstanceResampleDataset)')),
    ('pair_mirrored', (ERROR, 'infrared matches its visible partner only '
                       'mirrored (image content)')),
    ('pair_shifted', (ERROR, 'infrared matches its visible partner only '
                      'shifted (image content)')),
    ('pair_unrelated', (ERROR, 'infrared shares no structure with its '
                        'partner, nor do most pairs (other frames)')),
])


def issue(kind: str, message: str, source: str, **fields) -> dict:
    """One finding about one sample."""
    severity = CHECKS[kind][0]
    record = dict(kind=kind, severity=severity, source=source,
                  message=message)
    record.update(fields)
    return record


# ---------------------------------------------------------------- datasets
def class_names(dataset) -> tuple:
    meta = getattr(dataset, 'metainfo', None) or {}
    return tuple(meta.get('classes', ()) or ())


# ------------------------------------------------------------ image files
def image_size(path: str):
    """``(width, height)`` of an image file as the loader will see it, or an
    error string. Reads only the header with PIL when it can (fast); falls
    back to a full OpenCV decode so a file PIL cannot parse but OpenCV can
    is not reported as unreadable."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            w, h = im.size
            try:
                orientation = im.getexif().get(0x0112, 1)
            except Exception:  # no/broken EXIF: OpenCV ignores it as well
                orientation = 1
        if orientation in (5, 6, 7, 8):  # OpenCV applies EXIF rotation
            w, h = h, w
        return (w, h), None
    except Exception as pil_exc:  # noqa: BLE001 - recorded, not swallowed
        import cv2
        img = cv2.imread(path, cv2.IMREAD_COLOR)
        if img is None:
            return None, f'{type(pil_exc).__name__}: {pil_exc}'
        return (img.shape[1], img.shape[0]), None


def _box_issues(boxes: np.ndarray, labels: np.ndarray, width: float,
                height: float, num_classes: int, tol: float, source: str,
                where: str) -> List[dict]:
    found = []
    if len(boxes) == 0:
        return found
    bw = boxes[:, 2] - boxes[:, 0]
    bh = boxes[:, 3] - boxes[:, 1]
    degenerate = np.where(~((bw > 0) & (bh > 0)))[0]
    if len(degenerate):
        found.append(issue(
            'degenerate_box',
            f'{len(degenerate)} box(es) with zero/negative size in {where}: '
            f'{boxes[degenerate[:3]].round(2).tolist()}', source,
            boxes=boxes[degenerate].round(3).tolist()))
    outside = np.where((boxes[:, 0] < -tol) | (boxes[:, 1] < -tol)
                       | (boxes[:, 2] > width + tol)
                       | (boxes[:, 3] > height + tol))[0]
    if len(outside):
        found.append(issue(
            'out_of_image_box',
            f'{len(outside)} box(es) outside the {width:g}x{height:g} image '
            f'in {where}: {boxes[outside[:3]].round(2).tolist()}', source,
            boxes=boxes[outside].round(3).tolist()))
    if num_classes > 0 and len(labels):
        bad = np.where((labels < 0) | (labels >= num_classes))[0]
        if len(bad):
            found.append(issue(
                'label_out_of_range',
                f'label(s) {sorted(set(labels[bad].tolist()))} outside '
                f'[0, {num_classes}) in {where}', source,
                labels=labels[bad].tolist()))
    return found


def check_raw(info: dict, num_classes: int, tol: float) -> dict:
    """Check the stored files and annotations of one sample."""
    found, sizes = [], {}
    for key, missing_kind in (('img_path', 'missing_image'),
                              ('ir_img_path', 'missing_partner')):
        path = info.get(key)
        if path is None:
            if key == 'ir_img_path':
                found.append(issue(
                    'no_partner_path', 'data info has no ir_img_path; '
                    'training would see one modality only', 'files'))
            continue
        if not osp.isfile(path):
            found.append(issue(missing_kind, f'{key} not found: {path}',
                               'files', path=path))
            continue
        size, error = image_size(path)
        if size is None:
            found.append(issue('unreadable_image',
                               f'{key} cannot be decoded: {path} ({error})',
                               'files', path=path))
        else:
            sizes[key] = size
    if len(sizes) == 2 and sizes['img_path'] != sizes['ir_img_path']:
        found.append(issue(
            'size_mismatch', 'visible {}x{} vs infrared {}x{}'.format(
                *sizes['img_path'], *sizes['ir_img_path']), 'files'))
    vis_size = sizes.get('img_path')
    ann_size = (info.get('width'), info.get('height'))
    if vis_size and None not in ann_size and tuple(ann_size) != vis_size:
        found.append(issue(
            'annotation_size_mismatch', 'annotation says {}x{}, the visible '
            'image is {}x{}'.format(*ann_size, *vis_size), 'annotation'))
    width, height = vis_size or ann_size
    # ignored instances too: a dataset may hide a broken box by marking it
    # ignore (LLVIPDataset does so for degenerate ones); the data still
    # needs fixing
    instances = list(info.get('instances', []) or [])
    boxes = np.array([i['bbox'] for i in instances if 'bbox' in i],
                     dtype=np.float64).reshape(-1, 4)
    labels = np.array([i.get('bbox_label', 0) for i in instances
                       if 'bbox' in i], dtype=np.int64)
    if width is not None and height is not None:
        found += _box_issues(boxes, labels, float(width), float(height),
                             num_classes, tol, 'annotation', 'annotation')
    return dict(issues=found, raw_size=vis_size, raw_boxes=len(boxes))


def _unpack(result):
    """``(modalities, data_sample)`` of a packed pipeline result."""
    inputs = result.get('inputs') if isinstance(result, dict) else None
    sample = result.get('data_samples') if isinstance(result, dict) else None
    if inputs is None or sample is None:
        return None, None
    if isinstance(inputs, dict):
        return dict(inputs), sample
    return {'visible': inputs}, sample


def check_packed(result, num_classes: int, tol: float,
                 test_mode: bool = False) -> dict:
    """Check one pipeline output (``PackPairedDetInputs`` or
    ``PackDetInputs`` format).

    Boxes are checked against ``img_shape``; in test mode against the
    larger of ``img_shape`` and ``ori_shape``, because test pipelines load
    the ground truth after the resize so that it stays in the original
    frame for the metric.
    """
    if result is None:
        return dict(issues=[issue(
            'pipeline_filtered', 'a transform returned None; in training '
            'BaseDataset draws another random sample instead', 'pipeline')])
    mods, sample = _unpack(result)
    if mods is None:
        keys = sorted(result) if isinstance(result, dict) else type(result)
        return dict(issues=[issue(
            'unexpected_output', f'pipeline output has keys {keys}, expected '
            'inputs and data_samples (PackPairedDetInputs)', 'pipeline')])
    found = []
    shapes = {k: tuple(v.shape) for k, v in mods.items()}
    if len({s[-2:] for s in shapes.values()}) > 1:
        found.append(issue('pair_shape_mismatch',
                           f'shapes after the pipeline: {shapes}',
                           'pipeline'))
    gt = getattr(sample, 'gt_instances', None)
    boxes = getattr(gt, 'bboxes', None) if gt is not None else None
    if boxes is not None and hasattr(boxes, 'tensor'):
        boxes = boxes.tensor
    boxes = (np.zeros((0, 4)) if boxes is None else
             np.asarray(boxes.detach().cpu() if hasattr(boxes, 'detach') else
                        boxes, dtype=np.float64).reshape(-1, 4))
    labels = getattr(gt, 'labels', None) if gt is not None else None
    labels = (np.zeros((0, ), np.int64) if labels is None else np.asarray(
        labels.cpu() if hasattr(labels, 'cpu') else labels, np.int64))
    meta = sample.metainfo
    height, width = (meta.get('img_shape') or
                     next(iter(shapes.values()))[-2:])[:2]
    if test_mode and meta.get('ori_shape'):
        height = max(height, meta['ori_shape'][0])
        width = max(width, meta['ori_shape'][1])
    if len(boxes) == 0:
        found.append(issue(
            'no_valid_instances', 'no ground-truth instance left after the '
            'pipeline', 'pipeline'))
    found += _box_issues(boxes, labels, float(width), float(height),
                         num_classes, tol, 'pipeline',
                         'the pipeline output')
    return dict(issues=found, boxes=len(boxes), img_shape=[height, width],
                shapes=shapes)


class PairAuditDataset(Dataset):
    """Map-style dataset whose item ``i`` is the audit record of sample
    ``i`` of ``dataset``; run it in a DataLoader to audit with workers.

    Args:
        dataset: the built dataset (as training builds it).
        show_indices (Sequence[int]): samples to draw into ``show_dir``.
        show_dir (str, optional): where to write ``visible | infrared``
            images with boxes, as the pipeline outputs them.
        box_tolerance (float): pixels a box may extend beyond the image
            (VOC's ``minus_one`` makes a box at the border start at -1).
    """

    def __init__(self,
                 dataset,
                 show_indices: Sequence[int] = (),
                 show_dir: Optional[str] = None,
                 box_tolerance: float = 1.0,
                 alignment: bool = True) -> None:
        self.alignment = alignment
        self.dataset = dataset
        self.show_indices = frozenset(show_indices)
        self.show_dir = show_dir
        self.box_tolerance = box_tolerance
        self.class_names = class_names(dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> dict:
        owner, local = resolve_index(self.dataset, idx)
        record = dict(index=idx, issues=[])
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
        if self.alignment and result is not None:
            from .pair_alignment import audit_alignment
            record['alignment'], found = audit_alignment(_unpack(result)[0])
            record['issues'] += [issue(kind, message, 'alignment')
                                 for kind, message in found]
        if idx in self.show_indices and self.show_dir and result is not None:
            record['shown'] = self._show(idx, result, record)
        return record

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
        from .pair_vis import draw_pair
        mods, sample = _unpack(result)
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
        path = osp.join(self.show_dir, f'{prefix}{idx:06d}_{stem}.png')
        if not cv2.imwrite(path, canvas):
            raise OSError(f'could not write {path}')
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
          alignment: bool = True) -> dict:
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
            ``misaligned_*.png``.

    Returns:
        dict: the report (see :func:`summarize`).
    """
    n = len(dataset) if limit is None else min(limit, len(dataset))
    if show_dir:
        os.makedirs(show_dir, exist_ok=True)
    audit_ds = PairAuditDataset(dataset, range(min(show, n)), show_dir,
                                box_tolerance, alignment)
    generator = torch.Generator()
    generator.manual_seed(seed)
    loader = DataLoader(
        torch.utils.data.Subset(audit_ds, range(n)),
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
    if alignment:
        from .pair_alignment import add_unrelated_findings, flagged_records
        add_unrelated_findings(records, issue)
        if show_dir:
            for record in flagged_records(records)[:max(show, 20)]:
                shown = audit_ds.show_again(record['index'], record,
                                            prefix='misaligned_')
                if shown:
                    record['shown'] = shown
    return summarize(records, elapsed, workers, dataset, findings)


def summarize(records: List[dict], elapsed: float, workers: int,
              dataset=None, findings: Sequence[dict] = ()) -> dict:
    """Aggregate per-sample records into the report dict."""
    counts: Dict[str, int] = Counter(i['kind'] for i in findings)
    issues = [dict(i) for i in findings]
    # a file listed from the folders may also be in the dataset: once only
    seen = {(i['kind'], i.get('path')) for i in findings if i.get('path')}
    for r in records:
        for i in r['issues']:
            if i.get('path') and (i['kind'], i['path']) in seen:
                continue
            counts[i['kind']] += 1
            entry = dict(index=r['index'], img_path=r.get('img_path'),
                         ir_img_path=r.get('ir_img_path'))
            entry.update(i)
            issues.append(entry)
    boxes = [r['boxes'] for r in records if 'boxes' in r]
    sizes = Counter(tuple(r['raw_size']) for r in records
                    if r.get('raw_size'))
    report = dict(
        dataset=type(dataset).__name__ if dataset is not None else None,
        classes=list(class_names(dataset)) if dataset is not None else [],
        num_samples=len(records),
        elapsed_s=round(elapsed, 3),
        pairs_per_second=round(len(records) / elapsed, 2) if elapsed else
        None,
        workers=workers,
        summary={
            k: dict(severity=CHECKS[k][0], findings=counts[k],
                    meaning=CHECKS[k][1])
            for k in CHECKS if counts[k]
        },
        errors=sum(1 for i in issues if i['severity'] == ERROR),
        warnings=sum(1 for i in issues if i['severity'] == WARNING),
        boxes_after_pipeline=dict(
            total=int(sum(boxes)), mean=round(float(np.mean(boxes)), 3)
            if boxes else None, max=int(max(boxes)) if boxes else None),
        image_sizes={f'{w}x{h}': c
                     for (w, h), c in sizes.most_common(10)},
        shown=[r['shown'] for r in records if r.get('shown')],
        issues=issues)
    return report


def build_failure_report(exc: BaseException, dataset_cfg) -> dict:
    """A report for a dataset that could not even be built."""
    report = summarize([], 0.0, 0)
    report['dataset'] = (dataset_cfg.get('type') if hasattr(
        dataset_cfg, 'get') else None)
    entry = issue('dataset_build', f'{type(exc).__name__}: {exc}', 'dataset',
                  traceback=traceback.format_exc(limit=12))
    report['issues'] = [dict(index=None, img_path=None, ir_img_path=None,
                             **entry)]
    report['summary'] = {'dataset_build': dict(
        severity=ERROR, findings=1, meaning=CHECKS['dataset_build'][1])}
    report['errors'] = 1
    return report


def format_report(report: dict, max_examples: int = 5) -> str:
    """Human-readable summary table plus a few examples per finding."""
    lines = []
    rate = report.get('pairs_per_second')
    lines.append(
        f"dataset {report.get('dataset')}: {report['num_samples']} samples "
        f"checked in {report['elapsed_s']:.1f} s "
        f"({rate if rate is not None else '-'} pairs/s, "
        f"{report['workers']} workers); classes {report.get('classes')}")
    header = f"{'check':<26}{'severity':<10}{'found':>8}  meaning"
    lines += [header, '-' * len(header)]
    for kind, (severity, meaning) in CHECKS.items():
        n = report['summary'].get(kind, {}).get('findings', 0)
        mark = '' if n == 0 else ' <--'
        lines.append(f'{kind:<26}{severity:<10}{n:>8}  {meaning}{mark}')
    lines.append('-' * len(header))
    box = report.get('boxes_after_pipeline') or {}
    lines.append(f"errors: {report['errors']}  warnings: "
                 f"{report['warnings']}  boxes after pipeline: "
                 f"{box.get('total')} (mean {box.get('mean')} per image)  "
                 f"image sizes: {report.get('image_sizes')}")
    by_kind: Dict[str, list] = {}
    for i in report['issues']:
        by_kind.setdefault(i['kind'], []).append(i)
    for kind, found in by_kind.items():
        lines.append(f'[{found[0]["severity"]}] {kind}: {len(found)}')
        for i in found[:max_examples]:
            files = ' | '.join(
                str(p) for p in (i.get('img_path'), i.get('ir_img_path'))
                if p)
            where = '-' if i['index'] is None else f"#{i['index']}"
            lines.append(f'  {where} {files}: {i["message"]}')
        if len(found) > max_examples:
            lines.append(f'  ... {len(found) - max_examples} more in the '
                         'JSON report (--json)')
    return '\n'.join(lines)


def dataset_config(cfg, split: str):
    """The dataset config of ``{split}_dataloader``, deep-copied."""
    key = f'{split}_dataloader'
    loader = cfg.get(key)
    if not loader or 'dataset' not in loader:
        raise KeyError(f'the config has no {key}.dataset')
    return copy.deepcopy(loader['dataset'])


def _pair_policy_holders(ds_cfg) -> List[dict]:
    """The (possibly nested) dataset configs whose type takes
    ``on_missing_pair``."""
    import inspect
    from mmdet.registry import DATASETS
    holders = []
    for _, node in config_nodes(ds_cfg):
        cls = node.get('type')
        if isinstance(cls, str):
            cls = DATASETS.get(cls)
        for klass in getattr(cls, '__mro__', ()):  # subclasses: **kwargs
            try:
                params = inspect.signature(klass.__init__).parameters
            except (TypeError, ValueError):
                continue
            if 'on_missing_pair' in params:
                holders.append(node)
                break
    return holders


def _missing_in_folders(dataset) -> List[dict]:
    """Every visible image of an LLVIP-style folder pair without its
    infrared twin (the dataset's own error names only the first few)."""
    prefix = getattr(dataset, 'data_prefix', None) or {}
    vis_dir, ir_dir = prefix.get('img'), prefix.get('ir_img')
    if getattr(dataset, 'ann_file', '') or not (vis_dir and ir_dir) or \
            not (osp.isdir(vis_dir) and osp.isdir(ir_dir)):
        return []
    ir_names = set(os.listdir(ir_dir))
    found = []
    for name in sorted(os.listdir(vis_dir)):
        if name not in ir_names and osp.isfile(osp.join(vis_dir, name)):
            ir_path = osp.join(ir_dir, name)
            found.append(dict(
                index=None, img_path=osp.join(vis_dir, name),
                ir_img_path=ir_path, **issue(
                    'missing_partner', f'ir_img_path not found: {ir_path}',
                    'files', path=ir_path)))
    return found


def build_dataset(cfg, split: str):
    """Build the split's dataset as ``Runner.build_dataloader`` does.

    When the dataset refuses to build because partner images are missing
    (``on_missing_pair='error'``, the default), the refusal is recorded as a
    ``missing_partner`` finding and the dataset is built again with
    ``on_missing_pair='skip'`` so that the rest of the data is audited too.

    Returns:
        tuple: ``(dataset, findings)``: findings made while building.
    """
    from mmengine.registry import init_default_scope
    from mmdet.registry import DATASETS
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    ds_cfg = dataset_config(cfg, split)
    findings = []
    try:
        dataset = DATASETS.build(copy.deepcopy(ds_cfg))
    except FileNotFoundError as exc:
        holders = [h for h in _pair_policy_holders(ds_cfg)
                   if h.get('on_missing_pair') != 'skip']
        if not holders or 'pair' not in str(exc):
            raise
        findings.append(dict(index=None, img_path=None, ir_img_path=None,
                             **issue('missing_partner',
                                     f'the dataset refused to build: {exc}',
                                     'dataset')))
        for holder in holders:
            holder['on_missing_pair'] = 'skip'
        dataset = DATASETS.build(ds_cfg)
    if hasattr(dataset, 'full_init'):
        dataset.full_init()
    # A dataset may drop a sample without partner silently (or with a log
    # line that names a few): list every one from the folders themselves.
    listed = [f for leaf in leaf_datasets(dataset)
              for f in _missing_in_folders(leaf)]
    if listed:  # the complete list replaces the dataset's summary line
        findings = [f for f in findings if f['source'] != 'dataset'] + listed
    return dataset, findings


# ------------------------------------------------------ pairing (static)
def static_findings(cfg, split: str) -> List[dict]:
    """Findings from the split's dataset config alone: transforms that
    would move or mix one modality only (see
    :mod:`mmsafe.datasets.pipeline_check`)."""
    from mmengine.registry import init_default_scope
    from mmsafe.datasets.pipeline_check import config_pipeline_problems
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    problems = config_pipeline_problems(dataset_config(cfg, split),
                                        f'{split}_dataloader.dataset')
    return [dict(index=None, img_path=None, ir_img_path=None,
                 **issue('unpaired_transform', p, 'config'))
            for p in problems]


def add_findings(report: dict, findings: Sequence[dict]) -> dict:
    """Add dataset-level findings to a report (e.g. a build failure's)."""
    for found in findings:
        report['issues'].insert(0, dict(found))
        entry = report['summary'].setdefault(found['kind'], dict(
            severity=found['severity'], findings=0,
            meaning=CHECKS[found['kind']][1]))
        entry['findings'] += 1
        report['errors' if found['severity'] == ERROR else 'warnings'] += 1
    return report
