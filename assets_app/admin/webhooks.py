"""Events out (issue 29): webhook endpoints (pause / resume, rotate the secret), the messages
owed to them with each attempt (replay one, a selection, or a time range: filter by date, then
select all), and freshness policies.

An endpoint's secret is never shown but once, in the message after it is made (creation or a
rotation); it is stored encrypted. Saving goes through `webhooks`, which checks the URL with
the SSRF guard."""

from django import forms
from django.contrib import admin, messages

from ..events_out import delivery as webhook_delivery
from ..events_out import egress, freshness, webhooks
from ..guards import exceptions, masking
from ..models import (
    FreshnessPolicy,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEventType,
    WebhookSubscription,
)
from .base import LinkTableAdmin, ReadOnlyAdmin, actor_of


class EndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    subscriptions_text = forms.CharField(
        label="Subscriptions",
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text=(
            "One per line: an event type and an optional glob over the asset name or dag_id "
            f"(default *). Event types: {', '.join(WebhookEventType.values)}."
        ),
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("url", "description", "max_in_flight")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["subscriptions_text"].initial = "\n".join(
                f"{s.event_type} {s.pattern}" for s in self.instance.subscriptions.all()
            )

    def clean_url(self):
        url = self.cleaned_data["url"]
        try:
            egress.check_url(url)
        except egress.EgressRefused as exc:
            raise forms.ValidationError(exc.message) from exc
        return url

    def clean_subscriptions_text(self):
        specs = []
        for line in self.cleaned_data["subscriptions_text"].splitlines():
            words = line.split()
            if not words:
                continue
            if words[0] not in WebhookEventType.values or len(words) > 2:
                raise forms.ValidationError(f"not 'event_type [pattern]': {line!r}")
            specs.append(webhooks.SubscriptionSpec(*words))
        if not specs:
            raise forms.ValidationError("at least one subscription")
        return specs


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = EndpointForm
    list_display = ("id", "url", "state", "max_in_flight", "created_at")
    list_filter = ("state",)
    search_fields = ("url", "description")
    readonly_fields = ("state", "state_reason", "previous_secret_expires_at", "created_at")
    actions = ("pause", "resume", "rotate_secret")

    # Issue 38: a URL may carry a token (userinfo, path, query). Who may change endpoints sees
    # it whole; a view-only operator sees `masking.masked_url` and cannot search on it.
    def _whole_urls(self, request) -> bool:
        return self.has_change_permission(request)

    def get_list_display(self, request):
        if self._whole_urls(request):
            return self.list_display

        @admin.display(description="url")
        def url(obj: WebhookEndpoint) -> str:
            return masking.masked_url(obj.url)

        return tuple(url if name == "url" else name for name in self.list_display)

    def get_search_fields(self, request):
        return self.search_fields if self._whole_urls(request) else ("description",)

    def get_fields(self, request, obj=None):
        url = "url" if obj is None or self._whole_urls(request) else "url_masked"
        fields = [url, "description", "max_in_flight", "subscriptions_text"]
        return [*fields, *self.readonly_fields] if obj else fields

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and not self._whole_urls(request):
            return ("url_masked", *self.readonly_fields)
        return self.readonly_fields

    @admin.display(description="url")
    def url_masked(self, obj: WebhookEndpoint) -> str:
        return masking.masked_url(obj.url)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Saving is `webhooks`' durable transaction, not the admin's atomic().
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            webhooks.update_endpoint(
                endpoint_id=obj.pk,
                url=data["url"],
                description=data["description"],
                subscriptions=data["subscriptions_text"],
                max_in_flight=data["max_in_flight"],
                actor=actor_of(request),
            )
            return
        saved = webhooks.create_endpoint(
            url=data["url"],
            subscriptions=data["subscriptions_text"],
            description=data["description"],
            max_in_flight=data["max_in_flight"],
            actor=actor_of(request),
        )
        obj.pk = saved.endpoint.pk
        messages.warning(request, f"Signing secret (shown once, copy it now): {saved.secret}")

    def save_related(self, request, form, formsets, change):
        pass  # subscriptions are saved by `webhooks` with the endpoint

    @admin.action(description="Pause the selected endpoints")
    def pause(self, request, queryset):
        n = webhook_delivery.pause(
            endpoint_ids=queryset.values_list("id", flat=True), actor=actor_of(request)
        )
        messages.success(request, f"Paused {n} endpoint(s); their messages wait.")

    @admin.action(description="Resume the selected endpoints (paused or disabled)")
    def resume(self, request, queryset):
        n = webhook_delivery.resume(
            endpoint_ids=queryset.values_list("id", flat=True), actor=actor_of(request)
        )
        messages.success(request, f"Resumed {n} endpoint(s).")

    @admin.action(description="Rotate the signing secret (the old one signs too for a day)")
    def rotate_secret(self, request, queryset):
        for endpoint_id in queryset.values_list("id", flat=True):
            saved = webhooks.rotate_secret(endpoint_id=endpoint_id, actor=actor_of(request))
            messages.warning(
                request, f"New secret of endpoint {endpoint_id} (shown once): {saved.secret}"
            )


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = ("attempted_at", "status_code", "error", "duration_ms", "next_attempt_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "message_id",
        "endpoint",
        "event_type",
        "state",
        "attempts",
        "last_status",
        "next_attempt_at",
        "created_at",
    )
    list_select_related = ("endpoint",)
    list_filter = ("state", "event_type", "endpoint")
    date_hierarchy = "created_at"
    search_fields = ("message_id",)
    readonly_fields = (
        "message_id",
        "endpoint",
        "event_type",
        "body",
        "state",
        "attempts",
        "next_attempt_at",
        "claimed_until",
        "last_status",
        "last_error",
        "created_at",
        "delivered_at",
    )
    inlines = (AttemptInline,)
    actions = ("replay",)

    @admin.action(description="Replay the selected messages (same webhook-id)")
    def replay(self, request, queryset):
        n = webhook_delivery.replay(
            delivery_ids=queryset.values_list("id", flat=True), actor=actor_of(request)
        )
        messages.success(request, f"{n} message(s) will be sent again.")


@admin.register(WebhookAttempt)
class WebhookAttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "delivery", "attempted_at", "status_code", "duration_ms")
    list_select_related = ("delivery",)


@admin.register(FreshnessPolicy)
class FreshnessPolicyAdmin(admin.ModelAdmin):
    list_display = ("asset", "kind", "interval_seconds", "cron", "timezone", "state", "due_at")
    list_select_related = ("asset",)
    list_filter = ("state", "kind")
    search_fields = ("asset__name",)
    raw_id_fields = ("asset",)
    readonly_fields = ("state", "state_since", "due_at", "last_evaluated_at", "created_at")

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Saving is `freshness`' durable transaction, not the admin's atomic().
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]

    def save_model(self, request, obj, form, change):
        """Through `freshness.set_policy`: its checks, a state that starts over, the audit."""
        try:
            saved = freshness.set_policy(
                asset=obj.asset,
                kind=obj.kind,
                interval_seconds=obj.interval_seconds,
                cron=obj.cron,
                tz=obj.timezone,
                actor=actor_of(request),
            )
        except exceptions.InvalidInput as exc:
            messages.error(request, f"Not saved: {exc}")
            return
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        freshness.delete_policy(policy_id=obj.pk, actor=actor_of(request))

    def delete_queryset(self, request, queryset):
        for policy_id in queryset.values_list("id", flat=True):
            freshness.delete_policy(policy_id=policy_id, actor=actor_of(request))


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(LinkTableAdmin):
    list_display = ("endpoint", "event_type", "pattern")
    list_select_related = ("endpoint",)
