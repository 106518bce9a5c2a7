from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from callbacks import dashboard as callbacks_dashboard
from ingestion.urls import urlpatterns as internal_urlpatterns
from pilot_status import scrape

urlpatterns = [
    path("v1/schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="schema"),
    path(
        "v1/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", authentication_classes=[], permission_classes=[]),
        name="docs",
    ),
    path("v1/", include("messaging.api.urls")),
    path("v1/", include("callbacks.api.urls")),
    # Evolution's webhook and the counters (ingestion/urls.py); the webhook pool serves only these.
    *internal_urlpatterns,
    # allows GET /metrics: Prometheus's scrape, Authorization: Bearer <METRICS_TOKEN> (pilot_status/scrape.py)
    path("metrics", scrape.scrape, name="metrics"),
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
    # The dashboard's webhooks page (callbacks/dashboard.py): endpoints, recent attempts, replays.
    path("dashboard/p/<int:project_id>/webhooks/", callbacks_dashboard.webhooks, name="callbacks-webhooks"),
    # allows POST (form with CSRF token)
    path("dashboard/p/<int:project_id>/webhooks/deliveries/<uuid:delivery_id>/replay", callbacks_dashboard.replay_one,
         name="callbacks-replay"),
    # allows POST (form with CSRF token)
    path("dashboard/p/<int:project_id>/webhooks/<uuid:endpoint_id>/replay-failed", callbacks_dashboard.replay_failed,
         name="callbacks-replay-failed"),
]

