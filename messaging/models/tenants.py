"""The tenants and their numbers: projects, API keys, instances (WhatsApp numbers), opt-ins, and each
number's last exchange with a recipient (Contact)."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import ExpressionWrapper, F, Q
from django.utils import timezone

from ..choices import ConnectionState, Environment, HealthState, SendProfile
from ..querysets import ProjectScopedQuerySet
from ..tokens import InstanceTokens, hash_secret, new_token_salt


# An inbound message whose whole text is one of these (trimmed, case and accents ignored) revokes the
# sender's opt-in for the project (messaging.opt_outs). Portuguese, Spanish and English, as the
# carriers' and Twilio's STOP words, plus their usual Portuguese and Spanish counterparts.
DEFAULT_OPT_OUT_KEYWORDS = [
    "STOP", "STOP ALL", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "OPT OUT", "OPTOUT", "REVOKE",
    "PARAR", "PARE", "SAIR", "CANCELAR", "DESCADASTRAR", "DESCADASTRE", "REMOVER",
    "BAJA", "DAR DE BAJA", "DARSE DE BAJA", "CANCELAR SUSCRIPCION", "ANULAR SUSCRIPCION",
]
MAX_OPT_OUT_KEYWORDS = 50
MAX_OPT_OUT_KEYWORD_LENGTH = 40


def default_opt_out_keywords() -> list[str]:
    return list(DEFAULT_OPT_OUT_KEYWORDS)


class Project(models.Model):
    name = models.CharField(max_length=200)
    production_approved = models.BooleanField(default=False)
    test_number = models.CharField(max_length=20, help_text="E.164 number allowed in TEST")
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="projects")
    opt_out_keywords = ArrayField(
        models.CharField(max_length=MAX_OPT_OUT_KEYWORD_LENGTH),
        size=MAX_OPT_OUT_KEYWORDS,
        default=default_opt_out_keywords,
        blank=True,
        help_text="Comma-separated. An inbound message whose whole text is one of these (case and accents "
        "ignored) revokes the sender's opt-in for this project. Empty: inbound messages never revoke.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"


class ApiKey(models.Model):
    PREFIXES = {Environment.TEST: "ps_test_", Environment.LIVE: "ps_live_"}

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    environment = models.CharField(max_length=4, choices=Environment.choices)
    # Only the hash is stored; `display_prefix` lets people recognise a key in admin.
    key_hash = models.CharField(max_length=64, unique=True)
    display_prefix = models.CharField(max_length=20)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.display_prefix}… ({self.environment})"

    @classmethod
    def issue(cls, project: Project, environment: str) -> tuple[ApiKey, str]:
        """Create a key and return it with its raw value, which is never stored."""
        raw = cls.PREFIXES[Environment(environment)] + secrets.token_urlsafe(24)
        key = cls.objects.create(
            project=project,
            environment=environment,
            key_hash=hash_secret(raw),
            display_prefix=raw[:12],
        )
        return key, raw

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def revoke(self) -> bool:
        return bool(
            ApiKey.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        )


class Instance(InstanceTokens, models.Model):
    """One WhatsApp number connected on Evolution API."""

    name = models.CharField(max_length=100, unique=True, help_text="Evolution instance name")
    project = models.ForeignKey(
        Project,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="instances",
        help_text="Empty: a Pilot Status instance",
    )
    is_official = models.BooleanField(default=False, help_text="The official Pilot Status number")
    priority = models.IntegerField(default=100, help_text="Fallback order: lower goes first")
    connection_state = models.CharField(
        max_length=12, choices=ConnectionState.choices, default=ConnectionState.OPEN
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    # The webhook token is derived from SECRET_KEY and this salt, so no usable secret sits in
    # the database (issue 8, S5); the Evolution instance token is kept only as a hash. Every
    # instance has its own random salt, however it was made (operators, admin, a script: save()).
    token_salt = models.CharField(max_length=32, default=new_token_salt)
    evolution_token_hash = models.CharField(max_length=64, blank=True, default="")
    send_rate_per_second = models.FloatField(
        null=True, blank=True, help_text="Send pace cap for this number; empty: SEND_RATE_PER_INSTANCE"
    )
    # How the number is paced (messaging.sending.policy, docs/sending-policy.md): a new number is taken for a
    # Baileys one, the kind WhatsApp bans for machine-like sending, until someone says it is a Cloud API number.
    send_profile = models.CharField(
        max_length=12, choices=SendProfile.choices, default=SendProfile.UNOFFICIAL,
        help_text="unofficial: human pace (one send at a time, jittered gaps, caps with warm-up, cold-contact "
        "quota); official: a Cloud API number (Meta's throughput and pair rate)",
    )
    send_policy = models.JSONField(
        default=dict, blank=True,
        help_text='Overrides of the profile\'s values, e.g. {"hourly_max": 60}; empty: the documented defaults',
    )
    # The number's standing, moved by the health governor (messaging.governor) or an operator: `at_risk` cuts its
    # caps, `resting` and `restricted` hold its sends. Every change is an InstanceHealthEvent.
    health_state = models.CharField(max_length=12, choices=HealthState.choices, default=HealthState.HEALTHY)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    # Until then the number writes to no cold contact (a 463 on one started a cooling period).
    cold_paused_until = models.DateTimeField(null=True, blank=True)
    # An operator's health state holds until then; the governor judges the signals again after it.
    health_override_until = models.DateTimeField(null=True, blank=True)
    # Evolution's statusReason of the last connection.update (401 logged out, 403 forbidden: banned).
    connection_reason = models.PositiveSmallIntegerField(null=True, blank=True)
    # A configuration fault Evolution reported for this instance (e.g. 401: our apikey is refused).
    # Kept here so that it is loud in admin, not only in a log line.
    last_gateway_error = models.TextField(blank=True, default="")
    last_gateway_error_at = models.DateTimeField(null=True, blank=True)
    # Whether this Evolution sends with the WhatsApp id we choose (`messageId`): empty until an answer
    # shows it, False when an answer's key.id is not the one asked for (an Evolution older than the
    # field ignores it). A lost answer's "not found by our id" proves "not sent" only when True
    # (sending.evidence).
    honours_message_id = models.BooleanField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["priority", "pk"]
        indexes = [
            # The best instance of a group (rules.OPEN_FIRST): the accept funnel takes the first entry
            # instead of sorting a project's instances for every message.
            models.Index(
                F("project"),
                ExpressionWrapper(~Q(connection_state=ConnectionState.OPEN), output_field=models.BooleanField()),
                F("priority"),
                F("id"),
                name="instance_best",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=~Q(token_salt=""), name="instance_token_salt_set"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_pilot_status(self) -> bool:
        return self.project_id is None

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.token_salt:
            # Made with an explicit empty salt (a form, a script): never a token anyone can derive.
            self.token_salt = new_token_salt()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from ..sending.policy import PolicyError, check_overrides

        try:
            self.send_policy = check_overrides(self.send_profile, self.send_policy or {})
        except PolicyError as exc:
            raise ValidationError({"send_policy": str(exc)}) from exc

    def set_connection_state(self, state: str) -> bool:
        """Record the state Evolution reports; True when it changed."""
        changed = Instance.objects.filter(pk=self.pk).exclude(connection_state=state).update(
            connection_state=state, state_changed_at=timezone.now()
        )
        if changed:
            self.connection_state = state
        return bool(changed)


class OptIn(models.Model):
    """A recipient's transactional consent for one project, in one environment (the sandbox rule,
    docs/security.md: a TEST key records and revokes TEST consents, which only TEST sends rely on).
    Revocation keeps the row (history)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="opt_ins")
    environment = models.CharField(max_length=4, choices=Environment.choices, default=Environment.LIVE)
    phone = models.CharField(max_length=20)
    source = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=40, blank=True, default="")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=40, blank=True, default="")
    # How the consent ended: `api` (DELETE /v1/opt-ins), `inbound_keyword` (the recipient wrote an
    # opt-out keyword: messaging.opt_outs), `admin`; and what showed it (`inbox:<inbox event id>`), so
    # that an opt_in.revoked callback and a person can tell why.
    revoked_source = models.CharField(max_length=40, blank=True, default="")
    revoked_reference = models.CharField(max_length=80, blank=True, default="")

    objects = ProjectScopedQuerySet.as_manager()

    class Meta:
        indexes = [
            # callbacks.derive_events: the revocations in time order, without reading every live consent.
            models.Index(fields=["revoked_at"], name="optin_revoked", condition=Q(revoked_at__isnull=False)),
            # messaging.opt_outs: an opt-out written to a shared instance ends every project's live consent for
            # the number (docs/security.md, "Consent").
            models.Index(fields=["phone"], name="optin_live_phone", condition=Q(revoked_at__isnull=True)),
        ]
        constraints = [
            # One live consent per recipient and environment; rules.check_opt_in queries through it.
            models.UniqueConstraint(
                fields=["project", "environment", "phone"],
                condition=Q(revoked_at__isnull=True),
                name="one_live_opt_in_per_phone",
            )
        ]


class Contact(models.Model):
    """The last exchange of one number (instance) with one recipient, either way: a recipient it never exchanged a
    message with is a cold contact (its daily quota), and the project's instance that last exchanged with a
    recipient sends to them first (the sticky sender). docs/sending-policy.md."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="contacts", db_index=False)
    phone = models.CharField(max_length=20)
    last_exchange_at = models.DateTimeField()
    last_direction = models.CharField(max_length=8)  # inbound | outbound

    class Meta:
        constraints = [models.UniqueConstraint(fields=["instance", "phone"], name="contact_once")]
        indexes = [models.Index(fields=["phone", "-last_exchange_at"], name="contact_by_phone")]
