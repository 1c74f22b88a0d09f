from django.contrib import admin
from django.urls import path

from assets_app import views
from assets_app.admin import dashboard_view
from assets_app.api import execution_api, public_api

urlpatterns = [
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="asset_dashboard"),
    path("admin/", admin.site.urls),
    path("execution/", execution_api.urls),
    path("api/v2/", public_api.urls),
    path("metrics", views.metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
]
