#!/usr/bin/env bash
# Device call 1: both VAEs concurrently on one GPU, then latent statistics. Results -> $OUT (<= 8 files).
# Usage (from the repo root, wheels installed on PYTHONPATH): bash train/device_stage1.sh [VAE_MINUTES]
set -u
MIN=${1:-7.0}
T0=$(date +%s)
DEADLINE=$((T0 + ${DEADLINE_S:-505}))
R=train/runs/vae
mkdir -p $R "${OUT:-/tmp/out}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, diffusers, transformers, tokenizers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
python3 -m train.train_video_vae --run $R --minutes $MIN --clips ${VAE_CLIPS:-6000} --workers ${WORKERS_V:-8} --deadline $DEADLINE > $R/video_vae.stdout 2>&1 &
PV=$!
python3 -m train.train_audio_vae --run $R --minutes $MIN --clips ${VAE_CLIPS:-6000} --workers ${WORKERS_A:-6} --deadline $DEADLINE > $R/audio_vae.stdout 2>&1 &
PA=$!
wait $PV; echo "video vae rc $?"; wait $PA; echo "audio vae rc $?"
grep -v Warn $R/video_vae.stdout | tail -4; grep -v Warn $R/audio_vae.stdout | tail -3
T1=$(date +%s)
python3 -m train.latent_stats --run $R --clips ${STATS_CLIPS:-2000} --workers ${WORKERS:-15} 2>&1 | grep -v -i warn | tail -6
echo "latent stats $(( $(date +%s) - T1 ))s; total $(( $(date +%s) - T0 ))s"
cp $R/video_vae-model*.safetensors $R/audio_vae-model*.safetensors $R/latent_stats.json "$OUT"/ 2>/dev/null
tar -cf "$OUT"/vae_logs.tar -C $R $(cd $R && ls *.log *.stdout *-meta.json 2>/dev/null)
ls -la "$OUT"
