"""Draw a visible | infrared pair side by side with its boxes.

Used by ``tools/check_dataset.py --show-dir`` and ``FirstBatchStatsHook`` so
that a user sees at a glance whether both images and the boxes line up.
"""
from typing import Optional, Sequence

import cv2
import numpy as np

BOX_COLOR = (0, 255, 0)  # BGR
IGNORED_COLOR = (0, 165, 255)
GAP = 4


def to_hwc_uint8(img) -> np.ndarray:
    """Convert an image tensor/array (``[C, H, W]`` or ``[H, W(, C)]``) to a
    contiguous ``H x W x 3`` uint8 array without changing the channel
    order."""
    if hasattr(img, 'detach'):
        img = img.detach().cpu().numpy()
    img = np.asarray(img)
    if img.ndim == 3 and img.shape[0] in (1, 3) and img.shape[2] not in (1, 3):
        img = img.transpose(1, 2, 0)
    if img.ndim == 2:
        img = img[..., None]
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    if img.dtype != np.uint8:
        img = np.clip(img, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(img[..., :3])


def _boxes_array(boxes) -> np.ndarray:
    if boxes is None:
        return np.zeros((0, 4), dtype=np.float32)
    if hasattr(boxes, 'tensor'):  # mmdet BaseBoxes
        boxes = boxes.tensor
    if hasattr(boxes, 'detach'):
        boxes = boxes.detach().cpu().numpy()
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 4)


def _draw_boxes(img: np.ndarray, boxes: np.ndarray, labels: Sequence,
                class_names: Sequence[str], color) -> None:
    for i, (x1, y1, x2, y2) in enumerate(boxes):
        p1 = (int(round(x1)), int(round(y1)))
        p2 = (int(round(x2)), int(round(y2)))
        cv2.rectangle(img, p1, p2, color, 1)
        if labels is not None and i < len(labels):
            label = int(labels[i])
            text = (class_names[label] if 0 <= label < len(class_names) else
                    f'label {label}?')
            cv2.putText(img, text, (p1[0], max(p1[1] - 2, 8)),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.35, color, 1)


def draw_pair(visible,
              infrared,
              bboxes=None,
              labels=None,
              class_names: Sequence[str] = (),
              ignored_bboxes=None,
              title: Optional[str] = None) -> np.ndarray:
    """Return ``visible | infrared`` with the same boxes drawn on both.

    Args:
        visible: visible image, ``[C, H, W]`` tensor or ``H x W x C`` array.
        infrared: infrared image of the same geometry (may be ``None`` for a
            single-modality sample; a grey placeholder is drawn then).
        bboxes: ``(N, 4)`` boxes (x1, y1, x2, y2) in image coordinates,
            tensor, array or mmdet ``BaseBoxes``.
        labels: ``N`` class indices.
        class_names: names for the labels.
        ignored_bboxes: boxes marked ignore, drawn in another colour.
        title: a line of text written on the visible image.

    Returns:
        np.ndarray: ``H x (W_v + gap + W_i) x 3`` uint8 image in the channel
        order of the inputs.
    """
    vis = to_hwc_uint8(visible).copy()
    ir = (to_hwc_uint8(infrared).copy() if infrared is not None else
          np.full_like(vis, 127))
    boxes = _boxes_array(bboxes)
    ignored = _boxes_array(ignored_bboxes)
    for img in (vis, ir):
        _draw_boxes(img, boxes, labels, class_names, BOX_COLOR)
        _draw_boxes(img, ignored, None, class_names, IGNORED_COLOR)
    if title:
        cv2.putText(vis, title, (2, 12), cv2.FONT_HERSHEY_SIMPLEX, 0.4,
                    (255, 255, 255), 1)
    h = max(vis.shape[0], ir.shape[0])
    canvas = np.full((h, vis.shape[1] + GAP + ir.shape[1], 3), 255, np.uint8)
    canvas[:vis.shape[0], :vis.shape[1]] = vis
    canvas[:ir.shape[0], vis.shape[1] + GAP:] = ir
    return canvas


def put_label(img: np.ndarray, text: str, org, color,
              scale: float = 0.35) -> None:
    """Write ``text`` at ``org`` (its bottom-left corner, clipped into the
    image) on a dark backing, legible on bright infrared people and on
    dark ground alike."""
    font = cv2.FONT_HERSHEY_SIMPLEX
    (tw, th), base = cv2.getTextSize(text, font, scale, 1)
    x = int(min(max(0, org[0]), max(0, img.shape[1] - tw - 1)))
    y = int(min(max(th + 1, org[1]), img.shape[0] - base - 1))
    cv2.rectangle(img, (x, y - th - 1), (x + tw, y + base), (0, 0, 0), -1)
    cv2.putText(img, text, (x, y), font, scale, color, 1)
