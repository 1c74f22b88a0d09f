"""The Django app: registers the service's system checks when the apps are ready, and keeps
Airflow's `default_pool` after a migrate or flush."""

from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_migrate


def _ensure_default_pool(**_kwargs) -> None:
    """After migrate, and after a flush: Airflow's `default_pool` exists (`pools`)."""
    from .runtime import pools

    pools.ensure_default_pool()


class AssetsAppConfig(AppConfig):
    name = "assets_app"
    verbose_name = "Asset events"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .guards import checks as rules

        checks.register(rules.check_settings, "assets_app")
        checks.register(rules.check_keys, checks.Tags.security)
        checks.register(rules.check_deploy, checks.Tags.security, deploy=True)
        post_migrate.connect(_ensure_default_pool, sender=self)
