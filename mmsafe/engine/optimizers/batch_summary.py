"""What a skipped step's batch held: per image its files, size, value range
and a summary of its annotations.

The NaN-skip wrappers keep a reference to each batch of the step's
accumulation window as the data preprocessor receives it (the collated
CPU batch, before normalisation) and summarise it only when the step is
skipped: a healthy step reads nothing. Everything here reads CPU tensors
(the loader's output), never a device tensor.
"""
from typing import Any, Dict, List, Optional

import torch

from mmsafe.modalities import sample_files


def _boxes(gt: Any) -> Optional[torch.Tensor]:
    """The ``N x 4`` (x1, y1, x2, y2) boxes of ``gt_instances``, as a
    float tensor (MMDetection's box types hold theirs in ``.tensor``)."""
    boxes = getattr(gt, 'bboxes', None)
    boxes = getattr(boxes, 'tensor', boxes)
    if not isinstance(boxes, torch.Tensor) or boxes.dim() != 2 or \
            boxes.shape[-1] < 4:
        return None
    return boxes.detach()[:, :4].float().cpu()


def annotation_summary(sample: Any) -> Dict[str, Any]:
    """Boxes per image, the largest and smallest box (width x height in
    pixels of the packed image) and the class ids of one data sample.

    Args:
        sample: a ``DetDataSample`` (anything with ``gt_instances``).

    Returns:
        dict: ``boxes`` (count), ``largest`` and ``smallest`` (``[w, h]``
        by area, None without boxes), ``classes`` (sorted class ids).
    """
    gt = getattr(sample, 'gt_instances', None)
    boxes = _boxes(gt)
    labels = getattr(gt, 'labels', None)
    classes = (sorted({int(v) for v in labels.detach().cpu().flatten()})
               if isinstance(labels, torch.Tensor) else [])
    if boxes is None or not len(boxes):
        return dict(boxes=0, largest=None, smallest=None, classes=classes)
    wh = boxes[:, 2:4] - boxes[:, 0:2]
    area = wh[:, 0] * wh[:, 1]
    big, small = int(area.argmax()), int(area.argmin())
    return dict(boxes=int(len(boxes)),
                largest=[round(float(v), 1) for v in wh[big]],
                smallest=[round(float(v), 1) for v in wh[small]],
                classes=classes)


def _images_of(inputs: Any, index: int) -> Dict[str, torch.Tensor]:
    """The image tensors of sample ``index`` in a collated ``inputs``: a
    list of tensors (one image per sample), a batch tensor, or a dict of
    those per modality."""
    if isinstance(inputs, dict):
        found = {}
        for name, value in inputs.items():
            for sub, img in _images_of(value, index).items():
                found[name if sub == 'image' else f'{name}.{sub}'] = img
        return found
    if isinstance(inputs, (list, tuple)) and index < len(inputs) and \
            isinstance(inputs[index], torch.Tensor):
        return dict(image=inputs[index])
    if isinstance(inputs, torch.Tensor) and inputs.dim() == 4 and \
            index < inputs.shape[0]:
        return dict(image=inputs[index])
    return {}


def value_ranges(inputs: Any, index: int) -> Dict[str, List[float]]:
    """``{modality: [min, max]}`` of sample ``index``'s images as loaded
    (CPU tensors; a device tensor is not read)."""
    ranges = {}
    for name, img in _images_of(inputs, index).items():
        if img.device.type != 'cpu' or not img.numel():
            continue
        values = img.detach()
        ranges[name] = [float(values.min()), float(values.max())]
    return ranges


def batch_summary(data: Any) -> List[Dict[str, Any]]:
    """One summary per image of a collated batch (``inputs`` and
    ``data_samples``, as the data preprocessor receives it).

    Args:
        data (dict): the batch.

    Returns:
        list[dict]: per image ``file`` (``visible | infrared`` for a pair),
        ``img_shape``, ``ori_shape``, ``dtype``, ``range`` (min and max of
        each modality as loaded) and :func:`annotation_summary`.
    """
    if not isinstance(data, dict):
        return []
    samples = data.get('data_samples') or []
    inputs = data.get('inputs')
    out = []
    for i, sample in enumerate(samples):
        meta = getattr(sample, 'metainfo', {}) or {}
        path, ir_path = sample_files(meta)
        images = _images_of(inputs, i)
        entry = dict(
            file=path if ir_path is None else f'{path} | {ir_path}',
            img_shape=_shape(meta.get('img_shape')),
            ori_shape=_shape(meta.get('ori_shape')),
            dtype=sorted({str(t.dtype).replace('torch.', '')
                          for t in images.values()}),
            range=value_ranges(inputs, i))
        entry.update(annotation_summary(sample))
        out.append(entry)
    return out


def _shape(value: Any) -> Optional[List[int]]:
    if value is None:
        return None
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        return None


def describe(entry: Dict[str, Any]) -> str:
    """One image's summary in words, for log lines."""
    shape = entry.get('ori_shape') or entry.get('img_shape')
    parts = [f"{shape[1]}x{shape[0]}" if shape else 'size ?']
    parts.append(f"{entry.get('boxes', 0)} boxes")
    if entry.get('boxes'):
        big, small = entry['largest'], entry['smallest']
        parts.append(f'largest {big[0]:g}x{big[1]:g}, smallest '
                     f'{small[0]:g}x{small[1]:g}')
        parts.append(f"classes {entry.get('classes')}")
    for name, (low, high) in sorted((entry.get('range') or {}).items()):
        parts.append(f'{name} {low:g}..{high:g}')
    return f"{entry.get('file')} ({', '.join(parts)})"
