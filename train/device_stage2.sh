#!/usr/bin/env bash
# Device call 2: [video VAE continued || audio VAE] -> latent stats -> text encoder + DiT (first part) -> transport
# -> BF16 sampling + semantic eval of the 27 held-out prompts. Results -> $OUT (8 files).
# Needs train/runs/vae with the stage-1 video VAE (carried). Usage:
#   bash train/device_stage2.sh [VIDEO_TOTAL_MIN] [AUDIO_MIN] [DIT_MIN] [CLIPS]
set -u
VMIN=${1:-10.5}; AMIN=${2:-3.6}; DMIN=${3:-2.5}; CLIPS=${4:-10000}
T0=$(date +%s)
R=train/runs/vae; D=train/runs/dit
mkdir -p $R $D "${OUT:-/tmp/out}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
python3 -m train.train_video_vae --run $R --minutes $VMIN --clips ${VAE_CLIPS:-4000} --workers 7 \
    --deadline $((T0 + ${VAE_END_S:-240})) > $R/video_vae.stdout 2>&1 &
PV=$!
python3 -m train.train_audio_vae --run $R --minutes $AMIN --clips ${VAE_CLIPS:-6000} --workers 7 \
    --deadline $((T0 + ${VAE_END_S:-240})) > $R/audio_vae.stdout 2>&1 &
PA=$!
wait $PV; echo "video vae rc $?"; wait $PA; echo "audio vae rc $?"
grep -v -i warn $R/video_vae.stdout | tail -3; grep -v -i warn $R/audio_vae.stdout | awk 'NR<=4 || NR%8==0' | tail -12
python3 -m train.latent_stats --run $R --clips ${STATS_CLIPS:-1000} --workers 15 2>&1 | grep -v -i warn | tail -4
echo "vae+stats $(( $(date +%s) - T0 ))s"
python3 -m train.train_dit --run $D --vae-run $R --minutes $DMIN --clips $CLIPS --batch ${BATCH:-128} --workers 15 \
    --deadline $((T0 + ${DIT_END_S:-495})) 2>&1 | grep -v -i warn > $D/dit.stdout
awk 'NR<=8 || /done/ || /step [0-9]*[05]00 /' $D/dit.stdout | tail -14
echo "dit $(( $(date +%s) - T0 ))s"
python3 -m train.export --transport $D "$OUT" 2>&1 | tail -1
python3 -m train.sample --dit-run $D --vae-run $R --out $D/samples --bf16 --sets heldout --n ${SAMPLE_N:-27} \
    --steps 20 2>&1 | grep -v -i warn > $D/sample.stdout; head -40 $D/sample.stdout
cp $R/video_vae-model*.safetensors $R/audio_vae-model.safetensors $D/samples/sheet_heldout.png "$OUT"/
tar -cf "$OUT"/meta.tar -C train/runs vae/latent_stats.json vae/video_vae.log vae/audio_vae.log vae/video_vae-meta.json \
    vae/audio_vae-meta.json vae/latent_stats.log dit/tokenizer.json dit/latent_stats.json dit/dit.log dit/dit-meta.json \
    dit/sample.stdout dit/samples/eval.json 2>&1 | tail -2
echo "total $(( $(date +%s) - T0 ))s"; ls -la "$OUT"
