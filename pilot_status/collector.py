"""Keep what a process built while starting out of the garbage collector's work.

Django, Celery, kombu and our own modules leave about a hundred thousand objects behind once a process has
started, and they live as long as it does. CPython's full collection walks every one of them each time it runs, a
pause of 80-150 ms on two busy cores with the whole process stopped; in the OTP lane's worker such a pause sits
in the middle of whatever OTP it is sending (bench/findings.md, "Garbage collection after start-up").
`gc.freeze()` moves them into a generation no collection visits, so a full collection only walks what the
process made since, and the young generations keep collecting as usual.

Called once per process, when it has finished starting: the Celery workers (pilot_status.celery), the relays,
the consumer and the two WSGI applications.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect what starting left behind, then keep every surviving object out of later collections; how many
    objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
