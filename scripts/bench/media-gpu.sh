#!/usr/bin/env bash
# The multimodal towers on a GPU, for a GPU host with torch and transformers but no Rust (the
# device machines), from the repository root with target/gpu-bundle/ (`cargo xtask gpu`):
# the conformer ops' conformance cases, the tiny vision and audio towers against transformers
# (f32 and bf16), then E2B's (MODEL=e4b: E4B's) towers at their real shapes (random weights; references made here
# by scripts/reference/vision_real_shape.py and scripts/bench/audio_encode.py) with the time
# an image and a clip take. Results land in OUT_DIR, one file a step; the summary is printed.
#
#   [MODEL=e4b] scripts/bench/media-gpu.sh OUT_DIR
#
# E2B and E4B take the same towers (transformers' default `gemma4_vision` and `gemma4_audio`);
# only the embedders' output width differs: the text model's 1536 or 2560.
set -u
out=${1:?usage: media-gpu.sh OUT_DIR}
bundle=${BUNDLE:-target/gpu-bundle}
work=${WORK:-/tmp/strata-media}
model=${MODEL:-e2b}
case $model in e2b) hidden=1536 ;; e4b) hidden=2560 ;; *) echo "MODEL: e2b or e4b" >&2; exit 2 ;; esac
mkdir -p "$out" "$work"
export STRATA_KERNEL_CACHE=${STRATA_KERNEL_CACHE:-$work/kernels} STRATA_REQUIRE_GPU=1
export STRATA_TINY_FIXTURES=${STRATA_TINY_FIXTURES:-$PWD/tests/fixtures/tiny}
SECONDS=0
step() { echo "$1: exit $2 at $SECONDS s" | tee -a "$out/steps.txt"; }
# The real-shape references on the host's CPU while the GPU checks run.
( timeout 300 python3 scripts/reference/vision_real_shape.py --out "$work/vision-$model" --text-hidden $hidden >"$out/vision-ref.txt" 2>&1
  timeout 300 python3 scripts/bench/audio_encode.py --out "$work/audio-$model" --seconds 5 --runs 1 --text-hidden $hidden >"$out/audio-ref.txt" 2>&1 ) &
refs=$!
timeout 300 "$bundle/conformance_cuda" clamp depthwise_conv chunked_attention act_mul activation attention \
    --nocapture >"$out/conformance.txt" 2>&1
step conformance $?
timeout 300 "$bundle/strata_model_tests" cuda_upload::tests::vision_tower_on_the_gpu \
    cuda_upload::tests::audio_tower_on_the_gpu --nocapture --test-threads=1 >"$out/towers.txt" 2>&1
step "tiny towers" $?
wait $refs
STRATA_VISION_REAL_SHAPE="$work/vision-$model" timeout 300 "$bundle/strata_model_tests" \
    cuda_upload::tests::vision_tower_at_the_real_shape_matches_transformers --exact --nocapture \
    >"$out/vision-real.txt" 2>&1
step "vision, real shape" $?
STRATA_AUDIO_REAL_SHAPE="$work/audio-$model" timeout 300 "$bundle/strata_model_tests" \
    cuda_upload::tests::audio_tower_at_the_real_shape_matches_transformers --exact --nocapture \
    >"$out/audio-real.txt" 2>&1
step "audio, real shape" $?
grep -hE "test result|panicked" "$out"/conformance.txt "$out"/towers.txt | sort | uniq -c
grep -hE "real shape|clip|image" "$out"/towers.txt "$out"/vision-real.txt "$out"/audio-real.txt
