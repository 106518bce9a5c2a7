from django.urls import path

from . import views

urlpatterns = [
    # allows GET, POST /v1/webhook-endpoints
    path("webhook-endpoints", views.EndpointListView.as_view(), name="api-webhook-endpoints"),
    # allows GET, PATCH, DELETE /v1/webhook-endpoints/{id}
    path("webhook-endpoints/<uuid:endpoint_id>", views.EndpointDetailView.as_view(), name="api-webhook-endpoint"),
    # allows POST /v1/webhook-endpoints/{id}/rotate-secret
    path("webhook-endpoints/<uuid:endpoint_id>/rotate-secret", views.RotateSecretView.as_view(), name="api-webhook-rotate"),
    # allows GET /v1/webhook-endpoints/{id}/deliveries
    path("webhook-endpoints/<uuid:endpoint_id>/deliveries", views.EndpointDeliveriesView.as_view(), name="api-webhook-deliveries"),
    # allows POST /v1/webhook-endpoints/{id}/replay-failed
    path("webhook-endpoints/<uuid:endpoint_id>/replay-failed", views.ReplayFailedView.as_view(), name="api-webhook-replay-failed"),
    # allows POST /v1/webhook-deliveries/{id}/replay
    path("webhook-deliveries/<uuid:delivery_id>/replay", views.DeliveryReplayView.as_view(), name="api-webhook-replay"),
]
