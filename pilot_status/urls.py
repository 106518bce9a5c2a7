from django.contrib import admin
from django.contrib.auth import views as auth_views
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
    # Customer dashboard (Django auth; members of a project only)
    path(
        "dashboard/login/",
        auth_views.LoginView.as_view(template_name="dashboard/login.html", redirect_authenticated_user=True),
        name="login",
    ),
    # allows POST /dashboard/logout/ (Django 5 logs out on POST only)
    path("dashboard/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("dashboard/", include("dashboard.urls")),
]

urlpatterns += [
    # allows GET /api/internal/metrics (JSON) and /api/internal/metrics/prometheus (text);
    # both need the x-internal-webhook-secret header.
    path("api/internal/metrics", ingestion_views.metrics_json, name="internal-metrics"),
    path("api/internal/metrics/prometheus", ingestion_views.metrics_prometheus, name="internal-metrics-prometheus"),
]
