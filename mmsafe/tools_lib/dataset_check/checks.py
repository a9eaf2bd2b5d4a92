"""The checks of one sample: as stored (files, sizes, boxes, labels) and as
the pipeline delivers it; each finding is an :func:`issue` of a kind in
:data:`CHECKS`."""
import os.path as osp
from collections import OrderedDict
from typing import List

import numpy as np

from .coordinates import border_contacts

# How far past the border a box may reach, as a share of its own width
# (left/right) or height (top/bottom), and still be an object cut by the
# frame, annotated by its full extent: a warning, since the transforms clip
# it. KAIST's released annotations have such boxes (39 of 110,447, up to
# 6 px and 22% of their width past the right border). Beyond this share
# and --box-tolerance px the box is mostly outside its image: an error.
PAST_BORDER_SHARE = 0.25

ERROR = 'error'
WARNING = 'warning'

# kind -> (severity, what it means). The order is the order of the summary.
CHECKS = OrderedDict([
    ('dataset_build', (ERROR, 'the dataset could not be built')),
    ('malformed_annotation', (ERROR, 'an annotation file has a malformed '
                              'field (file, element and line named)')),
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
    ('out_of_image_box', (ERROR, 'box past the image border by more than '
                          '--box-tolerance px and more than a quarter of '
                          'its own width/height')),
    ('box_past_border', (WARNING, 'box past the image border by at most '
                         '--box-tolerance px or a quarter of its own '
                         'width/height (the transforms clip it)')),
    ('coordinate_base', (WARNING, "the split's boxes at the image borders "
                         'say the dataset reads them 1 px off (wrong '
                         'coordinate base)')),
    ('label_out_of_range', (ERROR, 'label outside [0, num_classes)')),
    ('class_name_variant', (ERROR, 'objects named as a class but for case '
                            'or spacing (Person for person): not read as '
                            'that class unless class_aliases maps them')),
    ('unknown_class', (WARNING, 'objects whose name is not a class '
                       '(dropped, or KAIST ignore regions), per name')),
    ('pipeline_error', (ERROR, 'the pipeline raised an exception')),
    ('pipeline_filtered', (WARNING, 'the pipeline returned None (training '
                           'silently draws another sample)')),
    ('unexpected_output', (ERROR, 'pipeline output has no inputs / '
                           'data_samples')),
    ('pair_shape_mismatch', (ERROR, 'modalities differ in shape after the '
                             'pipeline')),
    ('nearly_constant_modality', (WARNING, 'a modality nearly constant '
                                  'after the pipeline (the pairing checks '
                                  'abstain on the pair)')),
    ('no_valid_instances', (WARNING, 'no valid instances after the pipeline '
                            '(an empty batch under DDP; see '
                            'ValidInstanceResampleDataset)')),
    ('pair_mirrored', (ERROR, 'infrared matches its visible partner only '
                       'mirrored (image content)')),
    ('pair_shifted', (ERROR, 'infrared matches its visible partner only '
                      'shifted (image content)')),
    ('pair_unrelated', (ERROR, 'infrared shares no structure with its '
                        'partner, nor do most pairs (other frames)')),
    ('pair_objects_offset', (WARNING, 'more boxes disagree with the '
                             'infrared image (nothing there, or matched '
                             'beyond --max-offset px) than agree')),
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
    over, share = _overshoot(boxes, width, height)
    outside = np.where((over > tol) & (share > PAST_BORDER_SHARE))[0]
    if len(outside):
        found.append(issue(
            'out_of_image_box',
            f'{len(outside)} box(es) outside the {width:g}x{height:g} image '
            f'in {where} (past its border by more than {tol:g} px and '
            f'{PAST_BORDER_SHARE:.0%} of their size): '
            f'{boxes[outside[:3]].round(2).tolist()}', source,
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
    record = dict(raw_size=vis_size, raw_boxes=len(boxes),
                  ann_path=info.get('xml_path') or info.get('ann_path'))
    if width is not None and height is not None:
        found += _box_issues(boxes, labels, float(width), float(height),
                             num_classes, tol, 'annotation', 'annotation')
        found += _past_border(boxes, float(width), float(height), tol)
        record['border'] = border_contacts(boxes, float(width),
                                           float(height))
    return dict(issues=found, **record)


def _past_border(boxes: np.ndarray, width: float, height: float,
                 tol: float) -> List[dict]:
    """Boxes past the border of their own image (converted coordinates
    negative or beyond the width/height) by at most ``tol`` px or
    :data:`PAST_BORDER_SHARE` of their size; farther they are
    ``out_of_image_box``."""
    if len(boxes) == 0:
        return []
    over, share = _overshoot(boxes, width, height)
    past = np.where((over > 0)
                    & ((over <= tol) | (share <= PAST_BORDER_SHARE)))[0]
    if not len(past):
        return []
    return [issue(
        'box_past_border',
        f'{len(past)} box(es) past the border of the {width:g}x{height:g} '
        f'image after conversion, by up to {over[past].max():g} px: '
        f'{boxes[past[:3]].round(2).tolist()} (negative, or beyond the '
        'size; the transforms clip them. Many at exactly -1 mean a wrong '
        'coordinate base, see coordinate_base)', 'annotation',
        boxes=boxes[past].round(3).tolist())]


def _overshoot(boxes: np.ndarray, width: float, height: float):
    """Per box: how far (px) it reaches past the image border, and that
    distance as a share of the box's width (left, right) or height (top,
    bottom); a share is infinite for a box without size on that axis."""
    past_x = np.maximum(-boxes[:, 0], boxes[:, 2] - width).clip(min=0)
    past_y = np.maximum(-boxes[:, 1], boxes[:, 3] - height).clip(min=0)

    def share(past, size):
        out = np.where(past > 0, np.inf, 0.0)
        np.divide(past, size, out=out, where=size > 0)
        return out

    return (np.maximum(past_x, past_y),
            np.maximum(share(past_x, boxes[:, 2] - boxes[:, 0]),
                       share(past_y, boxes[:, 3] - boxes[:, 1])))


def unpack_result(result):
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
    mods, sample = unpack_result(result)
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
