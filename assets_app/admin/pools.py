"""Pools (issue 39): their slots, and how many are running, claimed (Airflow's queued) and
open. Every write (save, delete, bulk delete) goes through `pools`, which checks Airflow's
rules (`default_pool` cannot be deleted; only its slots and include_deferred change), audits
with the operator as actor and runs its own durable transaction."""

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList

from ..models import DEFAULT_POOL_NAME, Pool
from ..runtime import pools
from .base import actor_of
from .settings import DomainWritesAdmin


class PoolForm(forms.ModelForm):
    class Meta:
        model = Pool
        fields = ("name", "slots", "description", "include_deferred")
        help_texts = {"slots": "-1: unlimited."}


class PoolChangeList(ChangeList):
    """The page's pools with their slot counts: one query for the page (`pools.with_slots`)."""

    def get_results(self, request):
        super().get_results(request)
        for counted in pools.with_slots(list(self.result_list)):
            counted.pool.counted = counted  # type: ignore[attr-defined]


@admin.register(Pool)
class PoolAdmin(DomainWritesAdmin):
    form = PoolForm
    list_display = ("name", "slots", "running", "claimed", "open", "include_deferred")
    search_fields = ("name", "description")

    def get_changelist(self, request, **kwargs):
        return PoolChangeList

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.name == DEFAULT_POOL_NAME:
            return ("name", "description")
        return ("name",) if obj else ()

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.name == DEFAULT_POOL_NAME:
            return False
        return super().has_delete_permission(request, obj)

    @admin.display(description="running slots")
    def running(self, obj: Pool) -> int:
        return obj.counted.running  # type: ignore[attr-defined]

    @admin.display(description="claimed slots")
    def claimed(self, obj: Pool) -> int:
        return obj.counted.queued  # type: ignore[attr-defined]

    @admin.display(description="open slots")
    def open(self, obj: Pool) -> str:
        found = obj.counted.open  # type: ignore[attr-defined]
        return "unlimited" if found is None else str(found)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            mask = ["slots", "include_deferred"]
            if obj.name != DEFAULT_POOL_NAME:
                mask.append("description")
            saved = pools.update_pool(
                name=obj.name, changes=data, update_mask=mask, actor=actor_of(request)
            )
        else:
            saved = pools.create_pool(
                name=data["name"],
                slots=data["slots"],
                description=data.get("description") or None,
                include_deferred=data.get("include_deferred", False),
                actor=actor_of(request),
            )
        obj.pk = saved.pool.pk
        obj.refresh_from_db()

    def delete_model(self, request, obj):
        pools.delete_pool(name=obj.name, actor=actor_of(request))

    def delete_queryset(self, request, queryset):
        for name in queryset.values_list("name", flat=True):
            pools.delete_pool(name=name, actor=actor_of(request))
