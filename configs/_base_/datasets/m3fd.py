# M3FD (multi-scenario multi-modality detection, 4,200 pairs of 1024x768) in
# its released layout:
#   data/M3FD_Detection/Vis/{stem}.png         visible
#   data/M3FD_Detection/Ir/{stem}.png          infrared
#   data/M3FD_Detection/Annotation/{stem}.xml  VOC xml
# Classes People, Car, Bus, Motorcycle, Lamp, Truck. M3FD publishes no
# split: list the stems of yours in ImageSets/train.txt and ImageSets/val.txt
# (README: an 80/20 split in one command).
dataset_type = 'M3FDDataset'
data_root = 'data/M3FD_Detection/'
backend_args = None
img_scale = (1024, 768)  # M3FD's own resolution

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
        ann_file='ImageSets/train.txt',
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
        ann_file='ImageSets/val.txt',
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
