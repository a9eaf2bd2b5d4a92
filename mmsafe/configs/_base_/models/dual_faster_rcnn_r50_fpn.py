# Dual-stream Faster R-CNN, ResNet-50 + FPN per modality, with MACL between
# the two FPN streams, pure-Python style. Text twin (with the comments on
# each choice, ImageNet init without network included):
# configs/_base_/models/dual_faster_rcnn_r50_fpn.py.
from mmcv.ops import RoIAlign
from mmdet.models import (FPN, CrossEntropyLoss, L1Loss, ResNet, RPNHead,
                          Shared2FCBBoxHead, SingleRoIExtractor,
                          StandardRoIHead)
from mmdet.models.task_modules import (AnchorGenerator, DeltaXYWHBBoxCoder,
                                       MaxIoUAssigner, RandomSampler)

from mmsafe.models import (ConcatConvFusion, DualStreamFasterRCNN, MACLHead,
                           PairedDetDataPreprocessor)

pretrained = 'https://download.pytorch.org/models/resnet50-0676ba61.pth'
resnet50 = dict(
    type=ResNet,
    depth=50,
    num_stages=4,
    out_indices=(0, 1, 2, 3),
    frozen_stages=1,
    norm_cfg=dict(type='BN', requires_grad=True),
    norm_eval=True,
    style='pytorch',
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
imagenet = dict(
    mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True)

model = dict(
    type=DualStreamFasterRCNN,
    data_preprocessor=dict(
        type=PairedDetDataPreprocessor,
        visible=dict(imagenet),
        infrared=dict(imagenet),
        pad_size_divisor=32),
    backbone=resnet50,
    ir_backbone=resnet50,
    neck=dict(
        type=FPN,
        in_channels=[256, 512, 1024, 2048],
        out_channels=256,
        num_outs=5),
    ir_neck=None,
    fusion=dict(type=ConcatConvFusion),
    macl_head=dict(
        type=MACLHead,
        in_dim=256,
        proj_dim=128,
        feature_level=3,
        init_temperature=0.1,
        min_temperature=0.01,
        max_temperature=1.0,
        gather_negatives=True,
        loss_weight=0.1),
    rpn_head=dict(
        type=RPNHead,
        in_channels=256,
        feat_channels=256,
        anchor_generator=dict(
            type=AnchorGenerator,
            scales=[8],
            ratios=[0.5, 1.0, 2.0],
            strides=[4, 8, 16, 32, 64]),
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
            roi_layer=dict(type=RoIAlign, output_size=7, sampling_ratio=0),
            out_channels=256,
            featmap_strides=[4, 8, 16, 32]),
        bbox_head=dict(
            type=Shared2FCBBoxHead,
            in_channels=256,
            fc_out_channels=1024,
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
                pos_iou_thr=0.7,
                neg_iou_thr=0.3,
                min_pos_iou=0.3,
                match_low_quality=True,
                ignore_iof_thr=-1),
            sampler=dict(
                type=RandomSampler,
                num=256,
                pos_fraction=0.5,
                neg_pos_ub=-1,
                add_gt_as_proposals=False),
            allowed_border=-1,
            pos_weight=-1,
            debug=False),
        rpn_proposal=dict(
            nms_pre=2000,
            max_per_img=1000,
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
                num=512,
                pos_fraction=0.25,
                neg_pos_ub=-1,
                add_gt_as_proposals=True),
            pos_weight=-1,
            debug=False)),
    test_cfg=dict(
        rpn=dict(
            nms_pre=1000,
            max_per_img=1000,
            nms=dict(type='nms', iou_threshold=0.7),
            min_bbox_size=0),
        rcnn=dict(
            score_thr=0.05,
            nms=dict(type='nms', iou_threshold=0.5),
            max_per_img=100)))
