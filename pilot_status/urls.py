from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from ingestion import views as ingestion_views

urlpatterns = [
    path("v1/schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="schema"),
    path(
        "v1/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", authentication_classes=[], permission_classes=[]),
        name="docs",
    ),
    path("v1/", include("messaging.api.urls")),
    # allows POST /api/internal/webhook and Evolution's by-events form /api/internal/webhook/<event>
    path("api/internal/webhook", ingestion_views.webhook, name="evolution-webhook"),
    re_path(r"^api/internal/webhook/(?P<event_suffix>[a-z0-9-]+)/?$", ingestion_views.webhook),
    path("admin/", admin.site.urls),
]
