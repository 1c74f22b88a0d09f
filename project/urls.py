from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from assets_app import views
from assets_app.admin import dashboard_view
from assets_app.admin.preferences import timezone_view
from assets_app.api import execution_api, login, public_api

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False), name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="asset_dashboard"),
    path("admin/timezone/", admin.site.admin_view(timezone_view), name="operator_timezone"),
    path("admin/", admin.site.urls),
    path("execution/", execution_api.urls),
    # Airflow's core API login routes, plain views (not in the ninja API: no permission applies).
    path("api/v2/auth/logout", login.logout, name="api_auth_logout"),
    path("api/v2/auth/login", login.login_page, name="api_auth_login"),
    path("api/v2/", public_api.urls),
    path("auth/token", login.token, name="auth_token"),
    path("auth/token/cli", login.token_cli, name="auth_token_cli"),
    path("auth/token/login", login.token_login, name="auth_token_login"),
    path("metrics", views.metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
]

# A database full or away is a 503 with Retry-After wherever it surfaces (assets_app/views.py).
handler500 = "assets_app.views.server_error"
