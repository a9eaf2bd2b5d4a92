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


def iter_loop_skips_trained_batches() -> bool:
    """Whether MMEngine's ``IterBasedTrainLoop.run`` loads and drops the
    batches a resumed run had trained before it goes on (MMEngine 0.8 and
    newer: "Advance dataloader N steps"); MMEngine 0.7 starts the loader
    from its first batch again.

    Asked of MMEngine's own ``run``, on a stand-in loop that has trained
    two of its two iterations: the batches it draws before it ends.
    """
    from mmengine.runner import IterBasedTrainLoop

    class _Runner:
        model = None
        val_loop = None

        def call_hook(self, *args, **kwargs) -> None:
            pass

    class _Batches:
        drawn = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.drawn += 1
            return {}

    import logging

    from mmengine.logging import MMLogger
    batches = _Batches()
    stand_in = object.__new__(IterBasedTrainLoop)
    stand_in.__dict__.update(_runner=_Runner(), _iter=2, _max_iters=2,
                             stop_training=False, dataloader_iterator=batches)
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.ERROR)  # not the stand-in's "Advance ..." line
    try:
        IterBasedTrainLoop.run(stand_in)
    finally:
        logger.setLevel(level)
    return batches.drawn == 2
