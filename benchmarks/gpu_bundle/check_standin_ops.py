"""Checks the torchvision stand-in for mmcv._ext on CUDA before the run."""
import torch
from mmcv.ops import nms, roi_align

torch.manual_seed(0)
dev = 'cuda'
x = torch.randn(2, 3, 12, 14, dtype=torch.double, device=dev,
                requires_grad=True)
rois = torch.tensor([[0, 1.0, 1.5, 9.0, 8.0], [1, 0.0, 0.0, 13.0, 11.0],
                     [0, 3.2, 2.1, 6.7, 10.4]], dtype=torch.double, device=dev)
ok = torch.autograd.gradcheck(
    lambda t: roi_align(t, rois, (3, 4), 1.0, 2, 'avg', True), (x,),
    eps=1e-6, atol=1e-5)
print('roi_align gradcheck (double, CUDA):', ok)
half = roi_align(x.detach().half(), rois.half(), (7, 7), 0.5, 0, 'avg', True)
ref = roi_align(x.detach().float(), rois.float(), (7, 7), 0.5, 0, 'avg', True)
print('roi_align fp16 vs fp32 max diff:', (half.float() - ref).abs().max().item())

boxes = torch.rand(300, 4, device=dev) * 100
boxes[:, 2:] += boxes[:, :2] + 1
scores = torch.rand(300, device=dev)
dets, keep = nms(boxes, scores, 0.5)


def iou(a, b):
    lt = torch.max(a[:2], b[:2]); rb = torch.min(a[2:], b[2:])
    inter = (rb - lt).clamp(min=0).prod()
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])
    return inter / (area(a) + area(b) - inter)


order = scores.argsort(descending=True).tolist()
kept = []
for i in order:
    if all(iou(boxes[i], boxes[j]) <= 0.5 for j in kept):
        kept.append(i)
print('nms equals a plain Python NMS:', kept == keep.tolist(),
      f'({len(kept)} kept of 300)')
assert ok and kept == keep.tolist()
