"""Issue 26: our masking (`assets_app.guards.masking`) follows Airflow 3.3.2's secrets masker,
checked against Airflow's own code in the Task SDK's virtualenv so the two cannot drift: the word
list (`DEFAULT_SENSITIVE_FIELDS`) is the same set, and Airflow's `redact` gives the same answer as
ours for every value of a corpus (string leaves; under a sensitive key we also mask numbers, which
Airflow leaves, see the module docstring)."""

import json
import subprocess

from assets_app.guards import masking
from tests.compat.airflow_worker_env import sdk_python

_AIRFLOW = r"""
import json, sys
from airflow._shared.secrets_masker import DEFAULT_SENSITIVE_FIELDS, _secrets_masker, merge, redact
# What airflow.settings._configure_secrets_masker does with no extra configured names.
_secrets_masker().sensitive_variables_fields = list(DEFAULT_SENSITIVE_FIELDS)
corpus, merges = json.load(sys.stdin)
print(json.dumps({
    "words": sorted(DEFAULT_SENSITIVE_FIELDS),
    "redacted": [redact(value, name) for name, value in corpus],
    "merged": [merge(new, old, name) for name, new, old in merges],
}))
"""

CORPUS = [
    (None, {"password": "p", "host": "h"}),
    (None, {"a": {"b": {"c": {"passwd": "p", "keep": "k"}}}}),
    (None, {"headers": [{"Authorization": "Bearer t"}, {"X-Api-Key": "k"}], "n": 1}),
    (None, {"private_key": {"pem": "-----BEGIN", "parts": ["x", "y"]}}),
    (None, {"AWS_ACCESS_KEY": "a", "Client Secret": "s", "my-token ": "t", "tokenizer": "x"}),
    (None, {"proxies": {"http": "u"}, "dsn": "d", "webhook_url": "w", "keyfile_dict": "{}"}),
    (None, [{"connection_string": "c"}, ["bearer", {"service_account": "s"}]]),
    (None, {"airflow": "not a secret", "region": "eu", "extra": {"api_key": "k"}}),
    ("db_password", "hunter2"),
    ("db_password", {"user": "u", "inner": {"x": "y"}}),
    ("greeting", "hello"),
    ("settings", {"nested": {"service_key": "s"}}),
]


# (name, what a client sent back after reading it masked, what is stored): Airflow's `merge`, what
# a Connection PATCH does with `password` and `extra` (issue 49).
MERGES = [
    ("password", "***", "hunter2"),
    ("password", "new", "hunter2"),
    ("login", "***", "etl"),
    (None, {"api_key": "***", "sslmode": "disable"}, {"api_key": "abc", "sslmode": "require"}),
    (None, {"api_key": "***", "added": "***"}, {"api_key": "abc"}),
    (None, {"nested": {"token": "***", "keep": "***"}}, {"nested": {"token": "t", "keep": "k"}}),
    (
        None,
        {"private_key": {"pem": "***", "parts": ["***", "y"]}},
        {"private_key": {"pem": "P", "parts": ["x", "z"]}},
    ),
    (
        None,
        {"headers": [{"Authorization": "***"}, {"x": "***"}]},
        {"headers": [{"Authorization": "Bearer t"}, {"x": "1"}]},
    ),
    (None, {"secret": ["***", "***", "new"]}, {"secret": ["a"]}),
    (
        None,
        {"a": {"b": {"c": {"d": {"e": {"f": "***"}}}}}},
        {"a": {"b": {"c": {"d": {"e": {"f": "deep"}}}}}},
    ),
    (
        None,
        {"a": {"b": {"c": {"d": {"e": {"f": {"g": "***"}}}}}}},
        {"a": {"b": {"c": {"d": {"e": {"f": {"g": "deeper"}}}}}}},
    ),
    (None, {"password": 1234}, {"password": 5678}),
    (None, {"password": "***"}, {"password": 5678}),
    (None, ["***"], {"password": "x"}),
]


def _airflow() -> dict:
    done = subprocess.run(
        [str(sdk_python()), "-c", _AIRFLOW],
        input=json.dumps([CORPUS, MERGES]),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_word_list_and_redaction_match_airflows_own_masker():
    theirs = _airflow()
    assert sorted(masking.SENSITIVE_FIELDS) == theirs["words"]
    ours = [masking.redact(value, name) for name, value in CORPUS]
    assert ours == theirs["redacted"]


def test_merge_puts_back_what_airflows_merge_puts_back():
    theirs = _airflow()["merged"]
    ours = [masking.merge(new, old, name) for name, new, old in MERGES]
    assert ours == theirs
