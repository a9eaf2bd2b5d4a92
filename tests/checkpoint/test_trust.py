"""Opt-in trust by identity: a trusted name is resolved and compared by
the object's own module and qualified name; aliases of never-trusted
objects are refused; a refusal suggests trusting only what resolves, in
this process and without importing anything, to a class or function
outside the never-trusted modules under its own name."""
import os  # noqa: F401  (tests name `tests.checkpoint.test_trust.os`)
import pickle
import sys
from subprocess import Popen  # noqa: F401  (an alias of a never-trusted class)

import pytest
import torch

import mmsafe  # noqa: F401
from mmsafe.checkpoint import (UntrustedCheckpointError, explain_refusals,
                               load_checkpoint_file,
                               trusted_checkpoint_globals)
from mmsafe.checkpoint.trust import opt_in_hint, resolve_trusted_globals
from tests.checkpoint import payloads as p
from tests.engine.ckpt_toys import TrustedNote

NoteAlias = TrustedNote
NOTE = 'tests.engine.ckpt_toys.TrustedNote'


class StatefulNote:
    """A trusted class with its own ``__setstate__``."""

    def __init__(self, text=''):
        self.text = text

    def __setstate__(self, state):
        self.text = state['text'].upper()


def _note_file(tmp_path, note):
    path = str(tmp_path / 'noted.pth')
    torch.save(dict(meta=dict(note=note), state_dict={}), path)
    return path


def test_a_project_class_is_refused_then_trusted_by_config_or_env(
        tmp_path, monkeypatch):
    from mmengine.config import Config
    path = _note_file(tmp_path, TrustedNote('hi'))
    with pytest.raises(UntrustedCheckpointError) as info:
        load_checkpoint_file(path)
    message = str(info.value)
    assert f'`{NOTE}`' in message
    assert f"mmsafe_trusted_globals = ['{NOTE}']" in message
    assert f'MMSAFE_TRUSTED_GLOBALS={NOTE}' in message
    assert info.value.global_name == NOTE
    with trusted_checkpoint_globals(cfg=Config(dict(
            mmsafe_trusted_globals=[NOTE]))):
        assert load_checkpoint_file(path)['meta']['note'].text == 'hi'
    with pytest.raises(UntrustedCheckpointError):
        load_checkpoint_file(path)  # the trust ends with its context
    monkeypatch.setenv('MMSAFE_TRUSTED_GLOBALS', f' ,{NOTE}')
    assert load_checkpoint_file(path)['meta']['note'].text == 'hi'


def test_trust_by_identity_through_an_alias_and_extra(tmp_path):
    path = _note_file(tmp_path, TrustedNote('hi'))
    # an alias resolves to the class, which is trusted by its own name
    assert resolve_trusted_globals([f'{__name__}.NoteAlias']) == [
        (TrustedNote, NOTE)]
    with trusted_checkpoint_globals(extra=[TrustedNote]):
        assert load_checkpoint_file(path)['meta']['note'].text == 'hi'
    stateful = _note_file(tmp_path, StatefulNote('quiet'))
    with trusted_checkpoint_globals(extra=[StatefulNote]):
        assert load_checkpoint_file(stateful)['meta']['note'].text == \
            'QUIET'


@pytest.mark.parametrize('name,match', [
    ('mmengine.logging.logger.os.system', 'cannot be trusted'),
    ('builtins.exec', 'cannot be trusted'),
    ('torch.load', 'cannot be trusted'),
    (f'{__name__}.os.system', 'only classes and Python functions'),
    (f'{__name__}.Popen', 'from subprocess'),
    (f'{__name__}.os', 'only classes and Python functions'),
    ('tests.checkpoint.no_such_module.Thing', 'cannot be imported'),
])
def test_never_trusted_objects_are_refused_under_any_name(name, match):
    with pytest.raises(ValueError, match=match):
        resolve_trusted_globals([name])


def test_extra_objects_are_checked_the_same_way():
    with pytest.raises(ValueError, match='only classes and Python'):
        with trusted_checkpoint_globals(extra=[os.system]):
            pass
    with pytest.raises(ValueError, match="'subprocess.Popen' cannot be"):
        with trusted_checkpoint_globals(extra=[Popen]):
            pass


def test_refusal_hints_never_suggest_a_never_trusted_object():
    assert 'can never be trusted' in opt_in_hint(
        'mmengine.logging.logger.os.system')
    hint = opt_in_hint(f'{__name__}.os.system')
    assert 'can never be trusted' in hint and '`posix`' in hint
    assert 'can never be trusted' in opt_in_hint(f'{__name__}.Popen')
    alias = opt_in_hint(f'{__name__}.NoteAlias')
    assert f'another name of `{NOTE}`' in alias
    assert 'mmsafe_trusted_globals = [' not in alias
    assert f"mmsafe_trusted_globals = ['{NOTE}']" in opt_in_hint(NOTE)
    # a module that is not imported is not imported to look at it
    assert 'mmsafe_fuzzy_absent_pkg' not in sys.modules
    hint = opt_in_hint('mmsafe_fuzzy_absent_pkg.Thing')
    assert 'did not import anything' in hint
    assert 'mmsafe_fuzzy_absent_pkg' not in sys.modules
    assert 'mmsafe_trusted_globals = [' not in hint


def test_an_alias_in_a_checkpoint_is_refused_and_not_suggested(tmp_path):
    marker = tmp_path / 'marker'
    path = p.write_zip(str(tmp_path / 'alias.pth'), p.in_dict(
        ('evil', p.call(f'{__name__}.os', 'system',
                        p.op_str(f'touch {marker}')))))
    with pytest.raises(UntrustedCheckpointError) as info:
        load_checkpoint_file(path)
    assert 'can never be trusted' in str(info.value)
    assert "mmsafe_trusted_globals = ['" not in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize('name', [
    'os.sys{tem', 'numpy.cor{.multiarray._reconstruct', 'os.{why}',
    f'{__name__}.os.sys}}tem', 'absent_pkg.{0}'])
def test_names_with_format_braces_are_refused_as_text(tmp_path, name):
    """A name in the file is text: braces in it reach the message as they
    are, never as a format string (a fuzzed file found this)."""
    module, attr = name.rsplit('.', 1)
    path = p.write_zip(str(tmp_path / 'braces.pth'), p.in_dict(
        ('x', p.call(module, attr))))
    with pytest.raises(UntrustedCheckpointError) as info:
        load_checkpoint_file(path)
    assert f'`{name}`' in str(info.value)


def test_explain_refusals_names_torchs_own_refusals():
    error = pickle.UnpicklingError(
        'Weights only load failed. Unsupported global: GLOBAL '
        'argparse.Namespace was not an allowed global by default.')
    with pytest.raises(UntrustedCheckpointError) as info:
        with explain_refusals('x.pth'):
            raise error
    assert info.value.global_name == 'argparse.Namespace'
    assert "mmsafe_trusted_globals = ['argparse.Namespace']" in \
        str(info.value)
    with pytest.raises(KeyError):
        with explain_refusals('x.pth'):
            raise KeyError('other errors pass')
