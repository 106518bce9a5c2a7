"""Row visibility in one place: a project only ever sees its own rows (contract §3: others are 404)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models

if TYPE_CHECKING:
    from .models import Project


class ProjectScopedQuerySet(models.QuerySet[Any]):
    def for_project(self, project: "Project") -> "ProjectScopedQuerySet":
        return self.filter(project=project)


class MessageQuerySet(ProjectScopedQuerySet):
    pass
