# Shared by bin/serve and bin/test: create the virtualenv and install requirements when needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo ">> creating virtualenv .venv"
    "$PYTHON" -m venv .venv
fi
STAMP=.venv/.requirements.sha256
WANT="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
    echo ">> installing requirements.txt"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -r requirements.txt
    echo "$WANT" >"$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
