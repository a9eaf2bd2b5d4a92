"""Convert an old checkpoint once, outside training, or check one: ``mmsafe.tools.convert_checkpoint``.

The same command as ``mmsafe-convert-checkpoint`` and ``python -m mmsafe.tools.convert_checkpoint`` of
an installed mmsafe (``python tools/convert_checkpoint.py --help`` lists the options).
Run from a clone, this file puts the clone's mmsafe first on the path; in
an installed package (``mmsafe/.mim/tools/``, where ``mim`` looks) it
uses the installed one.
"""
import os.path as osp
import sys

_CLONE = osp.dirname(osp.dirname(osp.abspath(__file__)))
if osp.isfile(osp.join(_CLONE, 'mmsafe', '__init__.py')):
    sys.path.insert(0, _CLONE)

from mmsafe.tools.convert_checkpoint import console_main  # noqa: E402

if __name__ == '__main__':
    sys.exit(console_main())
