"""Small files in the formats of the aligned FLIR, M3FD and LLVIP releases,
written by the tests: the xml as each release writes it (its tags, its
coordinate base), tiny images of the stated size."""
import os
import os.path as osp
from typing import Optional, Sequence, Tuple

import cv2
import numpy as np

Box = Tuple[str, Tuple[float, float, float, float]]


def release_xml(filename: str, size: Optional[Tuple[int, int]],
                objects: Sequence[Box], root_tag: str = 'annotation',
                folder: str = 'JPEGImages') -> str:
    """A VOC xml as the releases write it; ``size=None`` leaves out
    ``<size>``; the coordinates are written as given (already in the
    release's base)."""
    size_xml = '' if size is None else (
        f'\t<size>\n\t\t<width>{size[0]}</width>\n\t\t<height>{size[1]}'
        '</height>\n\t\t<depth>3</depth>\n\t</size>\n')
    objs = ''.join(
        f'\t<object>\n\t\t<name>{name}</name>\n\t\t<pose>Unspecified</pose>'
        '\n\t\t<truncated>0</truncated>\n\t\t<difficult>0</difficult>\n'
        f'\t\t<bndbox>\n\t\t\t<xmin>{b[0]:g}</xmin>\n\t\t\t<ymin>{b[1]:g}'
        f'</ymin>\n\t\t\t<xmax>{b[2]:g}</xmax>\n\t\t\t<ymax>{b[3]:g}</ymax>'
        '\n\t\t</bndbox>\n\t</object>\n' for name, b in objects)
    return (f'<?xml version="1.0" ?><{root_tag}>\n\t<folder>{folder}'
            f'</folder>\n\t<filename>{filename}</filename>\n\t<source>\n'
            '\t\t<database>Unknown</database>\n\t</source>\n'
            f'{size_xml}\t<segmented>0</segmented>\n{objs}</{root_tag}>\n')


def write_text(path: str, text: str) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)


def write_image(path: str, size: Tuple[int, int], seed: int = 0) -> None:
    """A ``size`` = (width, height) image: a plain ramp, quick to encode
    at the releases' real sizes."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    ramp = (np.arange(size[0], dtype=np.uint16) * 255 // max(size[0], 1))
    img = np.broadcast_to((ramp + 40 * seed).astype(np.uint8)[None, :, None],
                          (size[1], size[0], 3))
    assert cv2.imwrite(path, np.ascontiguousarray(img)), path


def write_flir_frame(root: str, frame: str, size: Tuple[int, int],
                     objects: Sequence[Box]) -> str:
    """``JPEGImages/{frame}_RGB.jpg`` + ``_PreviewData.jpeg`` and
    ``Annotations/{frame}_PreviewData.xml`` (0-based, as the release)."""
    write_image(osp.join(root, 'JPEGImages', f'{frame}_RGB.jpg'), size)
    write_image(osp.join(root, 'JPEGImages', f'{frame}_PreviewData.jpeg'),
                size, seed=1)
    path = osp.join(root, 'Annotations', f'{frame}_PreviewData.xml')
    write_text(path, release_xml(f'{frame}_PreviewData.jpeg', size, objects))
    return path


def write_m3fd_frame(root: str, stem: str, size: Tuple[int, int],
                     objects: Sequence[Box],
                     xml_size: Optional[Tuple[int, int]] = 'image') -> str:
    """``Vis/``, ``Ir/`` ``{stem}.png`` of ``size`` and
    ``Annotation/{stem}.xml`` (1-based); ``xml_size`` is the size the xml
    states (``'image'``: the image's, None: no ``<size>``)."""
    write_image(osp.join(root, 'Vis', f'{stem}.png'), size)
    write_image(osp.join(root, 'Ir', f'{stem}.png'), size, seed=1)
    stated = size if xml_size == 'image' else xml_size
    path = osp.join(root, 'Annotation', f'{stem}.xml')
    write_text(path, release_xml(f'{stem}.png', stated, objects,
                                 folder='M3FD'))
    return path


def write_llvip_frame(root: str, stem: str, size: Tuple[int, int],
                      objects: Sequence[Box], split: str = 'train') -> str:
    """``visible/{split}/``, ``infrared/{split}/`` ``{stem}.jpg`` and
    ``Annotations/{stem}.xml`` (1-based)."""
    write_image(osp.join(root, 'visible', split, f'{stem}.jpg'), size)
    write_image(osp.join(root, 'infrared', split, f'{stem}.jpg'), size,
                seed=1)
    path = osp.join(root, 'Annotations', f'{stem}.xml')
    write_text(path, release_xml(f'{stem}.jpg', size, objects))
    return path
