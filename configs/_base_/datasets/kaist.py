# KAIST multispectral pedestrians (visible + LWIR, 640x512) in its released
# layout, with Dollar's bbGt text annotations:
#   data/kaist/images/set{00-11}/V{000}/{visible,lwir}/I{00000}.jpg
#   data/kaist/annotations/set{00-11}/V{000}/I{00000}.txt
#       % bbGt version=3
#       person 215 226 26 57 0 0 0 0 0 0 0     (label x y w h occ ... ign ang)
#   data/kaist/imageSets/train-all-02.txt, test-all-20.txt
#       (one frame per line: 'set00/V000/I01225')
# Sanitized training / improved test annotations in the same text format,
# shipped flat (set00_V000_I01225.txt): set
#   ann_name='{set}_{video}_{frame}.txt',
#   data_prefix=dict(ann='<their folder>/')
# Only 'person' is a class; people, cyclist, person? and boxes outside the
# setting below are ignore regions. Evaluation: KAIST's "reasonable" setting
# (height >= 55 px, no or partial occlusion) and log-average miss rate.
dataset_type = 'KAISTDataset'
data_root = 'data/kaist/'
backend_args = None
img_scale = (640, 512)  # KAIST's own resolution

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
    # after the resize: the metrics compare with boxes of the original size
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
        ann_file='imageSets/train-all-02.txt',
        data_prefix=dict(img='images/', ann='annotations/'),
        # train on every unflagged person box; the rest are ignore regions
        min_height=0,
        max_occlusion=2,
        filter_cfg=dict(filter_empty_gt=True),
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
        ann_file='imageSets/test-all-20.txt',
        data_prefix=dict(img='images/', ann='annotations/'),
        # the "reasonable" setting
        min_height=55,
        max_occlusion=1,
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

# kaist/MR-2: log-average miss rate over FPPI 1e-2..1e0 (lower is better);
# coco/bbox_mAP (mAP50:95) and coco/bbox_mAP_50 beside it.
val_evaluator = [
    dict(type='LogAverageMissRate', prefix='kaist'),
    dict(type='CocoStyleMetric', prefix='coco'),
]
test_evaluator = val_evaluator
