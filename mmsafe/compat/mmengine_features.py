"""What differs between the supported MMEngine releases (0.7 to 0.10),
asked of MMEngine itself, never by comparing version strings."""
from typing import Optional


def config_text_problem() -> Optional[str]:
    """Why MMEngine cannot print a config here, or None when it can.

    Every run prints its config (``Config.pretty_text``, formatted with
    yapf). MMEngine before 0.10 calls yapf's ``FormatCode(...,
    verify=True)``, an argument yapf 0.40.2 removed: such a pair fails
    each run at its start with a bare ``TypeError``.
    """
    from mmengine.config import Config
    try:
        Config(dict(a=1)).pretty_text
    except TypeError as err:
        if 'verify' not in str(err):
            raise
        import yapf
        return (f'this MMEngine passes verify= to yapf\'s FormatCode, which '
                f'yapf {getattr(yapf, "__version__", "?")} no longer takes '
                f'({err}): install yapf<=0.40.1 (pip install '
                '"yapf<=0.40.1") or MMEngine 0.10')
    return None


def error_as_raised(err: BaseException) -> BaseException:
    """The error a component raised while a registry built it.

    MMEngine before 0.8 re-raises an error of ``Registry.build`` as a new
    one of the same type whose message is the class's location and the
    original message, with none of the original's attributes (mmsafe's
    errors carry the file, line, rank ... as attributes); the original is
    its ``__context__``. Later MMEngine lets the original through: then
    ``err`` itself is returned.
    """
    inner = err.__context__
    while (inner is not None and type(inner) is type(err)
           and str(err).endswith(str(inner))):
        err, inner = inner, inner.__context__
    return err
