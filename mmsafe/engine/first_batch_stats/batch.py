"""Access to a data batch before and after the data preprocessor."""
from typing import Any, Dict, Optional

import torch


def as_modalities(inputs: Any) -> Dict[str, Any]:
    """``{'visible': x, 'infrared': y}`` for paired inputs, ``{'img': x}``
    for a single-modality detector."""
    if isinstance(inputs, dict):
        return dict(inputs)
    return {'img': inputs}


def valid_crop(batch: torch.Tensor, i: int, shape) -> torch.Tensor:
    """Sample ``i`` of a padded batch, cropped to its valid ``(h, w)``."""
    h, w = batch.shape[-2:]
    if shape is not None:
        h, w = min(h, int(shape[0])), min(w, int(shape[1]))
    return batch[i, :, :h, :w]


def raw_image(raw_mods: dict, name: str, i: int) -> Optional[torch.Tensor]:
    """Sample ``i`` of modality ``name`` as the pipeline delivered it."""
    raw = raw_mods.get(name)
    if raw is None:
        return None
    return raw[i] if i < len(raw) else None


def make_flag(kind: str, modality: str, i: int, files: list,
              message: str) -> dict:
    """A flag record: ``kind``, ``modality``, ``sample``, ``file`` and the
    ``message`` naming the sample's file."""
    name = files[i] if i < len(files) else None
    return dict(kind=kind, modality=modality, sample=i, file=name,
                message=f'{message} (sample {i}: {name})')
