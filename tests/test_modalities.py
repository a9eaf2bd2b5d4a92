"""The description of a run's modalities (mmsafe/modalities.py) and the
run's reading of it (mmsafe/engine/modalities.py), in process: the common
layouts recognised, image locations resolved, declarations checked and
merged, files and loss terms found by name."""
import pytest
import torch
from mmdet.structures import DetDataSample

from mmsafe.engine.modalities import RunModalities
from mmsafe.errors import MMSafeValueError
from mmsafe.modalities import (ImagePath, check_declaration, find_loss_key,
                               flatten, recognise_images, sample_files,
                               use_declared_files)
from tests.utils import logged_messages


def _samples(n=2, **fields):
    out = []
    for i in range(n):
        sample = DetDataSample(metainfo=dict(img_path=f'v/{i}.jpg',
                                             ir_path=f'ir/{i}.jpg'))
        for name, value in fields.items():
            setattr(sample, name, value)
        out.append(sample)
    return out


def _split(data):
    """The recognised images, as ``{name: [shape, ...]}``."""
    paths, how = recognise_images(data)
    assert paths is not None, how
    return {name: None if path is None else
            [tuple(img.shape) for img in ImagePath(path).resolve(data)]
            for name, path in paths.items()}, how


@pytest.mark.parametrize('inputs,expected', [
    # a dict of batched tensors, and of per-sample lists
    (dict(visible=torch.zeros(2, 3, 8, 8), infrared=torch.zeros(2, 3, 8, 8)),
     ('inputs.visible', 'inputs.infrared')),
    (dict(rgb=[torch.zeros(3, 8, 8)] * 2, thermal=[torch.zeros(1, 8, 8)] * 2),
     ('inputs.rgb', 'inputs.thermal')),
    # a list (or tuple) of two
    ([torch.zeros(2, 3, 8, 8), torch.zeros(2, 1, 8, 8)],
     ('inputs[0]', 'inputs[1]')),
    (([torch.zeros(3, 8, 8)] * 2, [torch.zeros(3, 8, 8)] * 2),
     ('inputs[0]', 'inputs[1]')),
    # one 6- or 4-channel tensor (batched, or one per sample)
    (torch.zeros(2, 6, 8, 8), ('inputs[0:3]', 'inputs[3:6]')),
    ([torch.zeros(4, 8, 8)] * 2, ('inputs[0:3]', 'inputs[3:4]')),
])
def test_common_layouts_are_recognised(inputs, expected):
    data = dict(inputs=inputs, data_samples=_samples())
    paths, how = recognise_images(data)
    assert (paths['visible'], paths['infrared']) == expected, how
    images, _ = _split(data)
    assert len(images['visible']) == len(images['infrared']) == 2
    assert images['visible'][0][-2:] == images['infrared'][0][-2:] == (8, 8)


def test_infrared_in_a_data_sample_field_or_nowhere():
    # a list of two images is a batch of two single images, not a pair
    data = dict(inputs=[torch.zeros(3, 8, 8)] * 2,
                data_samples=_samples(infrared_img=torch.zeros(3, 8, 8)))
    images, how = _split(data)
    assert images == dict(visible=[(3, 8, 8)] * 2, infrared=[(3, 8, 8)] * 2)
    assert "'infrared_img'" in how
    # an H x W x C array in the field is read as C x H x W
    data['data_samples'] = _samples(img_lwir=torch.zeros(3, 8, 8).numpy()
                                    .transpose(1, 2, 0))
    assert _split(data)[0]['infrared'] == [(3, 8, 8)] * 2
    data['data_samples'] = _samples()
    paths, how = recognise_images(data)
    assert paths == dict(visible='inputs', infrared=None)
    assert how == '3-channel inputs and no infrared image'
    assert recognise_images(dict(inputs=dict(a=1, b=2)))[0] is None


def test_image_paths_and_their_errors():
    data = dict(inputs=dict(pair=[torch.zeros(2, 3, 4, 4),
                                  torch.ones(2, 6, 4, 4)]))
    ir = ImagePath('inputs.pair[1][3:6]').resolve(data)
    assert [tuple(i.shape) for i in ir] == [(3, 4, 4)] * 2
    assert float(ir[0].sum()) == 48
    assert ImagePath('inputs.other').resolve(data) is None
    assert ImagePath('inputs.pair[0][3:6]').resolve(data) is None  # 3 ch
    for bad in ('img', 'inputs.', 'inputs[a]', 'data_samples.', 3):
        with pytest.raises(MMSafeValueError, match='image location'):
            ImagePath(bad)


def test_declaration_is_checked_and_the_config_wins():
    with pytest.raises(MMSafeValueError, match=r"unknown field\(s\) "
                       r"\['loss'\]"):
        check_declaration(dict(loss=['loss_contrast']))
    with pytest.raises(MMSafeValueError, match='model_inputs'):
        check_declaration(dict(model_inputs=dict(visible='rgb')))
    with pytest.raises(MMSafeValueError, match='losses'):
        check_declaration(dict(losses=dict(loss_contrast='0.5')))
    assert check_declaration(dict(losses='loss_align'))['losses'] == dict(
        loss_align=None)
    component = ('Head', check_declaration(dict(
        losses=['loss_macl'], files=dict(visible='img_path',
                                         infrared='ir_img_path'))))
    run = RunModalities(dict(files=dict(infrared='lwir_path')), [component])
    assert run.fields['files'] == dict(visible='img_path',
                                       infrared='lwir_path')
    assert run.sources['files'] == 'config mmsafe_modalities'
    assert run.losses == dict(loss_macl=None)
    assert run.sources['losses'] == 'Head.mmsafe_modalities'
    assert run.chance_term(['loss_align', 'loss_macl']) == 'loss_macl'
    assert RunModalities(dict(chance=False)).chance_term(['loss_macl']) \
        is None


def test_files_and_loss_terms_by_name():
    meta = dict(img_path='v/1.jpg', lwir_path='ir/1.jpg')
    assert sample_files(meta) == ('v/1.jpg', 'ir/1.jpg')
    use_declared_files(dict(infrared='thermal_file'))
    try:
        assert sample_files(dict(meta, thermal_file='t/1.png')) == (
            'v/1.jpg', 't/1.png')
    finally:
        use_declared_files(None)
    losses = flatten({'loss_cls': 1, 'roi': {'aux': {'loss_contrast': 2}},
                      's0.loss_align': 3})
    assert list(losses) == ['loss_cls', 'roi.aux.loss_contrast',
                            's0.loss_align']
    keys = list(losses)
    assert find_loss_key('loss_contrast', keys) == 'roi.aux.loss_contrast'
    assert find_loss_key('loss_align', keys) == 's0.loss_align'
    assert find_loss_key('*contrast*', keys) == 'roi.aux.loss_contrast'
    assert find_loss_key('contrast', keys) is None  # no partial words


def test_where_the_images_are_is_said_once_per_side():
    run = RunModalities()
    data = dict(inputs=[torch.zeros(3, 8, 8)] * 2, data_samples=_samples())
    with logged_messages() as messages:
        assert set(run.images('model_inputs', data)) == {'img'}
        run.images('model_inputs', data)
    said = [m for m in messages if 'modalities: model inputs' in m]
    assert said == ['[mmsafe] modalities: model inputs: visible=inputs '
                    '(recognised: 3-channel inputs and no infrared image), '
                    'infrared=not found'], messages
    assert run.paired('model_inputs') is False
    assert run.not_found('model_inputs') == \
        '3-channel inputs and no infrared image'
