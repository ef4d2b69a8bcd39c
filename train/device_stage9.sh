#!/usr/bin/env bash
# Stage 9 (Ref2VA, issue #15 item 5): fine-tune the attention of the SHIPPED h3-tiny FL2VA transformer into its Ref2VA
# transformer on ONE H200 (train/train_ref2va.py): image references (+ audio references) -> colour, shape, pitch.
# -> $OUT: ref2va-attn.safetensors (EMA attention weights, diffusers names, BF16), ref2va.log.
# Carry: .whl (the diffusers 0.42.1 wheel). The shipped model is tracked, so it is in the carried tree.
# Usage: bash train/device_stage9.sh [TRAIN_S] [CLIPS] [DATA_SEED]; env: BATCH (256), LR (4e-4), P_AUDIO (0.6), OBJ_WEIGHT (4), TRAIN (attn),
#        END (540: the loop stops END s after the start, whatever TRAIN_S), INIT (a ref2va-attn.safetensors to resume).
set -u
TRAIN_S=${1:-400}; CLIPS=${2:-12000}; DSEED=${3:-1500}
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-train/runs}; D=$RUNS/ref2va; WHL=${WHL:-.whl}
mkdir -p "$D" "$OUT"
. train/device_env.sh
python3 -m train.refs 2>&1 | grep -v -i warn
python3 -m train.train_ref2va --run "$D" --out "$OUT" --minutes "$(python3 -c "print($TRAIN_S / 60)")" \
    --deadline $((T0 + ${END:-540})) --clips "$CLIPS" --data-seed "$DSEED" --batch "${BATCH:-256}" \
    --lr "${LR:-4e-4}" --p-audio "${P_AUDIO:-0.6}" --obj-weight "${OBJ_WEIGHT:-4}" --train "${TRAIN:-attn}" --workers 15 ${INIT:+--init "$INIT"} 2>&1 \
    | grep --line-buffered -v -i warn > "$D/stdout"
awk 'NR<=8 || /done/ || /step [0-9]*[05]00 /' "$D/stdout" | tail -20
grep -q "done:" "$D/stdout" || { echo "training failed"; tail -30 "$D/stdout"; }
cp "$D/ref2va.log" "$OUT/" 2>/dev/null
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
