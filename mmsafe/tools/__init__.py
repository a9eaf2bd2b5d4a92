"""mmsafe's command-line tools, for a clone and for an installed package.

Each module is a tool with ``main(argv)`` and the console command of the
same name (``mmsafe-train``, ``mmsafe-test``, ``mmsafe-check-dataset``,
``mmsafe-preflight``); ``python -m mmsafe.tools.<name>`` runs it too, and
the clone's ``tools/<name>.py`` is a thin entry point to it. A config named
``mmsafe::<path>`` (in ``_base_`` or on the command line) is one of
:data:`CONFIG_DIR` (:func:`scoped_config_path`; both live in
:mod:`mmsafe.tools_lib.cli`, the tools' own code, which never imports a
tool).
"""
from mmsafe.tools_lib.cli import CONFIG_DIR, scoped_config_path

__all__ = ['CONFIG_DIR', 'scoped_config_path']
