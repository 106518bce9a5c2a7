"""Row visibility in one place: a key or a member sees one project's rows (docs/api.md: others are 404), and
of those only one environment's (the sandbox rule, docs/security.md: a TEST key's world and a LIVE key's are
disjoint; the other environment's rows answer 404 too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models

if TYPE_CHECKING:
    from .models import Project


class ProjectScopedQuerySet(models.QuerySet[Any]):
    # Where a row's environment is read: its own column, or the column of the row it belongs to.
    environment_lookup = "environment"

    def for_scope(self, project: "Project", environment: str) -> "ProjectScopedQuerySet":
        """The rows one project's key (or member, in one dashboard mode) of this environment may see."""
        return self.filter(project=project, **{self.environment_lookup: environment})


class MessageQuerySet(ProjectScopedQuerySet):
    pass


class DeadLetterQuerySet(ProjectScopedQuerySet):
    # A dead letter is its message's: it has no environment of its own to disagree with.
    environment_lookup = "message__environment"
