# LLVIP (visible + infrared pedestrian pairs) in its released layout:
#   data/LLVIP/Annotations/*.xml
#   data/LLVIP/visible/{train,test}/*.jpg
#   data/LLVIP/infrared/{train,test}/*.jpg   (same file stem as visible)
# 12,025 train and 3,463 test pairs of 1280x1024. Every geometric transform
# is paired (one draw, one geometry for both modalities); the infrared
# partner of each image is found by stem and its absence is an error.
dataset_type = 'LLVIPDataset'
data_root = 'data/LLVIP/'
backend_args = None
img_scale = (640, 512)  # half of LLVIP's 1280x1024
# JPEGs are decoded at 1/2 straight to 640x512 (libjpeg's DCT scaling);
# ori_shape, scale_factor and the boxes stay those of the 1280x1024 files.
# Per loader worker (synthetic JPEGs, each setting in its own process;
# benchmarks/README.md, 4b): ~1.65x the pairs/s of a full decode + resize,
# ~2.5x together with the KeepFreedMemory step at the end of the pipelines.
# Must match the PairedResize below; set it to None when resizing to full
# resolution.
reduced_decode = dict(scale=img_scale, keep_ratio=True)

train_pipeline = [
    dict(type='LoadPairedImageFromFile', backend_args=backend_args,
         reduced_decode=reduced_decode),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='PackPairedDetInputs'),
    # Each loading process (DataLoader worker, or the main process with
    # num_workers=0) keeps the memory it frees for the next pair instead of
    # faulting fresh pages in for every image (glibc only; no effect on the
    # samples). Last, so that pipeline[0] stays the loader.
    dict(type='KeepFreedMemory')
]
test_pipeline = [
    dict(type='LoadPairedImageFromFile', backend_args=backend_args,
         reduced_decode=reduced_decode),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    # after the resize: the metric compares with boxes of the original size
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackPairedDetInputs',
        meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                   'img_shape', 'scale_factor')),
    dict(type='KeepFreedMemory')
]

train_dataloader = dict(
    batch_size=4,
    # Worker processes load two images per sample. On Windows (spawn) a
    # DataLoader with workers once froze such a run; mmsafe's safety
    # runtime probes the loader and falls back to num_workers=0 if needed.
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(
            img='visible/train/', ir_img='infrared/train/',
            ann='Annotations/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=16),
        return_modality_pair=True,
        pipeline=train_pipeline,
        backend_args=backend_args))
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(
            img='visible/test/', ir_img='infrared/test/',
            ann='Annotations/'),
        test_mode=True,
        return_modality_pair=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

# The metrics RGB-T papers report, side by side:
#   pascal_voc/mAP      VOC mAP at IoU 0.5 (area under the PR curve)
#   coco/bbox_mAP       COCO-style mAP over IoU 0.50:0.95 (mAP50:95)
#   coco/bbox_mAP_50    COCO-style mAP at IoU 0.5 (101-point), also _75, _s/m/l
# (val/pascal_voc/mAP, val/coco/bbox_mAP, ... in TensorBoard). CocoStyleMetric
# takes the ground truth from the samples: no COCO json needed.
val_evaluator = [
    dict(type='VOCMetric', metric='mAP', eval_mode='area', iou_thrs=0.5,
         prefix='pascal_voc'),
    dict(type='CocoStyleMetric', prefix='coco'),
]
test_evaluator = val_evaluator
