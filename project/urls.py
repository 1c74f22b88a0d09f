from django.contrib import admin
from django.urls import path

from assets_app.api import execution_api, public_api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("execution/", execution_api.urls),
    path("api/v2/", public_api.urls),
]
