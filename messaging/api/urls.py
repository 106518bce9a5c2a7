from django.urls import path

from . import dead_letters, instances, timeline, views

urlpatterns = [
    # allows POST /v1/messages/send
    path("messages/send", views.SendMessageView.as_view(), name="api-send"),
    # allows GET /v1/messages
    path("messages", views.MessageListView.as_view(), name="api-messages"),
    # allows GET /v1/messages/{id}
    path("messages/<uuid:message_id>", views.MessageDetailView.as_view(), name="api-message"),
    # allows GET /v1/messages/{id}/events
    path("messages/<uuid:message_id>/events", timeline.MessageEventsView.as_view(), name="api-message-events"),
    # allows GET /v1/instances
    path("instances", instances.InstanceListView.as_view(), name="api-instances"),
    # allows PATCH /v1/instances/{name}
    path("instances/<str:name>", instances.InstanceDetailView.as_view(), name="api-instance"),
    # allows POST /v1/opt-ins
    path("opt-ins", views.OptInListView.as_view(), name="api-opt-ins"),
    # allows DELETE /v1/opt-ins/{phone}
    path("opt-ins/<str:phone>", views.OptInDetailView.as_view(), name="api-opt-in"),
    # allows GET /v1/dead-letters
    path("dead-letters", dead_letters.DeadLetterListView.as_view(), name="api-dead-letters"),
    # allows POST /v1/dead-letters/{id}/resend
    path("dead-letters/<int:dead_letter_id>/resend", dead_letters.DeadLetterResendView.as_view(), name="api-dead-letter-resend"),
    # allows POST /v1/dead-letters/{id}/dismiss
    path("dead-letters/<int:dead_letter_id>/dismiss", dead_letters.DeadLetterDismissView.as_view(), name="api-dead-letter-dismiss"),
]
