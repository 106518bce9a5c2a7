import os

from django.core.wsgi import get_wsgi_application

from pilot_status.collector import freeze_startup_objects

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot_status.settings")
application = get_wsgi_application()
# Imported by each gunicorn worker once it has forked: what it built so far lives as long as it.
freeze_startup_objects()
