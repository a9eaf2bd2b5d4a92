"""mmsafe's command-line tools, for a clone and for an installed package.

Each module is a tool with ``main(argv)`` and the console command of the
same name (``mmsafe-train``, ``mmsafe-test``, ``mmsafe-check-dataset``,
``mmsafe-preflight``); ``python -m mmsafe.tools.<name>`` runs it too, and
the clone's ``tools/<name>.py`` is a thin entry point to it. A config named
``mmsafe::<path>`` (in ``_base_`` or on the command line) is one of
:data:`CONFIG_DIR`.
"""
import os.path as osp

from mmsafe.errors import MMSafeFileNotFoundError

#: mmsafe's configs: the clone's ``configs/`` folder, copied into an
#: installed package (linked in an editable install)
CONFIG_DIR = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))),
                      '.mim', 'configs')


def scoped_config_path(config: str) -> str:
    """The file of a config named on a command line by package:
    ``mmsafe::llvip/demo_cpu.py`` is ``llvip/demo_cpu.py`` of
    :data:`CONFIG_DIR`, ``mmdet::...`` the same in the installed
    MMDetection's ``.mim/configs``; ``config`` itself when it names no
    package.

    Raises:
        FileNotFoundError: the package has no such config; the message
            says where it looked.
    """
    scope, sep, rel = config.partition('::')
    if not sep:
        return config
    if scope == 'mmsafe':
        root = CONFIG_DIR
    else:
        from mmengine.config.utils import MODULE2PACKAGE
        from mmengine.utils import get_installed_path
        root = osp.join(get_installed_path(MODULE2PACKAGE.get(scope, scope)),
                        '.mim', 'configs')
    path = osp.join(root, rel)
    if not osp.isfile(path):
        raise MMSafeFileNotFoundError(
            f'[mmsafe] {config!r}: no such config in {root}. A package '
            "ships its configs there (mmsafe's are those of a clone's "
            "configs/ folder, e.g. 'mmsafe::llvip/demo_cpu.py').")
    return path
