"""The Django app: registers the service's system checks when the apps are ready."""

from django.apps import AppConfig
from django.core import checks


class AssetsAppConfig(AppConfig):
    name = "assets_app"
    verbose_name = "Asset events"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .guards import checks as rules

        checks.register(rules.check_settings, "assets_app")
        checks.register(rules.check_keys, checks.Tags.security)
        checks.register(rules.check_deploy, checks.Tags.security, deploy=True)
