#!/usr/bin/env bash
# Stage 7 (FL2VA, issue item 5): teach h3-tiny first/last-frame anchors on ONE H200 in ~8 minutes of wall time.
#   1. fine-tune the SHIPPED h3-tiny (python/h3ctl/models/h3-tiny/FL2VA, part of the carried tree: transformer, text
#      encoder; its VAEs, statistics and tokenizer unchanged) on batches that are text-only or anchored on the first,
#      last or both frames (PROBS), exactly as diffusers' fl2va workflow lays them out (train/train_dit.py); the DiT
#      and the vision tower train, the language model stays frozen (TE_TRAIN=vision);
#   2. transport the EMA weights (official dtypes) to $OUT;
#   3. evaluate with diffusers' sampling (train/sample.py, BF16 DiT): anchored held-out cases, text-only held-out and
#      training prompts; with BASELINE=1 also the shipped weights on the anchored + held-out sets.
# -> $OUT: ema-transformer-{0,1}.safetensors, ema-text_encoder.safetensors, eval7.json, meta7.tar (5 files).
# Carry: .whl (the diffusers 0.42.1 wheel, 6.1 MiB; the device's own transformers 5.17 is used). Nothing else: the
# shipped model is tracked, so it is in the carried tree (do not move it aside for this call). If the tree has grown
# past 64 MiB with the wheel (python -m train.carry_size .whl), carry train/runs/whl instead, made by
# `python -m train.slim_wheel .whl/diffusers-0.42.1-py3-none-any.whl train/runs/whl` (2.2 MiB), and set
# WHL=train/runs/whl.
#
# Usage: bash train/device_stage7.sh [TRAIN_S] [CLIPS] [DATA_SEED]
#   TRAIN_S    seconds of fine-tuning (default 240); the loop also stops TRAIN_END (default 400) s after the start
#   CLIPS      training clips rendered + encoded on the device (default 10000), DATA_SEED (default 1400)
# Env: BATCH (256), LR (4e-4), WARMUP (100), PROBS (0.3,0.25,0.15,0.3 = text,first,last,both), TE_TRAIN (vision),
#      TRAIN_END (400), BASELINE (1), SEED (7), RUNS (train/runs), OUT (/tmp/out), WHL (.whl);
#      SMOKE=1: the same chain on the CPU with tiny settings (6 clips, 3 steps, batch 2, 1 case per set, 3 steps).
set -u
TRAIN_S=${1:-240}; CLIPS=${2:-10000}; DSEED=${3:-1400}
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-train/runs}; M=python/h3ctl/models/h3-tiny/FL2VA; D=$RUNS/dit7
BATCH=${BATCH:-256}; LR=${LR:-4e-4}; WARMUP=${WARMUP:-100}; PROBS=${PROBS:-0.3,0.25,0.15,0.3}
TE_TRAIN=${TE_TRAIN:-vision}; TRAIN_END=${TRAIN_END:-400}; BASELINE=${BASELINE:-1}; SEED=${SEED:-7}
N=27; STEPS=20; DEV=(); XTRA=(--workers 15 --no-cache --save-every 1e9); WHL=${WHL:-.whl}
if [ "${SMOKE:-0}" = 1 ]; then
    CLIPS=6; BATCH=2; N=1; STEPS=3; DEV=(--device cpu); XTRA=(--workers 1 --no-cache --max-steps 3 --save-every 1e9)
fi
mkdir -p "$D" "$OUT"
[ -f $M/transformer/model.safetensors ] || { echo "the shipped model is not at $M"; exit 2; }
. train/device_env.sh
python3 -c "import torch, transformers, diffusers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'diffusers', diffusers.__version__)"

python3 -m train.train_dit --run "$D" --init-official $M --anchor-probs "$PROBS" --te-train "$TE_TRAIN" \
    --minutes "$(python3 -c "print($TRAIN_S / 60)")" --deadline $((T0 + TRAIN_END)) --clips "$CLIPS" \
    --data-seed "$DSEED" --seed "$SEED" --batch "$BATCH" --lr "$LR" --warmup "$WARMUP" --obj-weight 4 --p-high 0.25 \
    "${DEV[@]}" "${XTRA[@]}" 2>&1 | grep --line-buffered -v -i warn > "$D/dit.stdout"
echo "fine-tune done at $(( $(date +%s) - T0 ))s"
awk 'NR<=9 || /done/ || /step [0-9]*[05]00 /' "$D/dit.stdout" | tail -16
grep -q "done:" "$D/dit.stdout" || { echo "training failed"; tail -30 "$D/dit.stdout"; exit 1; }

python3 -m train.export --transport "$D" "$OUT" 2>&1 | tail -1
python3 -m train.sample --official $M --over-run --dit-run "$D" --out "$D/samples" --bf16 \
    --sets anchored,heldout,train --n $N --steps $STEPS "${DEV[@]}" 2>&1 | grep -v -i warn > "$D/sample.stdout"
grep "\[sample\]" "$D/sample.stdout" || tail -20 "$D/sample.stdout"
cp "$D/samples/eval.json" "$OUT/eval7.json" 2>/dev/null
files=(dit7/dit.log dit7/dit-meta.json dit7/tokenizer.json dit7/latent_stats.json dit7/sample.stdout
       dit7/samples/eval.json)
for f in dit7/samples/sheet_anchored.png dit7/samples/sheet_heldout.png; do [ -f "$RUNS/$f" ] && files+=("$f"); done
if [ "$BASELINE" = 1 ]; then
    python3 -m train.sample --official $M --out "$D/base" --bf16 --sets anchored,heldout --n $N --steps $STEPS \
        "${DEV[@]}" 2>&1 | grep -v -i warn > "$D/base.stdout"
    echo "shipped weights:"; grep "\[sample\]" "$D/base.stdout" || tail -20 "$D/base.stdout"
    [ -f "$D/base/eval.json" ] && files+=(dit7/base.stdout dit7/base/eval.json)
fi
tar -cf "$OUT/meta7.tar" -C "$RUNS" "${files[@]}"
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
