"""Parity stages available in this build of libh3 (registered into h3ctl.parity.STAGES on import)."""

from .parity import text  # noqa: F401
from .parity import tokenize  # noqa: F401
from .parity import dit  # noqa: F401  (dit, schedule, denoise)
from .parity import vae_video  # noqa: F401  (video_decode)
from .parity import vae_encode  # noqa: F401  (video_encode, vae_condition)
from .parity import vae_audio  # noqa: F401
from .parity import audio_encode  # noqa: F401  (audio_encode)
from .parity import pipeline  # noqa: F401  (pipeline)
from .parity import fl2va  # noqa: F401  (keyframes, fl2va)
