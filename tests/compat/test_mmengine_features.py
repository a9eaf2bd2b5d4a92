"""mmsafe.compat.mmengine_features: MMEngine's differences, found by
asking MMEngine."""
from mmsafe.compat.mmengine_features import config_text_problem


def test_this_environment_prints_configs():
    assert config_text_problem() is None


def test_an_mmengine_that_passes_verify_to_a_newer_yapf_is_named(
        monkeypatch):
    """yapf 0.40.2 dropped FormatCode's ``verify``; MMEngine before 0.10
    passes it. Played with a FormatCode that refuses it as yapf 0.40.2
    does: the problem is named exactly when this MMEngine passes it."""
    import mmengine.config.config as mmengine_config
    real = mmengine_config.FormatCode
    calls = []

    def format_code(source, style_config=None, **kwargs):
        calls.append(kwargs)
        if 'verify' in kwargs:
            raise TypeError(
                "FormatCode() got an unexpected keyword argument 'verify'")
        return real(source, style_config=style_config)

    monkeypatch.setattr(mmengine_config, 'FormatCode', format_code)
    problem = config_text_problem()
    passes_verify = any('verify' in kwargs for kwargs in calls)
    assert calls, 'MMEngine did not format the config text with yapf'
    assert (problem is not None) == passes_verify
    if passes_verify:
        assert 'yapf<=0.40.1' in problem and 'MMEngine 0.10' in problem


def test_error_as_raised_is_the_components_own_error():
    """Whatever MMEngine's build does with an error (0.7 re-raises a copy
    without attributes), the component's own error is found."""
    from mmengine.registry import Registry

    from mmsafe.compat.mmengine_features import error_as_raised

    class FileError(ValueError):
        def __init__(self, message, path=None):
            super().__init__(message)
            self.path = path

    toys = Registry('mmsafe compat toy')

    @toys.register_module()
    class Broken:
        def __init__(self):
            raise FileError('bad field in a.xml', path='a.xml')

    try:
        toys.build(dict(type='Broken'))
    except FileError as err:
        original = error_as_raised(err)
    assert isinstance(original, FileError)
    assert original.path == 'a.xml'
    assert str(original) == 'bad field in a.xml'
    plain = ValueError('not from a build')
    assert error_as_raised(plain) is plain


def test_iter_loop_skips_trained_batches_is_what_mmengine_does():
    """Asked of MMEngine's own loop; its source tells the same (the skip
    logs "Advance dataloader ..." where MMEngine has it)."""
    import inspect

    from mmengine.runner import IterBasedTrainLoop

    from mmsafe.compat.mmengine_features import \
        iter_loop_skips_trained_batches
    skips = iter_loop_skips_trained_batches()
    assert skips is ('Advance dataloader' in inspect.getsource(
        IterBasedTrainLoop.run))
