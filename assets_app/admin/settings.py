"""Variables, Connections and XComs: what tasks read and write at run time.

A Connection's password is never shown: the form's password box is empty and keeps the stored
one when left empty; its extra is shown with sensitive-looking keys masked and replaced only
when a new one is typed. Saving goes through `variables`, which encrypts both.
"""

from django import forms
from django.contrib import admin, messages

from .. import encryption, variables
from ..models import Connection, RenderedTaskFields, TaskReschedule, Variable, XCom
from .base import ReadOnlyAdmin


@admin.register(Variable)
class VariableAdmin(admin.ModelAdmin):
    list_display = ("key", "val", "description")
    search_fields = ("key", "description")
    fields = ("key", "val", "description")


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
class ConnectionAdmin(admin.ModelAdmin):
    form = ConnectionForm
    list_display = ("conn_id", "conn_type", "host", "login", "has_password", "extra_masked")
    search_fields = ("conn_id", "host", "description")
    readonly_fields = ("extra_masked",)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Without the admin's own atomic(): saving is `variables`' durable transaction.
        # Django's changeform_view is atomic() around this private method (no public hook).
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]

    def get_fields(self, request, obj=None):
        fields = [*ConnectionForm.Meta.fields, "new_password", "clear_password", "new_extra"]
        return [*fields, "extra_masked"] if obj else fields

    @admin.display(boolean=True, description="password")
    def has_password(self, obj: Connection) -> bool:
        return bool(obj.password)

    @admin.display(description="stored extra (masked)")
    def extra_masked(self, obj: Connection) -> str:
        try:
            return variables.masked_extra(encryption.decrypt(obj.extra)) or "-"
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
                saved = variables.update_connection(conn_id=obj.conn_id, changes=changes)
            else:
                saved = variables.save_connection(
                    conn_id=data["conn_id"],
                    create=True,
                    password=data.get("new_password") or None,
                    extra=data.get("new_extra") or None,
                    **plain,
                )
        except encryption.SecretsUnreadable as exc:
            messages.error(request, exc.message)
            return
        obj.pk = saved.pk
        obj.refresh_from_db()


@admin.register(XCom)
class XComAdmin(ReadOnlyAdmin):
    list_display = ("dag_id", "run_id", "task_id", "map_index", "key", "value", "timestamp")
    list_filter = ("dag_id",)
    search_fields = ("dag_id", "run_id", "task_id", "key")


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
