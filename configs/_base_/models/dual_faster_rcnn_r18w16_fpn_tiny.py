# A tiny dual-stream Faster R-CNN for CPU demos and tests: the R50 recipe of
# dual_faster_rcnn_r50_fpn.py with ResNet-18 at a quarter of the width
# (base_channels=16; 3 stages: 16/32/64 channels) per modality, a 32-channel
# FPN per modality on strides 4/8/16, small anchors for the small people of
# 160x128 images, MACL on the last FPN level. Trained from scratch (no
# download). Only what differs from the R50 recipe is stated here.
_base_ = './dual_faster_rcnn_r50_fpn.py'

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
fpn32 = dict(type='FPN', in_channels=[16, 32, 64], out_channels=32, num_outs=3)

model = dict(
    data_preprocessor=dict(
        # Infrared is grey in three channels: one mean/std for all.
        infrared=dict(mean=[128.0], std=[64.0], bgr_to_rgb=False)),
    backbone=resnet18w16,
    # Own infrared backbone and FPN (same architecture, own weights).
    ir_backbone=resnet18w16,
    neck=fpn32,
    ir_neck=dict(_delete_=True, **fpn32),  # the base shares the FPN
    macl_head=dict(
        _delete_=True,
        type='MACLHead',
        in_dim=32,
        proj_dim=32,
        hidden_dim=64,
        feature_level=-1,
        init_temperature=0.1,
        gather_negatives=False,
        loss_weight=0.1),
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
