"""Assets and aliases (DESIGN 2): what tasks produce and Dags wait on, and the assets an alias
resolved to."""

from django.db import models

from ..guards.limits import StoredJsonDecoder

# Airflow allows 1500 characters for an asset's name and uri; a btree index on them still fits.
ASSET_KEY_MAX_LENGTH = 1500


class Asset(models.Model):
    """A named piece of data a task produces. `name` and `uri` are each unique."""

    name = models.CharField(max_length=ASSET_KEY_MAX_LENGTH, unique=True)
    uri = models.CharField(max_length=ASSET_KEY_MAX_LENGTH, unique=True)
    group = models.CharField(max_length=ASSET_KEY_MAX_LENGTH, default="asset")
    extra = models.JSONField(decoder=StoredJsonDecoder, default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(name=""), name="asset_name_not_empty"),
            models.CheckConstraint(condition=~models.Q(uri=""), name="asset_uri_not_empty"),
        ]

    def __str__(self) -> str:
        return self.name if self.name == self.uri else f"{self.name} ({self.uri})"


class AssetAlias(models.Model):
    """A name a task may emit through at run time; resolves to the assets linked to it."""

    name = models.CharField(max_length=ASSET_KEY_MAX_LENGTH, unique=True)
    group = models.CharField(max_length=ASSET_KEY_MAX_LENGTH, default="asset")
    assets = models.ManyToManyField(
        Asset, through="AssetAliasAsset", related_name="aliases", blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "asset aliases"
        constraints = [
            models.CheckConstraint(condition=~models.Q(name=""), name="asset_alias_name_not_empty"),
        ]

    def __str__(self) -> str:
        return self.name


class AssetAliasAsset(models.Model):
    """alias -> asset link; grows as events are emitted through the alias. Append-only."""

    alias = models.ForeignKey(AssetAlias, on_delete=models.CASCADE, related_name="asset_links")
    asset = models.ForeignKey(Asset, on_delete=models.CASCADE, related_name="alias_links")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["alias", "asset"], name="alias_asset_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.alias_id} -> {self.asset_id}"
