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
