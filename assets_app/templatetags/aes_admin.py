"""Template filters of the operator admin pages."""

import json

from django import template

register = template.Library()


@register.filter
def compact_json(value) -> str:
    """`{"rows": 12}`: JSON on one line, keys sorted (escaped by the template as usual)."""
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)
