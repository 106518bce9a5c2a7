from django.urls import path

from . import views

urlpatterns = [
    # allows POST /v1/messages/send
    path("messages/send", views.SendMessageView.as_view(), name="api-send"),
    # allows GET /v1/messages
    path("messages", views.MessageListView.as_view(), name="api-messages"),
    # allows GET /v1/messages/{id}
    path("messages/<uuid:message_id>", views.MessageDetailView.as_view(), name="api-message"),
    # allows GET /v1/instances
    path("instances", views.InstanceListView.as_view(), name="api-instances"),
    # allows POST /v1/opt-ins
    path("opt-ins", views.OptInListView.as_view(), name="api-opt-ins"),
    # allows DELETE /v1/opt-ins/{phone}
    path("opt-ins/<str:phone>", views.OptInDetailView.as_view(), name="api-opt-in"),
]
