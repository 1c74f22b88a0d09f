"""Human-in-the-loop requests (issue 42): what each waiting task asks, and the answer an
operator gives on its page (options, params input as JSON). The answer goes through
`task_state.hitl.respond`, as the public API's does: the same refusals (answered already,
not an assigned user, options not offered), the TI queued again with it, audited there with the
operator as actor. Answering needs `change_hitldetail`; reading `view_hitldetail`."""

from typing import Any

from django import forms
from django.contrib import admin, messages

from ..guards import exceptions
from ..models import HITLDetail
from ..task_state import hitl
from .base import actor_of
from .settings import DomainWritesAdmin


class AnswerForm(forms.ModelForm):
    """The answer: the request's own options (several when `multiple`), and `params_input`."""

    answer = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, required=True)
    answer_params = forms.JSONField(required=False, initial=dict, label="params input")

    class Meta:
        model = HITLDetail
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.instance.options or []
        answer = self.fields["answer"]
        assert isinstance(answer, forms.MultipleChoiceField)
        answer.choices = [(o, o) for o in options]
        if self.instance.response_received:
            self.fields["answer"].disabled = True
            self.fields["answer_params"].disabled = True
            self.fields["answer"].required = False


@admin.register(HITLDetail)
class HITLDetailAdmin(DomainWritesAdmin):
    form = AnswerForm
    list_display = ("subject", "dag", "run", "task", "ti_state", "response_received", "created_at")
    list_select_related = ("ti", "ti__dag_run")
    readonly_fields = (
        "dag",
        "run",
        "task",
        "ti_state",
        "subject",
        "body",
        "options",
        "defaults",
        "multiple",
        "params",
        "assignees",
        "created_at",
        "responded_at",
        "responded_by",
        "chosen_options",
        "params_input",
    )
    ordering = ("-created_at",)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Dag")
    def dag(self, obj: HITLDetail) -> str:
        return obj.ti.dag_id

    @admin.display(description="run")
    def run(self, obj: HITLDetail) -> str:
        return obj.ti.dag_run.run_id

    @admin.display(description="task")
    def task(self, obj: HITLDetail) -> str:
        return f"{obj.ti.task_id}[{obj.ti.map_index}]"

    @admin.display(description="TI state")
    def ti_state(self, obj: HITLDetail) -> str:
        return obj.ti.state

    @admin.display(boolean=True, description="answered")
    def response_received(self, obj: HITLDetail) -> bool:
        return obj.response_received

    def save_model(self, request, obj, form, change):
        if obj.response_received:
            return
        try:
            hitl.respond(
                dag_id=obj.ti.dag_id,
                run_id=obj.ti.dag_run.run_id,
                task_id=obj.ti.task_id,
                map_index=obj.ti.map_index,
                responder=hitl.Responder(id=str(request.user.pk), name=request.user.get_username()),
                chosen_options=list(form.cleaned_data["answer"]),
                params_input=form.cleaned_data.get("answer_params") or {},
                actor=actor_of(request),
            )
        except exceptions.DomainError as exc:
            self.message_user(request, f"Not answered: {exc.message}", messages.ERROR)
