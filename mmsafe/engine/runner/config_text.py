"""The run's config text, formatted once.

MMEngine formats ``Config.pretty_text`` with yapf each time it is read,
and a run reads it many times: the Runner logs it and dumps it to the work
dir, each visualization backend stores it, the runtime-info hook keeps it,
and every checkpoint saved carries it in its meta (on every rank). yapf
takes about 0.5 s for a small detector config on one CPU core, and seconds
for a config whose long strings overflow its lines.

:func:`formatted_once` gives the Runner a copy of the config whose
``pretty_text`` keeps the last text it formatted, keyed by the config's
content (the ``repr`` of its dict, a millisecond to make). The text read is
therefore always the one MMEngine would format from the config as it is
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
        # the content, of which MMEngine's text is a function
        content = repr(self.to_dict())
        cached = self.__dict__.get('_mmsafe_formatted')
        if cached is not None and cached[0] == content:
            return cached[1]
        text = super().pretty_text
        # Config.__setattr__ writes into the config's dict: set the
        # attribute on the object, as Config does for its own state.
        object.__setattr__(self, '_mmsafe_formatted', (content, text))
        return text


def formatted_once(cfg) -> Optional[Config]:
    """A copy of ``cfg`` as a :class:`FormattedOnceConfig` (the same
    content, file name, text and formatting setting); a plain ``dict``
    (what MMEngine 0.7's runner builder hands ``from_cfg``) becomes one as
    the Runner would make a Config of it; ``None`` and a
    :class:`FormattedOnceConfig` are returned as they are."""
    if cfg is None or isinstance(cfg, FormattedOnceConfig):
        return cfg
    if not isinstance(cfg, Config):
        return FormattedOnceConfig(cfg) if isinstance(cfg, dict) else cfg
    # Config's deep copy keeps every attribute of the object (its dict,
    # file name, text, environment variables ... as each MMEngine release
    # has them; MMEngine 0.7's __setstate__ puts the environment variables
    # in place of the text), then the class says how to format it.
    once = copy.deepcopy(cfg)
    object.__setattr__(once, '__class__', FormattedOnceConfig)
    return once
