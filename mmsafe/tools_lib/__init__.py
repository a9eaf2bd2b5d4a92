"""Library code behind mmsafe's command-line tools (``tools/*.py``), kept
importable so that tests and hooks can reuse it."""
