# FLIR ADAS, aligned visible/thermal pairs (640x512), in the release layout
# (the folder the release unpacks as, align/):
#   data/FLIR_aligned/JPEGImages/FLIR_{n}_RGB.jpg           visible
#   data/FLIR_aligned/JPEGImages/FLIR_{n}_PreviewData.jpeg  thermal
#   data/FLIR_aligned/Annotations/FLIR_{n}_PreviewData.xml  VOC xml, 0-based
#   data/FLIR_aligned/align_train.txt, align_validation.txt (1,013 frames)
# Classes person, car, bicycle (other names in the xml are skipped). The
# xml count from 0: FLIRAlignedDataset loads the values as they are
# (BBOX_BASE = 0; docs/user_guides/datasets.md says what it was checked on).
dataset_type = 'FLIRAlignedDataset'
data_root = 'data/FLIR_aligned/'
backend_args = None
img_scale = (640, 512)

train_pipeline = [
    dict(type='LoadPairedImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='PackPairedDetInputs')
]
test_pipeline = [
    dict(type='LoadPairedImageFromFile', backend_args=backend_args),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackPairedDetInputs',
        meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                   'img_shape', 'scale_factor'))
]

train_dataloader = dict(
    batch_size=4,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='align_train.txt',
        filter_cfg=dict(filter_empty_gt=True, min_size=16),
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
        ann_file='align_validation.txt',
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

# pascal_voc/mAP (mAP50), coco/bbox_mAP (mAP50:95), coco/bbox_mAP_50
val_evaluator = [
    dict(type='VOCMetric', metric='mAP', eval_mode='area', iou_thrs=0.5,
         prefix='pascal_voc'),
    dict(type='CocoStyleMetric', prefix='coco'),
]
test_evaluator = val_evaluator
