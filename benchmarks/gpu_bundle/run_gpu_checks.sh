#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .gpu/ from
# make_bundle.sh beside it: installs the bundle into /tmp/site, checks the
# stand-in ops on CUDA, runs the CUDA tests, then gpu_recipe_check.py,
# guard_overhead.py --device cuda --amp and recipe_profile.py (ONLY_TESTS=1:
# stop after the tests; SKIP_RECIPE=1, SKIP_OVERHEAD=1, SKIP_PROFILE=1 leave
# one out; PROFILE_ARMS: the profile's arms). Outputs also go to $OUT if set.
set -u
OUT=${OUT:-work_dirs/gpu_checks}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .gpu/whl/*.whl || exit 3
cp -r .gpu/site/mmcv /tmp/site/ || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__)"
echo "== stand-in ops check"
timeout 60 python3 .gpu/check_standin_ops.py 2>&1 | tee "$OUT/check_ext.txt"
echo "== CUDA tests (AMP NaN skip; AmpNaNSkipOptimWrapper vs MMEngine's AmpOptimWrapper)"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs -k cuda \
  tests/engine/test_amp_matrix.py tests/engine/test_nan_skip_optim_wrapper.py 2>&1 \
  | tee "$OUT/cuda_tests.txt" | tail -15
[ -n "${ONLY_TESTS:-}" ] && exit 0
if [ -z "${SKIP_RECIPE:-}" ]; then
  echo "== gpu_recipe_check"
  timeout "${RECIPE_T:-330}" python3 benchmarks/gpu_recipe_check.py --timeout "${TRAIN_T:-270}" 2>&1 \
    | tee "$OUT/recipe.txt" | grep -v "mmengine - INFO - Iter\|Epoch(train)"
  cp work_dirs/gpu_recipe_check/train_output.txt "$OUT/" 2>/dev/null
fi
if [ -z "${SKIP_OVERHEAD:-}" ]; then
  echo "== guard_overhead cuda amp"
  timeout "${OVH_T:-280}" python3 benchmarks/guard_overhead.py --device cuda --amp \
    --iters "${OVH_ITERS:-400}" --block 10 --timeout 270 2>&1 | tee "$OUT/overhead.txt" | tail -25
fi
if [ -z "${SKIP_PROFILE:-}" ]; then
  echo "== recipe_profile (arms side by side)"
  # shellcheck disable=SC2086
  timeout "${PROFILE_T:-420}" python3 benchmarks/recipe_profile.py --timeout 200 \
    ${PROFILE_ARMS:+--arms $PROFILE_ARMS} 2>&1 | tee "$OUT/profile.txt"
  for f in work_dirs/recipe_profile/*/round*/stage_profile.json; do
    [ -f "$f" ] && cp "$f" "$OUT/profile_$(basename "$(dirname "$(dirname "$f")")").json"
  done
fi
