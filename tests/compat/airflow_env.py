"""The Airflow packages the compatibility tests check us against, each outside our own
virtualenv, installed once and cached by a hash of what they pin (like `bin/_env.sh` does for
`.venv`):

- `client_python()`: the interpreter of `.venv-airflow-client`, a virtualenv with
  `requirements-airflow-client.txt` (apache-airflow-client 3.3.2);
- `airflow_openapi()`: Airflow 3.3.2's own public API document, `v2-rest-api-generated.yaml`, read
  from the apache-airflow-core wheel (downloaded without its dependencies into that virtualenv's
  `wheels/`; the wheel is only read, never installed); `airflow_openapi(AUTH_DOCUMENT)`: its
  simple auth manager's document (the `/auth/token` login routes, issue 49).
"""

import fcntl
import functools
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "tests/compat/requirements-airflow-client.txt"
CORE = "apache-airflow-core==3.3.2"
CORE_DOCUMENT = "airflow/api_fastapi/core_api/openapi/v2-rest-api-generated.yaml"
AUTH_DOCUMENT = (
    "airflow/api_fastapi/auth/managers/simple/openapi/v2-simple-auth-manager-generated.yaml"
)
VENV = ROOT / ".venv-airflow-client"


def _want() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes() + CORE.encode()).hexdigest()


def _run(*argv: str) -> None:
    print(f">> {' '.join(argv)}", file=sys.stderr, flush=True)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


@functools.cache
def _ensure() -> Path:
    """Build the virtualenv once, under a file lock: two pytest-xdist workers building it at
    once saw it half made (`No module named pip` in CI, twice)."""
    with open(ROOT / ".venv-airflow-client.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build()


def _build() -> Path:
    stamp = VENV / ".requirements.sha256"
    if stamp.exists() and stamp.read_text() == _want():
        return VENV
    python = VENV / "bin/python"
    if not python.exists():
        _run(sys.executable, "-m", "venv", str(VENV))
    _run(str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    _run(str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS))
    wheels = VENV / "wheels"
    _run(str(python), "-m", "pip", "download", "--quiet", "--no-deps", CORE, "-d", str(wheels))
    stamp.write_text(_want())
    return VENV


def client_python() -> Path:
    return _ensure() / "bin/python"


@functools.cache
def airflow_openapi(document: str = CORE_DOCUMENT) -> dict:
    version = CORE.split("==")[1]
    wheel = next((_ensure() / "wheels").glob(f"apache_airflow_core-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        # libyaml's loader when PyYAML has it: the document parses 5 to 10 times faster.
        return yaml.load(
            archive.read(document), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )


def _any_of(schema: object) -> object:
    """The schema with each `oneOf` read as `anyOf`. Pydantic writes a union as `oneOf` though
    its members need not exclude each other: Airflow's ClearTaskInstanceCollectionResponse lists
    `oneOf: [TaskInstanceResponse, NewTaskResponse]`, and every full TaskInstanceResponse is also
    a valid NewTaskResponse (no `additionalProperties: false`), so Airflow's own answer with a
    task instance fails `oneOf`. Validation still needs one member to match."""
    if isinstance(schema, dict):
        return {("anyOf" if k == "oneOf" else k): _any_of(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_any_of(v) for v in schema]
    return schema


def airflow_response_problems(
    answers: list[tuple[str, str, int, object]], *, document: str = CORE_DOCUMENT
) -> list[str]:
    """Validate answers against Airflow's own document: each (method, Airflow's path template as
    in the document, e.g. `/api/v2/dagTags`, status, JSON body) must have that status documented
    with a JSON schema there, and the body must validate against it (JSON Schema 2020-12, the
    document's `components` for its `$ref`s). Returns the problems (empty: all valid)."""
    import jsonschema

    doc = airflow_openapi(document)
    problems = []
    for method, path, status, body in answers:
        operation = doc["paths"].get(path, {}).get(method.lower())
        if operation is None:
            problems.append(f"{method} {path}: not in Airflow's document")
            continue
        response = operation["responses"].get(str(status))
        schema = (response or {}).get("content", {}).get("application/json", {}).get("schema")
        if schema is None:
            problems.append(f"{method} {path}: Airflow documents no JSON {status}")
            continue
        validator = jsonschema.Draft202012Validator(
            _any_of({**schema, "components": doc["components"]}),
            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
        )
        problems += [
            f"{method} {path} {status}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(body)
        ]
    return problems
