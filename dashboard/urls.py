from django.urls import path

from . import views

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("assets/<str:name>", views.asset, name="asset"),
    path("p/<int:project_id>/", views.overview_page, name="overview"),
    # allows POST (form with CSRF token): the TEST/LIVE mode switch
    path("p/<int:project_id>/environment", views.switch_environment, name="environment"),
    path("p/<int:project_id>/charts.json", views.charts_data, name="charts"),
    path("p/<int:project_id>/dead-letters/", views.dead_letter_list, name="dead_letters"),
    path("p/<int:project_id>/dead-letters/<int:dead_letter_id>/", views.dead_letter_detail, name="dead_letter"),
    # allows POST (form with CSRF token)
    path("p/<int:project_id>/dead-letters/<int:dead_letter_id>/resend", views.resend_one, name="resend"),
    # allows POST (form with CSRF token)
    path("p/<int:project_id>/dead-letters/<int:dead_letter_id>/dismiss", views.dismiss_one, name="dismiss"),
    # allows POST (form with CSRF token)
    path("p/<int:project_id>/dead-letters/bulk-resend", views.bulk_resend, name="bulk_resend"),
    path("p/<int:project_id>/bulk/<int:job_id>/", views.bulk_job, name="bulk_job"),
    path("p/<int:project_id>/bulk/<int:job_id>/progress.json", views.bulk_job_progress, name="bulk_job_progress"),
    path("p/<int:project_id>/messages/<uuid:message_id>/status.json", views.message_status, name="message_status"),
]
