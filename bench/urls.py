"""The product's URLs plus the baseline view (loaded only by bench.settings)."""

from django.urls import path

from bench.baseline.views import BareInsertView
from pilot_status.urls import urlpatterns as product_urlpatterns

urlpatterns = [
    *product_urlpatterns,
    # allows POST /bench/baseline/insert: the bare DRF insert that B1 and B5 are compared with
    path("bench/baseline/insert", BareInsertView.as_view()),
]
