"""The command-line tools' own code, below them (``mmsafe.tools`` imports
it, never the reverse): reading a config (``mmsafe::`` names included)
and building a runner (:mod:`.cli`), the dataset checker's audit and report
(:mod:`.dataset_check`, :mod:`.dataset_stats`) and the M3FD split
(:mod:`.m3fd_split`). The image analysis they share with the training
hooks is :mod:`mmsafe.analysis`."""
