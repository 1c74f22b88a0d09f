from django.apps import AppConfig


class AssetsAppConfig(AppConfig):
    name = "assets_app"
    verbose_name = "Asset events"
    default_auto_field = "django.db.models.BigAutoField"
