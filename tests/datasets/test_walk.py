"""mmsafe.datasets.walk: the one walk through dataset wrappers, as configs
and as built datasets (MMEngine's wrappers and mmsafe's)."""
from mmengine.dataset import (ClassBalancedDataset, ConcatDataset,
                              RepeatDataset)

from mmsafe.datasets import ValidInstanceResampleDataset
from mmsafe.datasets.walk import (config_leaves, config_nodes,
                                  innermost_dataset, is_paired_dataset,
                                  leaf_datasets, resolve_index)
from tests.engine.probe_toys import ProbeToyDataset

class _Toy(ProbeToyDataset):

    def get_cat_ids(self, idx):  # for ClassBalancedDataset
        return [0]


NESTED_CFG = dict(
    type='RepeatDataset', times=2,
    dataset=dict(type='ConcatDataset', datasets=[
        dict(type='A', pipeline=[]), dict(type='B'), 'not a config']))


def test_config_nodes_and_leaves_carry_their_config_path():
    nodes = list(config_nodes(NESTED_CFG, 'train_dataloader.dataset'))
    assert [p for p, _ in nodes] == [
        'train_dataloader.dataset', 'train_dataloader.dataset.dataset',
        'train_dataloader.dataset.dataset.datasets[0]',
        'train_dataloader.dataset.dataset.datasets[1]']
    leaves = config_leaves(NESTED_CFG, 'd')
    assert [(p, n['type']) for p, n in leaves] == [
        ('d.dataset.datasets[0]', 'A'), ('d.dataset.datasets[1]', 'B')]
    # the leaves are the config's own dicts: callers edit them in place
    assert leaves[0][1] is NESTED_CFG['dataset']['datasets'][0]
    # a plain dataset is its own leaf; a non-dict has none
    assert config_leaves(dict(type='A'), 'x') == [('x', dict(type='A'))]
    assert config_leaves('A', 'x') == []


def test_built_wrappers_resolve_to_the_sample_owner():
    a = _Toy(length=3)
    b = _Toy(length=5, paired=True)
    # MMEngine's wrappers hold BaseDatasets only; mmsafe's holds any
    wrapped = ValidInstanceResampleDataset(ConcatDataset([a, b]), seed=0)
    assert leaf_datasets(wrapped) == [a, b]
    assert innermost_dataset(wrapped) is a
    assert innermost_dataset(a) is a
    assert resolve_index(wrapped, 4) == (b, 1)  # a has 3 samples
    assert resolve_index(RepeatDataset(b, times=2), 7) == (b, 2)
    balanced = ClassBalancedDataset(a, oversample_thr=0.0)
    assert leaf_datasets(balanced) == [a]
    assert resolve_index(balanced, 2) == (a, 2)
    assert not is_paired_dataset(RepeatDataset(a, times=2))
    assert is_paired_dataset(ValidInstanceResampleDataset(b, seed=0))
