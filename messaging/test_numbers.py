"""TEST magic numbers (issue 23 §4): recipients that, sent to with a TEST key, simulate one outcome each
without calling Evolution, the way Twilio's test credentials have magic numbers (+15005550006 …).

They sit in the range North America reserves for fictional use (555-0100 to 555-0199: no real phone
has one; `phonenumbers` takes them as valid), area code 201. A TEST key may send to them as well as to
the project's test number; the funnel is otherwise the same (a UTILITY or MARKETING message needs an
opt-in for the number, as for any other). With a LIVE key they are ordinary numbers: sent to Evolution
like any other (and, being fictional, WhatsApp does not know them).

What each does is decided at the one seam where Evolution's answer meets the worker
(messaging.sending.simulated): the same claim, classification, retries, FAILED with its dead letter,
and receipts through the same forward-only compare-and-set as the webhook's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import Environment, FailureReason, Status


@dataclass(frozen=True)
class Scenario:
    name: str
    # What the simulated Evolution answers to each attempt: "sent", "not_on_whatsapp",
    # "instance_not_found" or "unavailable" (HTTP 503); the last entry repeats.
    answers: tuple[str, ...]
    receipts: tuple[str, ...] = ()  # Evolution's receipt statuses after a send, in order
    final: str = ""  # the status it ends in (documentation and tests)
    reason: str = ""  # its failureReason when it fails
    # Instead of an answer: the instance is held as not connected (no attempt used) until deliverUntil,
    # as a real disconnected instance's messages wait, and the next claim fails it EXPIRED.
    holds: bool = False


SENT = "sent"
NOT_ON_WHATSAPP = "not_on_whatsapp"
INSTANCE_NOT_FOUND = "instance_not_found"
UNAVAILABLE = "unavailable"

DELIVERED = Scenario("delivered", (SENT,), ("SERVER_ACK", "DELIVERY_ACK"), Status.DELIVERED)
READ = Scenario("read", (SENT,), ("SERVER_ACK", "DELIVERY_ACK", "READ"), Status.READ)
NOT_ON_WHATSAPP_SCENARIO = Scenario("not on WhatsApp", (NOT_ON_WHATSAPP,), final=Status.FAILED,
                                    reason=FailureReason.INVALID_RECIPIENT)
INSTANCE_NOT_FOUND_SCENARIO = Scenario("instance not found", (INSTANCE_NOT_FOUND,), final=Status.FAILED,
                                       reason=FailureReason.INSTANCE_NOT_FOUND)
# Two transient answers (each uses an attempt and waits the retry schedule: about 5 s, then 15 s), then sent.
FLAKY = Scenario("transient failures, then delivered", (UNAVAILABLE, UNAVAILABLE, SENT),
                 ("SERVER_ACK", "DELIVERY_ACK"), Status.DELIVERED)
# Its instance never connects: held, no attempt used, until deliverUntil passes (send it with a short one).
EXPIRED = Scenario("expired", (), final=Status.FAILED, reason=FailureReason.EXPIRED, holds=True)

NUMBERS: dict[str, Scenario] = {
    "+12015550100": DELIVERED,
    "+12015550101": READ,
    "+12015550102": NOT_ON_WHATSAPP_SCENARIO,
    "+12015550103": INSTANCE_NOT_FOUND_SCENARIO,
    "+12015550104": FLAKY,
    "+12015550105": EXPIRED,
}


def is_magic(to: str) -> bool:
    return to in NUMBERS


def scenario_for(environment: str, to: str) -> Scenario | None:
    """The outcome a message simulates: only a TEST message to a magic number; LIVE goes to Evolution."""
    return NUMBERS.get(to) if environment == Environment.TEST else None


def describe() -> str:
    """The magic numbers as Markdown, for the OpenAPI description of the send endpoint."""
    rows = "\n".join(
        f"| `{number}` | {scenario.name} | `{scenario.final}`{f' `{scenario.reason}`' if scenario.reason else ''} |"
        for number, scenario in NUMBERS.items()
    )
    return (
        "With a TEST key the recipient must be the project's test number or one of the TEST magic numbers, which "
        "simulate an outcome without calling Evolution (same statuses, timeline and dead letters as the real "
        "thing; an opt-in is needed as for any number; with a LIVE key they are ordinary numbers):\n\n"
        "| to | simulates | ends |\n|---|---|---|\n" + rows
    )

