#!/usr/bin/env bash
# Second training session, call C: continue the winning call-B variant (object-token weight + high-sigma band) from
# its EMA weights on a fresh dataset, then transport + held-out and training-prompt eval. -> $OUT
# Carry: .whl, train/runs/transportC, train/runs/vae16b.   Usage: bash train/device_stage6.sh [DIT_END_S] [CLIPS] [SEED]
set -u
DEND=${1:-400}; CLIPS=${2:-12000}; DSEED=${3:-1300}
T0=$(date +%s)
V=train/runs/vae16b; D=train/runs/ditC
mkdir -p $D "${OUT:-/tmp/out}"
cp train/runs/transportC/tokenizer.json $D/
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
python3 -m train.train_dit --run $D --vae-run $V --init-from train/runs/transportC \
    --minutes $(python3 -c "print(($DEND - 60) / 60)") --clips $CLIPS --data-seed $DSEED --batch 512 --lr ${LR:-4e-4} \
    --workers 15 --no-cache --obj-weight 4 --p-high 0.25 --deadline $((T0 + DEND)) > $D/dit.stdout 2>&1
echo "dit done at $(( $(date +%s) - T0 ))s"; grep -v -i warn $D/dit.stdout | awk 'NR<=6 || /done/ || /step [0-9]*[05]00 /' | tail -9
python3 -m train.export --transport $D "$OUT" 2>&1 | tail -1
python3 -m train.sample --dit-run $D --vae-run $V --out $D/samples --bf16 --sets heldout,train --n 27 --steps 20 \
    > $D/sample.stdout 2>&1; grep "\[sample\]" $D/sample.stdout
tar -cf "$OUT"/metaC.tar -C train/runs ditC/dit.log ditC/dit-meta.json ditC/sample.stdout ditC/samples/eval.json \
    ditC/samples/sheet_heldout.png
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
