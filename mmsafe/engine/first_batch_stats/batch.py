"""Access to the per-modality images of a batch, before and after the data
preprocessor (found by the run's modalities, :mod:`mmsafe.engine.modalities`:
one ``[C, H, W]`` image per sample and modality)."""
from typing import Any, Optional, Sequence


def valid_crop(img: Any, shape: Optional[Sequence[int]]) -> Any:
    """A preprocessed ``[C, H, W]`` image cropped to its valid ``(h, w)``
    (the padding removed)."""
    h, w = img.shape[-2:]
    if shape is not None:
        h, w = min(h, int(shape[0])), min(w, int(shape[1]))
    return img[:, :h, :w]


def raw_image(raw_mods: dict, name: str, i: int) -> Optional[Any]:
    """Sample ``i`` of modality ``name`` as the pipeline delivered it."""
    raw = raw_mods.get(name)
    if raw is None:
        return None
    return raw[i] if i < len(raw) else None


def make_flag(kind: str, modality: str, i: int, files: list,
              message: str, ir_files: Optional[list] = None) -> dict:
    """A flag record: ``kind``, ``modality``, ``sample``, ``file`` (and
    ``ir_file`` when known) and the ``message`` naming the sample's
    files."""
    name = files[i] if i < len(files) else None
    ir_name = ir_files[i] if ir_files and i < len(ir_files) else None
    shown = name if ir_name is None else f'{name} | {ir_name}'
    flag = dict(kind=kind, modality=modality, sample=i, file=name,
                message=f'{message} (sample {i}: {shown})')
    if ir_name is not None:
        flag['ir_file'] = ir_name
    return flag
