"""Template filters of the operator admin pages."""

from django import template

from assets_app.admin import base
from assets_app.guards import limits

register = template.Library()


@register.filter
def compact_json(value) -> str:
    """`{"rows": 12}`: JSON on one line, keys sorted (escaped by the template as usual)."""
    return limits.display_json(value, indent=None, separators=(", ", ": "), default=str)


@register.filter
def state_badge(state) -> str:
    """A run or TI state as a coloured badge (`admin.base.STATE_COLOURS`; an unknown state, e.g.
    one added later, gets the neutral colour)."""
    return base.state_badge(state)


@register.filter
def state_colour(state) -> str:
    return base.state_colour(state)
