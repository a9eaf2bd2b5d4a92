"""Converting an old checkpoint once, outside training
(tools/convert_checkpoint.py): the legacy (non-zip) format becomes the zip
archive training loads, read with the same checks; what cannot be
converted without trusting it (tar, TorchScript) is refused with what to
do instead."""
import argparse
import os.path as osp

import pytest
import torch

import mmsafe  # noqa: F401
from mmsafe.checkpoint import (CheckpointFormatError,
                               UntrustedCheckpointError,
                               load_checkpoint_file)
from mmsafe.checkpoint.convert import (convert_checkpoint,
                                      load_legacy_checkpoint)
from tests.checkpoint.fuzz import runner_like_checkpoint, same_data


def _legacy(obj, path):
    torch.save(obj, path, _use_new_zipfile_serialization=False)
    return path


def test_a_legacy_checkpoint_converts_to_what_training_loads(tmp_path):
    saved = runner_like_checkpoint()
    old = _legacy(saved, str(tmp_path / 'old.pth'))
    with pytest.raises(CheckpointFormatError,
                       match='tools/convert_checkpoint.py OLD.pth NEW.pth'):
        load_checkpoint_file(old)
    assert same_data(load_legacy_checkpoint(old), saved)
    new = str(tmp_path / 'new.pth')
    written, what = convert_checkpoint(old, new)
    assert written and 'converted' in what, what
    assert same_data(load_checkpoint_file(new), saved)
    # it never overwrites, and a file that loads is left alone
    with pytest.raises(FileExistsError):
        convert_checkpoint(old, new)
    assert convert_checkpoint(new, str(tmp_path / 'x.pth'))[0] is False
    assert not osp.exists(tmp_path / 'x.pth')


def test_legacy_files_get_the_same_checks(tmp_path):
    evil = _legacy(dict(state_dict={}, evil=argparse.Namespace(a=1)),
                   str(tmp_path / 'evil.pth'))
    with pytest.raises(UntrustedCheckpointError, match='argparse.Namespace'):
        convert_checkpoint(evil, str(tmp_path / 'out.pth'))
    assert not osp.exists(tmp_path / 'out.pth')
    data = open(_legacy(dict(w=torch.ones(3)), str(tmp_path / 'a.pth')),
                'rb').read()
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(data[:-4])
    with pytest.raises(CheckpointFormatError, match='cut short'):
        load_legacy_checkpoint(str(cut))
    longer = tmp_path / 'longer.pth'
    longer.write_bytes(data + b'\0')
    with pytest.raises(CheckpointFormatError, match='follow its last'):
        load_legacy_checkpoint(str(longer))
    # the pickle claims 2**40 floats: refused before anything is allocated
    from tests.checkpoint.payloads import _legacy_huge
    huge = str(tmp_path / 'huge.pth')
    _legacy_huge(huge, '', '')
    with pytest.raises(CheckpointFormatError, match='more than the file'):
        load_legacy_checkpoint(huge)


class Plain(torch.nn.Module):

    def forward(self, x):
        return x * 2


def test_what_needs_trust_is_not_converted(tmp_path):
    scripted = str(tmp_path / 'scripted.pt')
    torch.jit.save(torch.jit.script(Plain()), scripted)
    with pytest.raises(CheckpointFormatError,
                       match='isolated, throwaway environment'):
        convert_checkpoint(scripted, str(tmp_path / 'out.pth'))
    raw = tmp_path / 'raw.pkl'
    raw.write_bytes(b'\x80\x04K\x01.')
    with pytest.raises(CheckpointFormatError, match='raw pickle.*isolated'):
        convert_checkpoint(str(raw), str(tmp_path / 'out.pth'))
    assert not osp.exists(tmp_path / 'out.pth')


def test_the_command_line(tmp_path, capsys):
    from mmsafe.tools import convert_checkpoint as tool
    old = _legacy(dict(w=torch.ones(2)), str(tmp_path / 'old.pth'))
    new = str(tmp_path / 'new.pth')
    assert tool.main([old, new]) == 0
    assert 'converted' in capsys.readouterr().out
    assert tool.main(['--check', new]) == 0
    assert '1 tensors' in capsys.readouterr().out
    assert tool.main(['--check', new, old]) == 1
    assert 'legacy (non-zip)' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tool.parse_args([old])
