# KAIST with the papers' annotations, pure-Python style: the sanitized
# training annotations and the improved test annotations, each in its own
# folder under data_root. Text twin (where they come from):
# configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist_sanitized.py.
from mmengine.config import read_base

with read_base():
    from .dual_faster_rcnn_r50_fpn_macl_kaist import *  # noqa

train_dataloader.dataset.data_prefix.update(ann='sanitized_annotations/')
val_dataloader.dataset.data_prefix.update(ann='annotations_KAIST_test_set/')
test_dataloader = val_dataloader
