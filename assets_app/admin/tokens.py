"""Public API tokens: created by `create_api_token` (the key is shown once), revoked here."""

from django.contrib import admin

from ..models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "created_at", "last_used_at")
    list_select_related = ("user",)
    search_fields = ("name", "user__username")
    readonly_fields = ("user", "name", "created_at", "last_used_at")
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
