"""Variables, Connections, XComs and state store keys: what tasks read and write at run time.

What a page shows is masked as Airflow's secrets masker does it (`masking`): a Connection's
password is never shown (the form's password box is empty and keeps the stored one when left
empty) and its extra is shown with sensitive keys masked at any depth, replaced only when a new
one is typed; a Variable whose key (or a key inside its JSON value) names a secret is shown
masked in the list and on its page, and saving the masked text back keeps the stored value.
Every write (save, delete, bulk delete) goes through `variables`, which encrypts, audits with
the operator as actor, and runs its own durable transaction (so these pages skip the admin's
atomic()).
"""

from django import forms
from django.contrib import admin, messages

from ..guards import encryption, masking
from ..models import (
    AssetStateStore,
    Connection,
    RenderedTaskFields,
    TaskReschedule,
    TaskStateStore,
    Variable,
    XCom,
)
from ..runtime import variables
from .base import EstimatedCountMixin, ReadOnlyAdmin, actor_of, dag_id_filter


class DomainWritesAdmin(admin.ModelAdmin):
    """Saving and deleting go through a domain function's own durable transaction: without the
    admin's own atomic() (Django wraps these views in it around private methods, no public
    hook)."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]

    def delete_view(self, request, object_id, extra_context=None):
        return self._delete_view(request, object_id, extra_context)  # type: ignore[attr-defined]


class VariableForm(forms.ModelForm):
    class Meta:
        model = Variable
        fields = ("key", "val", "description")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            clear = variables.value_of(self.instance)
            shown = masking.masked_variable(self.instance.key, clear)
            self.shown_val = shown
            self.initial["val"] = shown
            if shown != clear:
                self.fields["val"].help_text = (
                    "Shown masked: its key or a key inside it names a secret. Submit it "
                    "unchanged to keep the stored value."
                )


@admin.register(Variable)
class VariableAdmin(DomainWritesAdmin):
    form = VariableForm
    list_display = ("key", "value_masked", "description")
    search_fields = ("key", "description")

    def get_readonly_fields(self, request, obj=None):
        return ("key",) if obj else ()

    @admin.display(description="value")
    def value_masked(self, obj: Variable) -> str | None:
        try:
            return masking.masked_variable(obj.key, variables.value_of(obj))
        except encryption.SecretsUnreadable as exc:
            return f"cannot decrypt: {exc.message}"

    def lookup_allowed(self, lookup, value, request=None):
        # The value is a secret (stored encrypted): no filtering on it from the query string.
        if lookup.split("__")[0] in ("val", "is_encrypted"):
            return False
        return super().lookup_allowed(lookup, value, request)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        value = data.get("val")
        if change and value == getattr(form, "shown_val", None):
            # The masked text came back unchanged: keep the stored value.
            value = variables.value_of(Variable.objects.get(pk=obj.pk))
        if change:
            saved = variables.update_variable(
                key=obj.key,
                changes={"value": value, "description": data.get("description")},
                actor=actor_of(request),
            )
        else:
            saved = variables.create_variable(
                key=data["key"],
                value=value,
                description=data.get("description"),
                actor=actor_of(request),
            )
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request, obj):
        variables.delete_variable(key=obj.key, actor=actor_of(request))

    def delete_queryset(self, request, queryset):
        for key in queryset.values_list("key", flat=True):
            variables.delete_variable(key=key, actor=actor_of(request))


class ConnectionForm(forms.ModelForm):
    new_password = forms.CharField(
        label="Password",
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the stored password (stored encrypted).",
    )
    new_extra = forms.CharField(
        label="Extra",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="JSON; leave empty to keep the stored extra (stored encrypted).",
    )
    clear_password = forms.BooleanField(label="Remove the password", required=False)

    class Meta:
        model = Connection
        fields = ("conn_id", "conn_type", "description", "host", "schema", "login", "port")


@admin.register(Connection)
class ConnectionAdmin(DomainWritesAdmin):
    form = ConnectionForm
    list_display = ("conn_id", "conn_type", "host", "login", "has_password", "extra_masked")
    search_fields = ("conn_id", "host", "description")

    def get_readonly_fields(self, request, obj=None):
        # The id is what a save updates by (and what tasks name), so it is fixed once created.
        return ("conn_id", "extra_masked") if obj else ("extra_masked",)

    def get_fields(self, request, obj=None):
        fields = [*ConnectionForm.Meta.fields, "new_password", "clear_password", "new_extra"]
        return [*fields, "extra_masked"] if obj else fields

    @admin.display(boolean=True, description="password")
    def has_password(self, obj: Connection) -> bool:
        return bool(obj.password)

    @admin.display(description="stored extra (masked)")
    def extra_masked(self, obj: Connection) -> str:
        try:
            return masking.masked_extra(encryption.decrypt(obj.extra)) or "-"
        except encryption.SecretsUnreadable as exc:
            return f"cannot decrypt: {exc.message}"

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        plain = {name: data.get(name) for name in variables.CONNECTION_FIELDS}
        try:
            if change:
                changes = dict(plain)
                if data.get("clear_password"):
                    changes["password"] = None
                elif data.get("new_password"):
                    changes["password"] = data["new_password"]
                if data.get("new_extra"):
                    changes["extra"] = data["new_extra"]
                saved = variables.update_connection(
                    conn_id=obj.conn_id, changes=changes, actor=actor_of(request)
                )
            else:
                saved = variables.save_connection(
                    conn_id=data["conn_id"],
                    create=True,
                    password=data.get("new_password") or None,
                    extra=data.get("new_extra") or None,
                    actor=actor_of(request),
                    **plain,
                )
        except encryption.SecretsUnreadable as exc:
            messages.error(request, exc.message)
            return
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request, obj):
        variables.delete_connection(conn_id=obj.conn_id, actor=actor_of(request))

    def delete_queryset(self, request, queryset):
        for conn_id in queryset.values_list("conn_id", flat=True):
            variables.delete_connection(conn_id=conn_id, actor=actor_of(request))


@admin.register(XCom)
class XComAdmin(EstimatedCountMixin, ReadOnlyAdmin):
    list_display = ("dag_id", "run_id", "task_id", "map_index", "key", "value", "timestamp")
    list_filter = (dag_id_filter("dag_id", "dag id"),)
    search_fields = ("dag_id", "run_id", "task_id", "key")


@admin.register(TaskStateStore)
class TaskStateStoreAdmin(ReadOnlyAdmin):
    """A task's state keys (AIP-103), read-only: a task writes them, the public API edits them."""

    list_display = (
        "dag_id",
        "run_id",
        "task_id",
        "map_index",
        "key",
        "value",
        "updated_at",
        "expires_at",
    )
    list_filter = ("dag_id",)
    search_fields = ("dag_id", "run_id", "task_id", "key")


@admin.register(AssetStateStore)
class AssetStateStoreAdmin(ReadOnlyAdmin):
    """An asset's state keys (AIP-103) and who last wrote each, read-only."""

    list_display = (
        "asset",
        "key",
        "value",
        "updated_at",
        "last_updated_by_kind",
        "last_updated_by_dag_id",
        "last_updated_by_run_id",
        "last_updated_by_task_id",
    )
    list_select_related = ("asset",)
    search_fields = ("asset__name", "key")


@admin.register(TaskReschedule)
class TaskRescheduleAdmin(ReadOnlyAdmin):
    list_display = ("ti", "try_number", "start_date", "reschedule_date")
    list_select_related = ("ti",)
    search_fields = ("ti__dag_id", "ti__task_id")


@admin.register(RenderedTaskFields)
class RenderedTaskFieldsAdmin(ReadOnlyAdmin):
    list_display = ("ti", "updated_at")
    list_select_related = ("ti",)
    search_fields = ("ti__dag_id", "ti__task_id")
