# Sourced by tests/gpu/run_gpu.sh and tests/gpu/run_multi_gpu.sh (from the repository root, with PY and LOG set):
# the NVIDIA libraries the CUDA backend opens at run time, from python3's nvidia wheels (as torch or
# `pip install "h3ctl[cuda]"` installs them) where the variables are unset, for the C tests, which do not go through
# h3ctl's Python (that sets the same variables itself); and the run/note helpers of both scripts.
for pair in "H3_CUDNN_LIB:cudnn/lib/libcudnn.so.9" "H3_NVRTC_LIB:cu13/lib/libnvrtc.so.13" \
            "H3_CUBLASLT_LIB:cu13/lib/libcublasLt.so.13" "H3_NCCL_LIB:nccl/lib/libnccl.so.2"; do
    var="${pair%%:*}"; rel="${pair#*:}"
    if [ -z "${!var:-}" ]; then
        val="$("$PY" -c 'import glob, site, sys; print(next(iter(sorted(p for r in site.getsitepackages() for p in glob.glob(r + "/nvidia/" + sys.argv[1]))), ""))' "$rel" 2>/dev/null)"
        [ -n "$val" ] && export "$var=$val"
    fi
done
export PYTHONPATH="$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"

: >"$LOG/summary.txt"
FAILED=0
note() { echo "$*" | tee -a "$LOG/summary.txt"; }
# run NAME COMMAND...: the command's output goes to the terminal and NAME.log; the result goes to summary.txt.
run() {
    local name=$1 t0=$SECONDS rc
    shift
    echo "==== $name: $*"
    "$@" 2>&1 | tee "$LOG/$name.log"
    rc=$?
    note "$name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || FAILED=1
    return $rc
}
