"""Bench-only settings: the product's settings plus the baseline app and URLconf.

Only `python -m bench` (and the processes it starts) load this module, so the bare baseline view
never appears in the product's URLs.
"""

from pilot_status.settings import *  # noqa: F401,F403
from pilot_status.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.baseline"]
ROOT_URLCONF = "bench.urls"
