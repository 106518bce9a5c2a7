"""The product's Celery app with the baseline task registered too (workers start with -A bench.celery_app).

Same app object, same queues, same settings: the lane workers that run the product's send task
also run B2's baseline task.
"""

from pilot_status.celery import app

import bench.baseline.tasks  # noqa: F401,E402  (registers the trivial task)

__all__ = ["app"]
