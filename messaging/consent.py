"""Consent at send time (issue 47 §5): the accept funnel checks a recipient's opt-in once, but a message may wait
hours before it is sent (a disconnected instance, a marketing backlog), and the person may say STOP meanwhile.

Two guards keep a message whose consent ended from going out:
- an opt-out (messaging.opt_outs: a keyword the person writes, or `DELETE /v1/opt-ins`) fails every queued
  non-OTP message to that number at once (`opt_outs.withdraw_queued`, in the revocation's transaction): FAILED
  `OPTED_OUT`, with a dead letter;
- a claim reads the opt-in again in its own statement (`OPTED_IN_AT_CLAIM`, through the unique index of live
  consents: no extra round trip) and the worker fails a claimed message `may_send` refuses, before any call to
  Evolution: an opt-out that committed after the first guard's scan, or a consent ended by any other path.

An OPTED_OUT dead letter is force-resent only once the recipient has a new opt-in (messaging.resend). OTPs are
exempt, as in the funnel: a person asking for a code wants it (docs/security.md, "Consent").
"""

from __future__ import annotations

from .models import Category, OptIn

# Whether the claimed message (alias `m`) still has a live opt-in of its project and environment for its number:
# one probe of the unique index of live consents (one_live_opt_in_per_phone). An OTP is not asked about.
OPTED_IN_AT_CLAIM = f"""(m.category = '{Category.OTP.value}' OR EXISTS (
    SELECT 1 FROM {OptIn._meta.db_table} o
     WHERE o.project_id = m.project_id AND o.environment = m.environment AND o.phone = m."to"
       AND o.revoked_at IS NULL))"""


def may_send(category: str, opted_in: bool) -> bool:
    """Whether a message may go out now: an OTP always (the funnel chose its route by its consent when it was
    accepted), anything else only while its recipient's opt-in is live."""
    return category == Category.OTP or opted_in


DETAIL = "the recipient's opt-in ended before it was sent (opt-out: {why}); a resend needs a new opt-in"
