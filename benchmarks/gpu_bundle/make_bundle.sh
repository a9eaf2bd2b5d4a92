#!/usr/bin/env bash
# Builds .gpu/ (git-ignored): what benchmarks/gpu_bundle/run_gpu_checks.sh
# needs on a GPU machine that has CUDA PyTorch + torchvision but no
# MMEngine/MMDetection and no CUDA build of mmcv, and cannot reach a
# package index: wheels of the pure-Python dependencies for that machine's
# Python, and mmcv's Python package (copied from this checkout's .venv) whose
# compiled _ext is replaced by a torchvision stand-in (RoIAlign and NMS, the
# ops Faster R-CNN calls; see mmcv_ext_standin.py).
#   bash benchmarks/gpu_bundle/make_bundle.sh [PYTHON_VERSION]   # e.g. 3.12
set -euo pipefail
cd "$(dirname "$0")/../.."
PYV=${1:-3.12}
SITE=$(.venv/bin/python -c 'import mmcv, os; print(os.path.dirname(os.path.dirname(mmcv.__file__)))')
rm -rf .gpu && mkdir -p .gpu/whl .gpu/site
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
cp -r "$SITE/mmcv" .gpu/site/
find .gpu/site/mmcv -name '__pycache__' -prune -exec rm -rf {} +
rm -f .gpu/site/mmcv/_ext*.so
cp benchmarks/gpu_bundle/mmcv_ext_standin.py .gpu/site/mmcv/_ext.py
cp benchmarks/gpu_bundle/check_standin_ops.py benchmarks/gpu_bundle/run_gpu_checks.sh .gpu/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
  --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl \
  mmengine==0.10.7 mmdet==3.3.0 addict==2.4.0 yapf==0.43.0 termcolor==3.3.0 \
  terminaltables==3.1.10 pycocotools==2.0.11 shapely==2.2.0 platformdirs
du -sh .gpu
