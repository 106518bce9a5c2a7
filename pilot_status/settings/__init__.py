"""Settings, read from the environment only (README, "Set-up"; .env.example), one module per concern.

Every required value fails start-up loudly with the variable's name; there are no insecure
defaults here. `make run` and `make test` supply development values (scripts/env.sh). With DEBUG=0
(production mode) a weak or published secret or a `*` host stops every process in one line
(pilot_status/production.py), and the transport settings default to HTTPS-only.

DJANGO_SETTINGS_MODULE stays `pilot_status.settings`: this package gathers its modules' settings, in this
order. Security comes first, so that production mode's refusals run before any other variable is read; a
module that needs an earlier one's value imports it by name. docs/settings.md documents every variable,
module by module (`make settings-docs`).
"""

from .security import *  # noqa: F401,F403
from .base import *  # noqa: F401,F403
from .sending import *  # noqa: F401,F403
from .ingestion import *  # noqa: F401,F403
from .callbacks import *  # noqa: F401,F403
