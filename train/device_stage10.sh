#!/usr/bin/env bash
# Stage 10 (issue #26 part 3): distil a few-step student of the SHIPPED h3-tiny FL2VA transformer (T2VA + FL2VA) on
# ONE H200 in one call of at most 7 minutes wall, everything included (train/distill_fewstep.py: teacher trajectories
# of the base model, 48 Euler evaluations each; a rank-12 LoRA trained so that one step from each point of the
# 4-evaluation h3 grid lands on the teacher's state at the next one; diffusers' sampling checks at 4 / 2 / 8 evaluations).
# -> $OUT: h3-tiny-fast.safetensors (EMA LoRA, < 850,000 bytes), h3-tiny-fast-raw.safetensors (no EMA),
#    h3-tiny-fast-mid.safetensors (EMA half-way through the training time), distill.json,
#    distill.log, stage10.tar (eval sheets and the per-run eval JSON).
# Carry: .carry/diffusers.tar.xz (tests/gpu/make_carry.sh); the tree holds the shipped model.
# Usage: bash train/device_stage10.sh            (the lead runs it with $OUT set)
# Env: END (390: s after the start by which everything is written), TRAIN_S (200), PROMPTS (8000), ANCHORED (4000),
#      DRAWS (1), SUBSTEPS (6), RANK (12), LR (5e-4), BATCH (256), RUNS (train/runs), OUT (/tmp/out);
#      SMOKE=1: the same chain on the CPU with tiny settings.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-train/runs}; D=$RUNS/distill10; M=python/h3ctl/models/h3-tiny/FL2VA
END=${END:-390}; TRAIN_S=${TRAIN_S:-200}
PROMPTS=${PROMPTS:-8000}; ANCHORED=${ANCHORED:-4000}; DRAWS=${DRAWS:-1}; SUBSTEPS=${SUBSTEPS:-6}
RANK=${RANK:-12}; LR=${LR:-5e-4}; BATCH=${BATCH:-256}
XTRA=(--workers 14 --eval-n 27 --base-eval 4); DEV=()
# phase deadlines (s after the start): teacher trajectories, training, evaluation; the rest is for writing out
T_TEACH=${T_TEACH:-150}; T_TRAIN=${T_TRAIN:-290}; T_EVAL=$((END - 15))
if [ "${SMOKE:-0}" = 1 ]; then
    PROMPTS=${PROMPTS_SMOKE:-6}; ANCHORED=${ANCHORED_SMOKE:-3}; SUBSTEPS=1; BATCH=4; TRAIN_S=${TRAIN_S_SMOKE:-20}
    XTRA=(--workers 1 --eval-n 1 --eval-evals 4 --max-steps ${STEPS_SMOKE:-3} --log-every 1 --chunk 4); DEV=(--device cpu)
fi
mkdir -p "$D" "$OUT"
[ -f $M/transformer/model.safetensors ] || { echo "the shipped model is not at $M"; exit 2; }
if ! python3 -c "import diffusers" 2>/dev/null; then
    [ -f .carry/diffusers.tar.xz ] || { echo "no diffusers and no .carry/diffusers.tar.xz"; exit 2; }
    mkdir -p /tmp/site && tar -xJf .carry/diffusers.tar.xz -C /tmp/site || { echo "unpacking diffusers failed"; exit 2; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
python3 -c "import torch, transformers, diffusers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'diffusers', diffusers.__version__)"
echo "setup done at $(( $(date +%s) - T0 ))s"

python3 -m train.distill_fewstep --official $M --run "$D" --out "$OUT" --prompts "$PROMPTS" --anchored "$ANCHORED" \
    --draws "$DRAWS" --substeps "$SUBSTEPS" --rank "$RANK" --lr "$LR" --batch "$BATCH" --train-seconds "$TRAIN_S" \
    --teacher-deadline $((T0 + T_TEACH)) --deadline $((T0 + T_TRAIN)) --eval-deadline $((T0 + T_EVAL)) \
    "${XTRA[@]}" "${DEV[@]}" 2>&1 | grep --line-buffered -v -i warn > "$D/stdout"
rc=${PIPESTATUS[0]}
awk '!/^\[sample\]|^   FAIL/ || /pass rate/' "$D/stdout" | grep -v "^   FAIL" | tail -40
[ "$rc" = 0 ] || { echo "distill_fewstep failed (rc $rc)"; tail -30 "$D/stdout"; }
cp "$D/distill.log" "$OUT/" 2>/dev/null
cp "$D/stdout" "$OUT/distill.stdout" 2>/dev/null
(cd "$RUNS" && tar -cf "$OUT/stage10.tar" $(ls -d distill10/eval-*/eval.json distill10/eval-*/sheet_*.png 2>/dev/null)) 2>/dev/null
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
