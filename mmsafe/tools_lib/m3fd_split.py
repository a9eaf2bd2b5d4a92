"""A deterministic train / val / test split of M3FD, whose release has none.

TarDAL, the reference code by M3FD's authors, splits by scene ranges listed
in a ``meta/scenario.json`` that is not published with the data; follow-up
work reports random splits by ratio (CDDFuse: 8:1:1) without
publishing the lists. So the split is made here, reproducibly:

* ``ratios`` (default 8:1:1): frames (or blocks of ``block`` consecutive
  frame numbers, which keeps near-identical neighbouring frames of one
  sequence on one side) are ordered by the SHA-256 of ``'{seed}/{key}'``
  and cut into the ratios. The order depends on the seed and the key
  only: the same files give the same lists on every machine and every
  Python, and a frame never changes side because another one was added
  or removed (except at the cut points);
* ``scenario``: TarDAL's ``scenario.json`` (``[{"name", "scene": [{"name",
  "mode": "train" | "val", "range": [{"min", "max"}]}]}]``), for its exact
  train / val lists when the file is at hand.

Each list is written sorted, one stem per line, as
``ImageSets/{train,val,test}.txt`` under the data root (the files
``configs/_base_/datasets/m3fd.py`` reads).
"""
import hashlib
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

from mmsafe.errors import (MMSafeFileExistsError, MMSafeFileNotFoundError,
                           MMSafeValueError)

#: the split names, in the order of the ratios
SPLIT_NAMES = ('train', 'val', 'test')
DEFAULT_RATIOS = (0.8, 0.1, 0.1)


def list_stems(data_root: str, folder: str = 'Vis',
               suffix: str = '.png') -> List[str]:
    """The sorted stems of ``data_root/folder/*suffix``.

    Raises:
        FileNotFoundError: the folder does not exist or holds no image.
    """
    path = osp.join(data_root, folder)
    if not osp.isdir(path):
        raise MMSafeFileNotFoundError(
            f'{path} does not exist: data_root must be the M3FD_Detection '
            f'folder holding {folder}/, Ir/ and Annotation/')
    stems = sorted(osp.splitext(name)[0] for name in os.listdir(path)
                   if name.lower().endswith(suffix.lower()))
    if not stems:
        raise MMSafeFileNotFoundError(f'{path} holds no *{suffix} image')
    return stems


def _block_key(stem: str, block: int) -> str:
    if block == 1:
        return stem
    if not stem.isdigit():
        raise MMSafeValueError(
            f'block={block} groups consecutive frame numbers, but {stem!r} '
            'is not a number; use block=1')
    return str(int(stem) // block)


def _order(key: str, seed: int) -> str:
    return hashlib.sha256(f'{seed}/{key}'.encode('utf-8')).hexdigest()


def split_by_ratios(stems: Sequence[str],
                    ratios: Sequence[float] = DEFAULT_RATIOS,
                    seed: int = 0,
                    block: int = 1) -> Dict[str, List[str]]:
    """Cut ``stems`` into ``len(ratios)`` splits (train, val[, test]).

    Args:
        stems (Sequence[str]): the frames.
        ratios (Sequence[float]): 2 or 3 positive shares (normalised).
        seed (int): changes the order, hence the lists.
        block (int): frames ``n // block`` stay together (numeric stems).

    Returns:
        dict: ``{name: sorted stems}``; the counts are the ratios' shares of
        the frames (rounded, in whole blocks), the last split takes the rest.
    """
    if not 2 <= len(ratios) <= len(SPLIT_NAMES) or \
            any(r <= 0 for r in ratios):
        raise MMSafeValueError(f'ratios={list(ratios)}: give 2 or 3 positive '
                               'shares (train, val[, test])')
    if block < 1:
        raise MMSafeValueError(f'block={block}: must be 1 or more')
    if len(set(stems)) != len(stems):
        raise MMSafeValueError('the frame list has duplicates')
    groups: Dict[str, List[str]] = {}
    for stem in stems:
        groups.setdefault(_block_key(stem, block), []).append(stem)
    ordered = sorted(groups, key=lambda k: _order(k, seed))
    total = float(sum(ratios))
    targets, acc = [], 0.0
    for ratio in ratios[:-1]:
        acc += ratio / total
        targets.append(round(acc * len(stems)))
    splits: Dict[str, List[str]] = {n: [] for n in SPLIT_NAMES[:len(ratios)]}
    names = list(splits)
    index, taken = 0, 0
    for key in ordered:
        while index < len(targets) and taken >= targets[index]:
            index += 1
        splits[names[index]] += groups[key]
        taken += len(groups[key])
    return {name: sorted(found) for name, found in splits.items()}


def split_by_scenario(stems: Sequence[str],
                      scenario_file: str) -> Dict[str, List[str]]:
    """TarDAL's train / val lists from its ``scenario.json``.

    Raises:
        ValueError: a scene has another mode, or lists frames that are not
            among ``stems``.
    """
    with open(scenario_file, encoding='utf-8') as f:
        scenarios = json.load(f)
    width = max(len(s) for s in stems)
    known = set(stems)
    splits: Dict[str, List[str]] = {'train': [], 'val': []}
    for scenario in scenarios:
        for scene in scenario['scene']:
            mode = scene['mode']
            if mode not in splits:
                raise MMSafeValueError(
                    f'{scenario_file}: scene {scene.get("name")!r} has mode '
                    f'{mode!r}; TarDAL knows train and val')
            for span in scene['range']:
                for n in range(int(span['min']), int(span['max']) + 1):
                    splits[mode].append(str(n).zfill(width))
    unknown = sorted(set(splits['train'] + splits['val']) - known)
    if unknown:
        raise MMSafeValueError(
            f'{scenario_file} lists {len(unknown)} frames that are not among '
            f'the images (first: {unknown[:5]})')
    return {name: sorted(set(found)) for name, found in splits.items()}


def write_split(data_root: str, splits: Dict[str, List[str]],
                out_dir: str = 'ImageSets',
                force: bool = False) -> Dict[str, str]:
    """Write ``{out_dir}/{name}.txt`` under ``data_root``.

    An existing list with other content is kept (FileExistsError naming
    it) unless ``force``: a split silently replaced under a finished
    experiment would mix its train and test frames.

    Returns:
        dict: ``{name: path written}``.
    """
    folder = osp.join(data_root, out_dir)
    os.makedirs(folder, exist_ok=True)
    texts = {name: ''.join(f'{s}\n' for s in found)
             for name, found in splits.items()}
    paths = {name: osp.join(folder, f'{name}.txt') for name in splits}
    if not force:
        for name, path in paths.items():
            if osp.exists(path):
                with open(path, encoding='utf-8') as f:
                    if f.read() != texts[name]:
                        raise MMSafeFileExistsError(
                            f'{path} exists with other frames; move it away '
                            'or pass --force to replace it')
    for name, path in paths.items():
        with open(path, 'w', encoding='utf-8', newline='\n') as f:
            f.write(texts[name])
    return paths


def make_split(data_root: str,
               ratios: Sequence[float] = DEFAULT_RATIOS,
               seed: int = 0,
               block: int = 1,
               scenario: Optional[str] = None,
               out_dir: str = 'ImageSets',
               force: bool = False) -> Dict[str, str]:
    """List the frames of ``data_root/Vis``, split them and write the lists.

    Returns:
        dict: ``{name: path written}``.
    """
    stems = list_stems(data_root)
    splits = (split_by_scenario(stems, scenario) if scenario else
              split_by_ratios(stems, ratios, seed, block))
    return write_split(data_root, splits, out_dir, force)
