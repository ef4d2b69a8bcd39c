"""The shared-weight Ref2VA partition on CUDA: the same render (an image and an audio reference) on the shared form
and on the full Ref2VA copy gives the same bytes on the GPU, as on the CPU (tests/test_ref2va_shared.py), so the GPU
uploads the Ref2VA tensors from Ref2VA's own file and the rest from FL2VA's; FL2VA's transformer renders something
else there too. Prints a `parity:` line with the distance to the CPU render."""

from __future__ import annotations

from tests.gpu.cuda_support import require_libh3_cuda

CUDA = require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import numpy as np  # noqa: E402

from tests.test_ref2va_shared import _render, forms  # noqa: E402,F401  (forms: the module-scoped fixture)


def test_shared_form_on_cuda(forms):  # noqa: F811
    full, shared, fl_only, _ = forms
    fv, fa = _render(full, device="cuda")
    sv, sa = _render(shared, device="cuda")
    assert fv.tobytes() == sv.tobytes() and fa.tobytes() == sa.tobytes()
    ov, _ = _render(fl_only, device="cuda")
    assert not np.array_equal(ov, fv)
    cv, ca = _render(shared, device="cpu")
    err = np.abs(sv.astype(np.int16) - cv).mean()
    print(f"parity: shared Ref2VA on cuda byte-identical to the full copy; vs the cpu render mean |d pixel| "
          f"{err:.2f}, audio rel-L2 {np.linalg.norm(sa - ca) / max(np.linalg.norm(ca), 1e-30):.2e}")
