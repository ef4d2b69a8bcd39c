"""Parity stages available in this build of libh3 (registered into h3ctl.parity.STAGES)."""

from . import parity_text  # noqa: F401
from . import parity_tokenize  # noqa: F401
from . import parity_dit  # noqa: F401,E402  (dit, schedule, denoise)
from . import parity_vae_video  # noqa: F401,E402  (video_decode)
from . import parity_vae_audio  # noqa: E402,F401
from . import parity_pipeline  # noqa: F401,E402  (pipeline)
