#!/usr/bin/env bash
# Second training session, call B: two DiT variants side by side on one GPU, both continued from call A's EMA
# weights on latents of the new audio VAE, sharing one rendered + encoded dataset:
#   X: --obj-weight $XW --p-high $XH      Y: --obj-weight $YW --p-high $YH
# then transport + held-out eval of each. -> $OUT (8 files). Carry: .whl, train/runs/transportB, train/runs/vae16b.
# Usage: bash train/device_stage5.sh [DIT_END_S] [CLIPS] [DATA_SEED]
set -u
DEND=${1:-450}; CLIPS=${2:-12000}; DSEED=${3:-1200}
XW=${XW:-4}; XH=${XH:-0.25}; YW=${YW:-0}; YH=${YH:-0.5}
T0=$(date +%s)
V=train/runs/vae16b; X=train/runs/ditX; Y=train/runs/ditY
mkdir -p $X $Y "${OUT:-/tmp/out}"
cp train/runs/transportB/tokenizer.json $X/; cp train/runs/transportB/tokenizer.json $Y/
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
common="--vae-run $V --init-from train/runs/transportB --minutes $(python3 -c "print(($DEND - 80) / 60)") --clips $CLIPS \
  --data-seed $DSEED --batch ${BATCH:-512} --lr ${LR:-6e-4} --deadline $((T0 + DEND))"
python3 -m train.train_dit --run $X $common --workers 15 --obj-weight $XW --p-high $XH 2>&1 | grep --line-buffered -v -i warn > $X/dit.stdout &
PX=$!
until grep -q "^latents video" $X/dit.stdout 2>/dev/null || ! kill -0 $PX 2>/dev/null; do sleep 2; done
ln -f $X/latents-$CLIPS-$DSEED.pt $Y/ && echo "shared latents at $(( $(date +%s) - T0 ))s"
python3 -m train.train_dit --run $Y $common --workers 2 --obj-weight $YW --p-high $YH 2>&1 | grep -v -i warn > $Y/dit.stdout &
PY=$!
wait $PX; wait $PY; echo "dit done at $(( $(date +%s) - T0 ))s"
for R in $X $Y; do
  awk 'NR<=6 || /done/ || /step [0-9]*[05]00 /' $R/dit.stdout | tail -9
  mkdir -p "$OUT"/$(basename $R)
  python3 -m train.export --transport $R "$OUT"/$(basename $R) 2>&1 | tail -1
  python3 -m train.sample --dit-run $R --vae-run $V --out $R/samples --bf16 --sets heldout --n 27 --steps 20 2>&1 \
      | grep -v -i warn > $R/sample.stdout; head -1 $R/sample.stdout
done
tar -cf "$OUT"/metaB.tar -C train/runs ditX/dit.log ditX/dit-meta.json ditX/sample.stdout ditX/samples/eval.json \
    ditY/dit.log ditY/dit-meta.json ditY/sample.stdout ditY/samples/eval.json ditX/samples/sheet_heldout.png
echo "total $(( $(date +%s) - T0 ))s"; ls -laR "$OUT"
