"""What operators see of secrets: Airflow 3.3.2's secrets masker rules, in one place (issue 26).

Airflow hides the value of a key that *names* a secret (`should_hide_value_for_key`): the key is
stripped, lower-cased, every run of non-word characters becomes `_`, and it is sensitive when
one of `SENSITIVE_FIELDS` is a substring of it (`"X-Api-Key"` -> `x_api_key` holds `api_key`).
`redact` walks a JSON value at any depth, as Airflow's `_redact` does: the value under a
sensitive key is masked whole (its strings become `MASK`, containers keep their shape), every
other dict and list is walked for deeper sensitive keys. One rule is stricter than Airflow's:
numbers and booleans under a sensitive key are masked too (Airflow shows `{"password": 1234}`).

Used for every answer an operator reads: the admin (list and change pages) and the public API,
for a Connection's `password` and `extra` and a Variable whose key (or a key inside its JSON
value) names a secret. The worker API returns real values to running tasks, as Airflow's does.
`tests/compat/test_masking_words.py` checks `SENSITIVE_FIELDS` against Airflow's own list.
"""

import json
import re
from typing import Any
from urllib.parse import urlsplit

# Airflow 3.3.2's `airflow._shared.secrets_masker.DEFAULT_SENSITIVE_FIELDS`, word for word.
SENSITIVE_FIELDS = frozenset(
    {
        "access_key",
        "access_token",
        "api_key",
        "apikey",
        "auth_header",
        "authorization",
        "bearer",
        "connection_string",
        "dsn",
        "passphrase",
        "passwd",
        "password",
        "private_key",
        "proxy",
        "proxy_password",
        "proxies",
        "secret",
        "service_account",
        "service_key",
        "token",
        "keyfile_dict",
        "webhook_url",
    }
)
MASK = "***"

_NON_WORD = re.compile(r"\W+")


def is_sensitive(name: Any) -> bool:
    """Airflow's `should_hide_value_for_key`: does the key `name` name a secret?"""
    if not isinstance(name, str):
        return False
    normalized = _NON_WORD.sub("_", name.strip().lower())
    return any(word in normalized for word in SENSITIVE_FIELDS)


def redact(value: Any, name: str | None = None) -> Any:
    """`value` (a JSON value) with every value under a sensitive key masked, at any depth;
    `name` is the key `value` is stored under (a Variable's key). Iterative, so a value nested
    deeper than Python's recursion limit is masked too. Returns a new value."""
    root: list[Any] = [value]
    # (container, index or key, the value there, is it under a sensitive key)
    stack: list[tuple[Any, Any, Any, bool]] = [(root, 0, value, is_sensitive(name))]
    while stack:
        parent, slot, node, hidden = stack.pop()
        if isinstance(node, dict):
            copy: dict[Any, Any] = {}
            parent[slot] = copy
            for key, child in node.items():
                copy[key] = child
                stack.append((copy, key, child, hidden or is_sensitive(key)))
        elif isinstance(node, list | tuple):
            items = list(node)
            parent[slot] = items
            stack.extend((items, i, child, hidden) for i, child in enumerate(items))
        elif hidden and node is not None:
            parent[slot] = MASK
    return root[0]


# Airflow's `SecretsMasker.MAX_RECURSION_DEPTH`: below it `merge` restores any `MASK` string.
MERGE_MAX_DEPTH = 5


def merge(new: Any, old: Any, name: str | None = None, *, _depth: int = 0, _hidden: bool = False):
    """Airflow 3.3.2's `secrets_masker.merge`: a value an operator sent back after reading it
    masked (`new`), with the stored value (`old`) put back wherever `new` still holds `MASK`
    under a sensitive key (`name` is the key `new` is stored under). Dicts merge key by key (a
    key `old` lacks is taken from `new`), lists item by item of the same kind, anything else is
    `new`. Deeper than `MERGE_MAX_DEPTH`, a `MASK` string is restored whatever its key."""
    if _depth > MERGE_MAX_DEPTH:
        return old if new == MASK else new
    hidden = _hidden or is_sensitive(name)
    if isinstance(new, dict) and isinstance(old, dict):
        return {
            key: (
                merge(value, old[key], None if hidden else key, _depth=_depth + 1, _hidden=hidden)
                if key in old
                else value
            )
            for key, value in new.items()
        }
    if isinstance(new, list) and isinstance(old, list):
        merged = []
        for i, item in enumerate(new):
            if i >= len(old):
                merged.append(item)
            elif hidden and item == MASK:
                merged.append(old[i])
            else:
                merged.append(merge(item, old[i], None, _depth=_depth + 1, _hidden=hidden))
        return merged
    if hidden and new == MASK:
        return old
    return new


def masked_password(password: str | None) -> str | None:
    """A Connection's password as operators see it: `MASK` when one is set."""
    return MASK if password else password


def url_without_password(url: str) -> str:
    """A URL with its password shown as `***` (`amqp://user:***@host/vhost`): what the audit
    trail and error messages show of a broker URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    auth, _, host = rest.rpartition("@")
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def masked_url(url: str) -> str:
    """What a viewer sees of a URL that may carry secrets (a webhook's, issue 38): its scheme,
    user, host and port; the userinfo's password, the path, the query and the fragment as
    `***` (a Slack-style URL holds its token in the path, others in `?token=`)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        host += f":{port}"
    user = ""
    if parts.username is not None:
        user = f"{parts.username}:{MASK}@" if parts.password is not None else f"{parts.username}@"
    path = parts.path if parts.path in ("", "/") else f"/{MASK}"
    query = f"?{MASK}" if parts.query else ""
    fragment = f"#{MASK}" if parts.fragment else ""
    return f"{parts.scheme}://{user}{host}{path}{query}{fragment}"


def masked_extra(extra: str | None) -> str | None:
    """A Connection's `extra` (JSON text) with its sensitive keys masked at any depth; text that
    is not JSON is masked whole (Airflow refuses to show it: it could hold anything)."""
    if not extra:
        return extra
    try:
        data = json.loads(extra)
    except ValueError:
        return MASK
    except RecursionError:  # too deep to read: fail closed
        return MASK
    return _changed_text(extra, data, redact(data))


def masked_variable(key: str, value: str | None) -> str | None:
    """A Variable's value as operators see it (Airflow's `VariableResponse.redact_val`): JSON
    text is redacted inside (a sensitive key masks it whole), other text is masked when `key`
    names a secret. An unchanged value is returned as it was stored."""
    if value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return MASK if is_sensitive(key) else value
    except RecursionError:  # too deep to read: fail closed
        return MASK
    return _changed_text(value, data, redact(data, key))


def _changed_text(text: str, data: Any, redacted: Any) -> str:
    """`text` when masking changed nothing, else the masked value as JSON; a value nested too
    deep to compare or write out (a RecursionError near Python's limit) is masked whole."""
    try:
        return text if redacted == data else json.dumps(redacted)
    except RecursionError:
        return MASK
