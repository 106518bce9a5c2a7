"""The database refuses a status that moves backwards, whoever writes it (issue 25).

Every write of a message's status is a compare-and-set on the statuses it may move from
(messaging.lifecycle, whose table MOVES this trigger must allow exactly: tests/messaging/test_lifecycle.py);
this trigger holds the same order for any other UPDATE too (a script, a manual fix, a new code path
that forgets its guard), with its three ways back and into FAILED.

It fires only when the status changes (WHEN), so the hot path's other updates (a lease renewed,
a status check stamped) do not call it.
"""

from django.db import migrations

_CREATE = """
CREATE FUNCTION messaging_message_status_order() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    progress CONSTANT text[] := ARRAY['QUEUED', 'SENDING', 'SENT', 'SERVER_ACK', 'DELIVERED', 'READ'];
BEGIN
    IF array_position(progress, NEW.status::text) > array_position(progress, OLD.status::text)  -- forward
       OR (OLD.status = 'SENDING' AND NEW.status = 'QUEUED')  -- a retry, a wait, a recovered lease
       OR (OLD.status IN ('QUEUED', 'SENDING', 'SENT', 'SERVER_ACK') AND NEW.status = 'FAILED')
       OR (OLD.status = 'FAILED' AND NEW.status = 'QUEUED')  -- a force resend
    THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'message % may not move from % to %', OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation', CONSTRAINT = 'message_status_order';
END
$$;
CREATE TRIGGER message_status_order
    BEFORE UPDATE OF status ON messaging_message
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION messaging_message_status_order();
"""

_DROP = """
DROP TRIGGER message_status_order ON messaging_message;
DROP FUNCTION messaging_message_status_order();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("messaging", "0009_event_kinds_sync_stopped_and_checked"),
    ]

    operations = [migrations.RunSQL(_CREATE, reverse_sql=_DROP)]
