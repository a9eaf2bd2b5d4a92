# KAIST multispectral pedestrians (visible + LWIR, 640x512) in its released
# layout, with any of its annotation releases, found by itself
# (KAISTDataset's ann_layout='auto'; changing data_root is enough):
#   data/kaist/images/set{00-11}/V{000}/{visible,lwir}/I{00000}.jpg
#   data/kaist/imageSets/train-all-02.txt, test-all-20.txt
#       (one frame per line: 'set00/V000/I01225'; CRLF endings are fine)
#   and one of, under annotations/, annotations-xml-new/ or
#   annotations_paired/:
#     set00/V000/I01225.txt           the original bbGt text
#       % bbGt version=3
#       person 215 226 26 57 0 0 0 0 0 0 0     (label x y w h occ ... ign ang)
#     set00/V000/I01225.xml           kaist-cvpr15's annotations-xml-new
#     set00/V000/{visible,lwir}/I01225.txt   AR-CNN's KAIST-Paired
# Sanitized training / improved test annotations come flat
# (set00_V000_I01225.txt) in a folder of their own: set
#   data_prefix=dict(img='images/', ann='<their folder>/')
# (configs/kaist/*_sanitized.py does). Only 'person' is a class; people,
# cyclist, person? and boxes outside the setting below are ignore regions.
# Evaluation: KAISTMissRate, the KAIST devkit's MR^-2 (reasonable setting
# over all / day / night frames, and the 'all' setting).
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
        # 'instances': the frame's raw annotation, read by KAISTMissRate
        meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                   'img_shape', 'scale_factor', 'instances'))
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
        data_prefix=dict(img='images/'),  # annotations: found by itself
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
        data_prefix=dict(img='images/'),
        # the "reasonable" setting for the COCO-style mAP (KAISTMissRate
        # applies the benchmark's settings to the raw annotation itself)
        min_height=55,
        max_occlusion=1,
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

# kaist/MR-2: log-average miss rate over FPPI 1e-2..1e0 (lower is better),
# the reasonable setting on every frame; kaist/MR-2_day, kaist/MR-2_night,
# kaist/MR-2_all (height >= 20, any occlusion), ... as the KAIST devkit
# computes them. det_file='<path>.txt' also writes the predictions in the
# devkit's format. coco/bbox_mAP (mAP50:95) and coco/bbox_mAP_50 beside it.
val_evaluator = [
    dict(type='KAISTMissRate', settings=('reasonable', 'all'),
         prefix='kaist'),
    dict(type='CocoStyleMetric', prefix='coco'),
]
test_evaluator = val_evaluator
