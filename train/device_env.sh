# Sourced by train/device_stage{7,8,9}.sh: the device's Python environment for a training call. Installs the carried
# diffusers wheel(s) from $WHL (default .whl) when diffusers is missing, keeps Python unbuffered and single-threaded
# per process (the data workers are processes), and prints the GPU.
WHL=${WHL:-.whl}
if ! python3 -c "import diffusers" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHL"/*.whl || { echo "installing $WHL failed"; exit 2; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
