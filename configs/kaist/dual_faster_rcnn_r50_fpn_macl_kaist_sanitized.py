# The papers' set-up: train on the sanitized training annotations (Li et
# al., BMVC 2018), evaluate on the improved test annotations (Liu et al.,
# BMVC 2016). Both ship flat (set00_V000_I01225.txt, bbGt text); put their
# folders under data_root as they unpack (or change the two 'ann' lines):
#   data/kaist/sanitized_annotations/set00_V000_I01225.txt ...
#   data/kaist/annotations_KAIST_test_set/set06_V000_I00019.txt ...
# Images and imageSets as in configs/_base_/datasets/kaist.py. Results are
# comparable with the papers' tables (kaist/MR-2 is the devkit's MR^-2).
#   python tools/train.py \
#       configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist_sanitized.py
_base_ = ['./dual_faster_rcnn_r50_fpn_macl_kaist.py']

train_dataloader = dict(
    dataset=dict(data_prefix=dict(ann='sanitized_annotations/')))
val_dataloader = dict(
    dataset=dict(data_prefix=dict(ann='annotations_KAIST_test_set/')))
test_dataloader = val_dataloader
