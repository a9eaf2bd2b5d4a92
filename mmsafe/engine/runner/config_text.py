"""The run's config text, formatted once.

MMEngine formats ``Config.pretty_text`` with yapf each time it is read,
and a run reads it many times: the Runner logs it and dumps it to the work
dir, each visualization backend stores it, the runtime-info hook keeps it,
and every checkpoint saved carries it in its meta (on every rank). yapf
takes about 0.5 s for a small detector config on one CPU core, and seconds
for a config whose long strings overflow its lines.

:func:`formatted_once` gives the Runner a copy of the config whose
``pretty_text`` keeps the last text it formatted, keyed by the text before
yapf (what MMEngine hands yapf, a few milliseconds to make). The text read
is therefore always the one MMEngine would format from the config as it is
then; a change to the config makes a new text.
"""
import copy
from typing import Optional

from mmengine.config import Config


class FormattedOnceConfig(Config):
    """A :class:`mmengine.config.Config` whose ``pretty_text`` formats each
    distinct content once (see the module's docstring)."""

    @property
    def pretty_text(self) -> str:
        unformatted = Config(self.to_dict(),
                             format_python_code=False).pretty_text
        cached = self.__dict__.get('_mmsafe_formatted')
        if cached is not None and cached[0] == unformatted:
            return cached[1]
        text = super().pretty_text
        # Config.__setattr__ writes into the config's dict: set the
        # attribute on the object, as Config does for its own state.
        object.__setattr__(self, '_mmsafe_formatted', (unformatted, text))
        return text


def formatted_once(cfg) -> Optional[Config]:
    """A copy of ``cfg`` as a :class:`FormattedOnceConfig` (the same
    content, file name, text and formatting setting), or ``cfg`` itself
    when it is not a :class:`mmengine.config.Config` (``None`` or a plain
    ``dict``, which the Runner turns into a Config of its own) or already
    is one."""
    if not isinstance(cfg, Config) or isinstance(cfg, FormattedOnceConfig):
        return cfg
    once = FormattedOnceConfig.__new__(FormattedOnceConfig)
    # Config's pickling state: its dict, file name, text, environment
    # variables, formatting setting and imported names.
    once.__setstate__(copy.deepcopy(cfg.__getstate__()))
    return once
