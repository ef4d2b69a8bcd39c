"""A smaller diffusers wheel for device calls whose carry is tight (the tree holds the 57 MB embedded model): the
same wheel without the sub-packages of ``diffusers/pipelines/`` (the classic pipelines) and of
``diffusers/modular_pipelines/`` other than ``minimax_h3``, which no stage of train/ imports (only
``pipelines/__init__`` and ``pipelines/pipeline_loading_utils`` are loaded; their top-level modules are kept).
RECORD is rewritten to list what is left. 6.1 MiB -> about 2.5 MiB.

    python -m train.slim_wheel .whl/diffusers-0.42.1-py3-none-any.whl train/runs/whl
    WHL=train/runs/whl bash train/device_stage7.sh ...        # carry train/runs/whl instead of .whl
"""

import sys
import zipfile
from pathlib import Path


def keep(name: str) -> bool:
    parts = name.split("/")
    if len(parts) > 3 and parts[0] == "diffusers" and parts[1] == "pipelines":
        return False                                   # diffusers/pipelines/<pipeline>/...
    if len(parts) > 3 and parts[0] == "diffusers" and parts[1] == "modular_pipelines" and parts[2] != "minimax_h3":
        return False
    return True


def main(src: str, out_dir: str) -> Path:
    src, out = Path(src), Path(out_dir) / Path(src).name
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        kept = [i for i in zin.infolist() if keep(i.filename)]
        names = {i.filename for i in kept}
        for info in kept:
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [ln for ln in data.decode().splitlines() if ln.split(",")[0] in names]
                data = ("\n".join(lines) + "\n").encode()
            zout.writestr(info, data)
    print(f"{out}: {out.stat().st_size / 2**20:.2f} MiB (from {src.stat().st_size / 2**20:.2f} MiB)")
    return out


if __name__ == "__main__":
    main(*sys.argv[1:3])
