#!/usr/bin/env bash
# Device call 3: continue the text encoder + DiT, then BF16 sampling + eval (held-out and training prompts).
# Warm machine with train/runs/dit still there: exact resume (in practice the device re-copies the tree and the
# ignored run dir was gone even on a warm machine, so plan on the cold path).
# Cold machine: weights from the carried train/runs/transport (EMA, official dtypes), VAEs from train/runs/vae16.
# Usage: bash train/device_stage3.sh [MORE_MIN] [CLIPS]
set -u
MORE=${1:-5.0}; CLIPS=${2:-10000}
T0=$(date +%s)
D=train/runs/dit
mkdir -p $D "${OUT:-/tmp/out}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if [ -f $D/dit-meta.json ] && [ -d train/runs/vae ] && [ -f train/runs/vae/latent_stats.json ]; then
  V=train/runs/vae
  PREV=$(python3 -c "import json; print(json.load(open('$D/dit-meta.json'))['elapsed'])")
  MIN=$(python3 -c "print($PREV / 60 + $MORE)"); INIT=""
  echo "warm resume: previous ${PREV}s, total budget ${MIN} min"
else
  V=train/runs/vae16; MIN=$MORE; INIT="--init-from train/runs/transport"
  echo "cold start from transported EMA weights"
fi
python3 -m train.train_dit --run $D --vae-run $V --minutes $MIN --clips $CLIPS --batch ${BATCH:-128} --workers 15 \
    $INIT --deadline $((T0 + ${DIT_END_S:-470})) 2>&1 | grep -v -i warn > $D/dit3.stdout
awk 'NR<=8 || /done/ || /step [0-9]*[05]00 /' $D/dit3.stdout | tail -14
echo "dit $(( $(date +%s) - T0 ))s"
python3 -m train.export --transport $D "$OUT" 2>&1 | tail -1
python3 -m train.sample --dit-run $D --vae-run $V --out $D/samples --bf16 --sets heldout,train --n 27 \
    --steps 20 2>&1 | grep -v -i warn > $D/sample.stdout; head -50 $D/sample.stdout
cp $D/samples/sheet_heldout.png $D/samples/sheet_train.png $D/samples/samples.npz "$OUT"/
tar -cf "$OUT"/meta3.tar -C train/runs dit/dit.log dit/dit-meta.json dit/sample.stdout dit/samples/eval.json \
    dit/tokenizer.json 2>&1 | tail -2
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
