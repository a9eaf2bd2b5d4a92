# M3FD (multi-scenario multi-modality detection, 4,200 pairs) in its
# released layout:
#   data/M3FD_Detection/Vis/{stem}.png         visible
#   data/M3FD_Detection/Ir/{stem}.png          infrared
#   data/M3FD_Detection/Annotation/{stem}.xml  VOC xml with <size>, 1-based
# 3,926 pairs are 1024x768 and 274 smaller (880x520 ... 400x280); each
# sample's size comes from its xml. Classes: mmsafe.datasets.m3fd's
# M3FD_CLASSES (People, Car, Bus, Lamp, Motorcycle, Truck: TarDAL's order),
# set by M3FDDataset itself. M3FD publishes no split: write
# ImageSets/{train,val,test}.txt with
#   python tools/make_m3fd_split.py data/M3FD_Detection
# (8:1:1, the same lists on every machine; docs/user_guides/datasets.md).
dataset_type = 'M3FDDataset'
data_root = 'data/M3FD_Detection/'
backend_args = None
img_scale = (1024, 768)  # M3FD's main resolution; smaller frames scale up

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
