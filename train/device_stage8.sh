#!/usr/bin/env bash
# Stage 8 (FL2VA anchors, issue item 5): fine-tune h3-tiny's video DECODER on ONE H200, then measure the anchors.
#   1. train/train_video_decoder.py: the shipped video VAE's decoder + post_quant_conv train on world clips encoded by
#      the frozen encoder (latent space, statistics and every DiT unchanged); held-out PSNR before / after;
#   2. train/sample.py on the shipped model (python/h3ctl/models/h3-tiny/FL2VA, the stage-7 DiT) with the fine-tuned
#      video VAE over it: anchored held-out cases, text-only held-out, training prompts (diffusers' sampling, BF16 DiT).
# -> $OUT: video_vae_ft.safetensors (diffusers layout, f32), eval8.json, meta8.tar (logs, decoder meta, sheets).
# Carry: .whl (the diffusers 0.42.1 wheel) or WHL=train/runs/whl (the slim wheel). The model is in the tree.
#
# Usage: bash train/device_stage8.sh [TRAIN_S] [CLIPS]
# Env: BATCH (32), LR (3e-4), RUNS (train/runs), OUT (/tmp/out), WHL (.whl), WORKERS (15);
#      SMOKE=1: the same chain on the CPU with tiny settings.
set -u
TRAIN_S=${1:-240}; CLIPS=${2:-6000}
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-train/runs}; M=python/h3ctl/models/h3-tiny/FL2VA; D=$RUNS/vdec8
BATCH=${BATCH:-32}; LR=${LR:-3e-4}; WHL=${WHL:-.whl}; N=27; STEPS=20; DEV=(); XTRA=(--workers "${WORKERS:-15}")
if [ "${SMOKE:-0}" = 1 ]; then
    CLIPS=8; BATCH=2; N=1; STEPS=3; TRAIN_S=5; DEV=(--device cpu); XTRA=(--workers 1 --max-steps 2 --eval-clips 2)
fi
mkdir -p "$D" "$OUT"
[ -f $M/video_vae/source/model.safetensors ] || { echo "the shipped model is not at $M"; exit 2; }
. train/device_env.sh

python3 -m train.train_video_decoder --partition $M --run "$D" --seconds "$TRAIN_S" --clips "$CLIPS" \
    --batch "$BATCH" --lr "$LR" "${DEV[@]}" "${XTRA[@]}" 2>&1 | grep --line-buffered -v -i warn > "$D/vdec.stdout"
echo "decoder fine-tune done at $(( $(date +%s) - T0 ))s"
grep "video_decoder\]" "$D/vdec.stdout" | awk 'NR<=4 || /done/ || /before/ || /step [0-9]*000 /'
[ -f "$D/video_vae_ft.safetensors" ] || { echo "training failed"; tail -30 "$D/vdec.stdout"; exit 1; }
cp "$D/video_vae_ft.safetensors" "$OUT/"

python3 -m train.sample --official $M --video-vae-weights "$D/video_vae_ft.safetensors" --out "$D/samples" --bf16 \
    --sets anchored,heldout,train --n $N --steps $STEPS "${DEV[@]}" 2>&1 | grep -v -i warn > "$D/sample.stdout"
grep "\[sample\]" "$D/sample.stdout" || tail -20 "$D/sample.stdout"
cp "$D/samples/eval.json" "$OUT/eval8.json" 2>/dev/null
files=(vdec8/video_decoder.log vdec8/video_decoder-meta.json vdec8/vdec.stdout vdec8/sample.stdout)
for f in vdec8/samples/sheet_anchored.png vdec8/samples/sheet_heldout.png; do [ -f "$RUNS/$f" ] && files+=("$f"); done
tar -cf "$OUT/meta8.tar" -C "$RUNS" "${files[@]}"
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
