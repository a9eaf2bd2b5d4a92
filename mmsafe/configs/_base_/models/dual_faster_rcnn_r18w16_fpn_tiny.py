# The tiny dual-stream Faster R-CNN of the CPU demo, pure-Python style.
# Text twin: configs/_base_/models/dual_faster_rcnn_r18w16_fpn_tiny.py (on
# top of dual_faster_rcnn_r50_fpn.py; their comments explain the choices).
from mmcv.ops import RoIAlign
from mmdet.models import (FPN, CrossEntropyLoss, L1Loss, ResNet, RPNHead,
                          Shared2FCBBoxHead, SingleRoIExtractor,
                          StandardRoIHead)
from mmdet.models.task_modules import (AnchorGenerator, DeltaXYWHBBoxCoder,
                                       MaxIoUAssigner, RandomSampler)

from mmsafe.models import (ConcatConvFusion, DualStreamFasterRCNN, MACLHead,
                           PairedDetDataPreprocessor)

resnet18w16 = dict(
    type=ResNet,
    depth=18,
    base_channels=16,
    num_stages=3,
    strides=(1, 2, 2),
    dilations=(1, 1, 1),
    out_indices=(0, 1, 2),
    frozen_stages=-1,
    norm_cfg=dict(type='BN', requires_grad=True),
    norm_eval=False,
    style='pytorch',
    init_cfg=None)
fpn32 = dict(type=FPN, in_channels=[16, 32, 64], out_channels=32, num_outs=3)

model = dict(
    type=DualStreamFasterRCNN,
    data_preprocessor=dict(
        type=PairedDetDataPreprocessor,
        visible=dict(
            mean=[123.675, 116.28, 103.53],
            std=[58.395, 57.12, 57.375],
            bgr_to_rgb=True),
        infrared=dict(mean=[128.0], std=[64.0], bgr_to_rgb=False),
        pad_size_divisor=32),
    backbone=resnet18w16,
    ir_backbone=resnet18w16,
    neck=fpn32,
    ir_neck=fpn32,
    fusion=dict(type=ConcatConvFusion),
    macl_head=dict(
        type=MACLHead,
        in_dim=32,
        proj_dim=32,
        hidden_dim=64,
        feature_level=-1,
        init_temperature=0.1,
        gather_negatives=False,
        loss_weight=0.1),
    rpn_head=dict(
        type=RPNHead,
        in_channels=32,
        feat_channels=32,
        anchor_generator=dict(
            type=AnchorGenerator,
            scales=[4],
            ratios=[1.0, 2.0, 3.0],
            strides=[4, 8, 16]),
        bbox_coder=dict(
            type=DeltaXYWHBBoxCoder,
            target_means=[.0, .0, .0, .0],
            target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(
            type=CrossEntropyLoss, use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type=L1Loss, loss_weight=1.0)),
    roi_head=dict(
        type=StandardRoIHead,
        bbox_roi_extractor=dict(
            type=SingleRoIExtractor,
            roi_layer=dict(type=RoIAlign, output_size=7, sampling_ratio=2),
            out_channels=32,
            featmap_strides=[4, 8, 16]),
        bbox_head=dict(
            type=Shared2FCBBoxHead,
            in_channels=32,
            fc_out_channels=128,
            roi_feat_size=7,
            num_classes=1,
            bbox_coder=dict(
                type=DeltaXYWHBBoxCoder,
                target_means=[0., 0., 0., 0.],
                target_stds=[0.1, 0.1, 0.2, 0.2]),
            reg_class_agnostic=False,
            loss_cls=dict(
                type=CrossEntropyLoss, use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type=L1Loss, loss_weight=1.0))),
    train_cfg=dict(
        rpn=dict(
            assigner=dict(
                type=MaxIoUAssigner,
                pos_iou_thr=0.6,
                neg_iou_thr=0.3,
                min_pos_iou=0.3,
                match_low_quality=True,
                ignore_iof_thr=-1),
            sampler=dict(
                type=RandomSampler,
                num=128,
                pos_fraction=0.5,
                neg_pos_ub=-1,
                add_gt_as_proposals=False),
            allowed_border=-1,
            pos_weight=-1,
            debug=False),
        rpn_proposal=dict(
            nms_pre=600,
            max_per_img=200,
            nms=dict(type='nms', iou_threshold=0.7),
            min_bbox_size=0),
        rcnn=dict(
            assigner=dict(
                type=MaxIoUAssigner,
                pos_iou_thr=0.5,
                neg_iou_thr=0.5,
                min_pos_iou=0.5,
                match_low_quality=False,
                ignore_iof_thr=-1),
            sampler=dict(
                type=RandomSampler,
                num=64,
                pos_fraction=0.25,
                neg_pos_ub=-1,
                add_gt_as_proposals=True),
            pos_weight=-1,
            debug=False)),
    test_cfg=dict(
        rpn=dict(
            nms_pre=300,
            max_per_img=100,
            nms=dict(type='nms', iou_threshold=0.7),
            min_bbox_size=0),
        rcnn=dict(
            score_thr=0.05,
            nms=dict(type='nms', iou_threshold=0.5),
            max_per_img=50)))
