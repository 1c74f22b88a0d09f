"""Users and groups as Django's auth admin shows them, with every change to what they may do
audited (`operations.privileges`, issue 38): granting `add_dag` + `change_dag`, or superuser,
left no trace before."""

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group

from ..operations import privileges
from .base import actor_of

User = get_user_model()


class AuditedUserAdmin(UserAdmin):
    def save_model(self, request, obj, form, change):
        before = User.objects.filter(pk=obj.pk).first() if obj.pk else None
        request.privileges_before = privileges.of_user(before)
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        privileges.record_change(
            actor=actor_of(request),
            kind="user",
            name=form.instance.get_username(),
            before=getattr(request, "privileges_before", privileges.of_user(None)),
            after=privileges.of_user(form.instance),
        )


class AuditedGroupAdmin(GroupAdmin):
    def save_model(self, request, obj, form, change):
        before = Group.objects.filter(pk=obj.pk).first() if obj.pk else None
        request.privileges_before = privileges.of_group(before)
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        privileges.record_change(
            actor=actor_of(request),
            kind="group",
            name=form.instance.name,
            before=getattr(request, "privileges_before", privileges.of_group(None)),
            after=privileges.of_group(form.instance),
        )


for model, model_admin in ((User, AuditedUserAdmin), (Group, AuditedGroupAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
