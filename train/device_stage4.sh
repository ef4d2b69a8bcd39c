#!/usr/bin/env bash
# Second training session, call A: [audio VAE continued from the shipped one, half its crops from beep/click clips]
# || [text encoder + DiT continued from the shipped EMA weights at batch 512, on latents of the *old* audio VAE];
# then audio-only latent statistics for the new audio VAE, transport, held-out eval (old audio VAE). -> $OUT (8 files)
# Carry: .whl, train/runs/transport (EMA weights), train/runs/vae16 (BF16 VAEs + latent_stats.json).
# Usage: bash train/device_stage4.sh [AUDIO_END_S] [DIT_END_S] [CLIPS] [DATA_SEED]
set -u
AEND=${1:-420}; DEND=${2:-465}; CLIPS=${3:-12000}; DSEED=${4:-1100}
T0=$(date +%s)
A=train/runs/avae2; D=train/runs/dit; V=train/runs/vae16
mkdir -p $A $D "${OUT:-/tmp/out}"
cp train/runs/transport/tokenizer.json $D/
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -m train.train_audio_vae --run $A --init-from $V --minutes $(python3 -c "print(($AEND - 25) / 60)") \
    --clips 6000 --workers 4 --batch 96 --p-hard 0.5 --lr 5e-4 --deadline $((T0 + AEND)) > $A/audio_vae.stdout 2>&1 &
PA=$!
python3 -m train.train_dit --run $D --vae-run $V --init-from train/runs/transport --minutes $(python3 -c "print(($DEND - 90) / 60)") \
    --clips $CLIPS --data-seed $DSEED --batch ${BATCH:-512} --lr ${LR:-8e-4} --workers 11 --no-cache \
    --deadline $((T0 + DEND)) 2>&1 | grep -v -i warn > $D/dit.stdout &
PD=$!
wait $PA; echo "audio vae rc $? at $(( $(date +%s) - T0 ))s"
grep -v -i warn $A/audio_vae.stdout | awk 'NR<=5 || NR%5==0 || /done/' | tail -16
python3 -m train.latent_stats --run $A --clips 1000 --workers 4 --video-stats-from $V/latent_stats.json 2>&1 \
    | grep -v -i warn | tail -2
wait $PD; echo "dit done at $(( $(date +%s) - T0 ))s"
awk 'NR<=8 || /done/ || /step [0-9]*[05]00 /' $D/dit.stdout | tail -16
python3 -m train.export --transport $D "$OUT" 2>&1 | tail -1
python3 -m train.sample --dit-run $D --vae-run $V --out $D/samples --bf16 --sets heldout --n 27 --steps 20 2>&1 \
    | grep -v -i warn > $D/sample.stdout; head -30 $D/sample.stdout
cp $A/audio_vae-model.safetensors "$OUT"/
tar -cf "$OUT"/metaA.tar -C train/runs avae2/latent_stats.json avae2/audio_vae.log avae2/audio_vae-meta.json \
    avae2/latent_stats.log dit/dit.log dit/dit-meta.json dit/sample.stdout dit/samples/eval.json dit/samples/sheet_heldout.png
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
