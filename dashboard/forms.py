"""The dead-letter filter a person fills in, turned into messaging.resend.matching's filters."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django import forms

from messaging import rules
from messaging.models import Category, DeadLetterStatus, FailureReason


# A bulk selection is what a person ticked, on pages of 25 rows: more than this is not a person's
# selection and is refused (400); "Resend all matching" covers any number, in chunks. Django refuses a form
# of more than DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000) fields before the view sees it.
BULK_MAX_IDS = 500
# ASCII digits, no sign, below 2**63 (a bigint). str.isdigit() also accepts "²" or "١", which int() refuses.
_DEAD_LETTER_ID = re.compile(r"[1-9][0-9]{0,17}")


def _start_of(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=dt_timezone.utc)


def selected_ids(values: list[str]) -> list[int]:
    """The ticked dead-letter ids of a bulk form; ValidationError for more than BULK_MAX_IDS or any value that
    is not an id (the whole selection is refused: a person ticked boxes, a malformed one means a forged form)."""
    if len(values) > BULK_MAX_IDS:
        raise forms.ValidationError(
            f"Select at most {BULK_MAX_IDS} dead letters at once, or use “Resend all matching”."
        )
    for value in values:
        if not _DEAD_LETTER_ID.fullmatch(value):
            raise forms.ValidationError(f"{value[:20]!r} is not a dead letter id.")
    return [int(value) for value in values]


class DeadLetterFilterForm(forms.Form):
    status = forms.ChoiceField(choices=[("", "Any status"), *DeadLetterStatus.choices], required=False)
    reason = forms.ChoiceField(choices=[("", "Any reason"), *FailureReason.choices], required=False)
    category = forms.ChoiceField(choices=[("", "Any category"), *Category.choices], required=False)
    to = forms.CharField(required=False, max_length=32, label="Recipient",
                         widget=forms.TextInput(attrs={"placeholder": "+5511999990000"}))
    date_from = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    date_to = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    @classmethod
    def from_query(cls, query: Any) -> "DeadLetterFilterForm":
        data = query.copy()
        # Open entries are the ones that need someone: show them unless asked otherwise.
        if "status" not in data:
            data["status"] = DeadLetterStatus.OPEN
        return cls(data)

    def clean_to(self) -> str:
        raw = self.cleaned_data.get("to", "").strip()
        if not raw:
            return ""
        phone = rules.normalize_phone(raw)
        if phone is None:
            raise forms.ValidationError("Enter the full number in international format, e.g. +5511999990000.")
        return phone

    def filters(self) -> dict[str, Any]:
        """The valid part of the filter (an invalid field is ignored and shown as an error)."""
        data = self.cleaned_data if self.is_valid() else {
            k: v for k, v in getattr(self, "cleaned_data", {}).items() if k not in self.errors
        }
        date_from: date | None = data.get("date_from")
        date_to: date | None = data.get("date_to")
        return {
            "status": data.get("status") or None,
            "reason": data.get("reason") or None,
            "category": data.get("category") or None,
            "to": data.get("to") or None,
            "created_after": _start_of(date_from) if date_from else None,
            # The "to" day is included: everything before the next midnight (the calendar's last day has
            # none: it bounds nothing).
            "created_before": _start_of(date_to + timedelta(days=1)) if date_to and date_to < date.max else None,
        }

    def query_items(self) -> list[tuple[str, str]]:
        """The filter as query-string pairs, for page links and the bulk form's hidden fields."""
        self.is_valid()
        # status is kept even when empty: "Any status" must survive a page change.
        return [(name, str(self.data.get(name, ""))) for name in self.fields
                if self.data.get(name) or name == "status"]
