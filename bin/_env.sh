# Shared by bin/serve and bin/test: create the virtualenv and install a lock file when needed.
# ENV_LOCK: requirements-dev.lock (bin/test: service + tests and tools, the default) or
# requirements.lock (bin/serve: the service only). The dev lock holds every pin of the service's
# lock (tests/test_requirements.py), so a virtualenv with it serves as it is.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo ">> creating virtualenv .venv"
    "$PYTHON" -m venv .venv
fi
LOCK="${ENV_LOCK:-requirements-dev.lock}"
STAMP=.venv/.requirements.sha256
WANT="$(sha256sum "$LOCK" | cut -d' ' -f1)"
DEV="$(sha256sum requirements-dev.lock | cut -d' ' -f1)"
HAVE="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$HAVE" != "$WANT" ] && [ "$HAVE" != "$DEV" ]; then
    echo ">> installing $LOCK"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -r "$LOCK"
    echo "$WANT" >"$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
