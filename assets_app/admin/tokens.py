"""Public API tokens: created by `create_api_token` (the key is shown once), revoked here; and
the login tokens logged out (`GET /api/v2/auth/logout`), read-only."""

from django.contrib import admin

from ..models import ApiToken, RevokedToken


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


@admin.register(RevokedToken)
class RevokedTokenAdmin(admin.ModelAdmin):
    """Login tokens (JWTs) ended by a logout, each kept until its expiry: written only by
    `operations.logins.log_out`."""

    list_display = ("jti", "exp")
    search_fields = ("jti",)
    readonly_fields = ("jti", "exp")
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
