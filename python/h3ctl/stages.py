"""Parity stages available in this build of libh3 (registered into h3ctl.parity.STAGES)."""
from . import parity_vae_audio  # noqa: E402,F401
