"""Bench-only settings: the product's settings plus the baseline app and URLconf.

Only `python -m bench` (and the processes it starts) load this module, so the bare baseline view
never appears in the product's URLs.
"""

import os

from pilot_status.settings import *  # noqa: F401,F403
from pilot_status.settings import INSTALLED_APPS

# The benches' figures (B4's bound above all) were measured at 20 sends/s per number, the product's pace before an
# official number's default became Meta's 80/s: they keep it unless a run sets SEND_RATE_PER_INSTANCE.
if not os.environ.get("SEND_RATE_PER_INSTANCE"):
    SEND_RATE_PER_INSTANCE = 20.0

INSTALLED_APPS = [*INSTALLED_APPS, "bench.baseline"]
ROOT_URLCONF = "bench.urls"
