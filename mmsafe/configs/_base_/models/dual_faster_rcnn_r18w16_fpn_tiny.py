# The tiny dual-stream Faster R-CNN of the CPU demo, pure-Python style: the
# R50 recipe with what differs. Text twin (its comments explain the
# choices): configs/_base_/models/dual_faster_rcnn_r18w16_fpn_tiny.py.
from mmengine.config import read_base

from mmsafe.models import MACLHead

with read_base():
    from .dual_faster_rcnn_r50_fpn import *  # noqa

resnet18w16 = dict(
    depth=18,
    base_channels=16,
    num_stages=3,
    strides=(1, 2, 2),
    dilations=(1, 1, 1),
    out_indices=(0, 1, 2),
    frozen_stages=-1,
    norm_eval=False,
    init_cfg=None)
fpn32 = dict(type=FPN, in_channels=[16, 32, 64], out_channels=32, num_outs=3)

# ConfigDict.update merges nested dicts key by key, as _base_ does
model.update(
    data_preprocessor=dict(
        infrared=dict(mean=[128.0], std=[64.0], bgr_to_rgb=False)),
    backbone=resnet18w16,
    ir_backbone=resnet18w16,
    neck=fpn32,
    rpn_head=dict(
        in_channels=32,
        feat_channels=32,
        anchor_generator=dict(
            scales=[4], ratios=[1.0, 2.0, 3.0], strides=[4, 8, 16])),
    roi_head=dict(
        bbox_roi_extractor=dict(
            roi_layer=dict(sampling_ratio=2),
            out_channels=32,
            featmap_strides=[4, 8, 16]),
        bbox_head=dict(in_channels=32, fc_out_channels=128)),
    train_cfg=dict(
        rpn=dict(assigner=dict(pos_iou_thr=0.6), sampler=dict(num=128)),
        rpn_proposal=dict(nms_pre=600, max_per_img=200),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=100),
        rcnn=dict(max_per_img=50)))
# replaced whole (the text twin's _delete_): item assignment, not update
model['ir_neck'] = dict(fpn32)
model['macl_head'] = dict(
    type=MACLHead,
    in_dim=32,
    proj_dim=32,
    hidden_dim=64,
    feature_level=-1,
    init_temperature=0.1,
    gather_negatives=False,
    loss_weight=0.1)
