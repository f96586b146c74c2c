#!/usr/bin/env bash
# Creates (or reuses) the separate environment a load tool runs from in the end-to-end tests:
# PyPI's aiperf 0.13.0 or guidellm 0.8.1, each in its own venv, never in the project's .venv
# (their dependencies pin their own versions of pydantic, numpy and the like). Prints the
# venv's path on stdout; a stamp file makes the check instant once it is complete.
#
#   load-tool-env.sh aiperf|guidellm
#   KVPRESSURE_AIPERF_ENV, KVPRESSURE_GUIDELLM_ENV  where the venv lives
#                          (default ~/.cache/kvpressure/<tool>-<version>)
#   PYTHON                 the interpreter that creates it (default python3; 3.10 or later)
set -euo pipefail
TOOL=${1:?usage: load-tool-env.sh aiperf|guidellm}
case "$TOOL" in
  aiperf) VERSION=0.13.0; ENV_DIR=${KVPRESSURE_AIPERF_ENV:-} ;;
  guidellm) VERSION=0.8.1; ENV_DIR=${KVPRESSURE_GUIDELLM_ENV:-} ;;
  *) echo "load-tool-env: unknown tool $TOOL (aiperf or guidellm)" >&2; exit 2 ;;
esac
ENV_DIR=${ENV_DIR:-$HOME/.cache/kvpressure/$TOOL-$VERSION}
STAMP="$ENV_DIR/.kvpressure-ready"
WANT="$TOOL==$VERSION"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$ENV_DIR/bin/$TOOL" ]; then
  echo "$ENV_DIR"
  exit 0
fi

say() { echo "$TOOL-env: $*" >&2; }
mkdir -p "$(dirname "$ENV_DIR")"
if [ ! -x "$ENV_DIR/bin/python" ]; then
  say "creating $ENV_DIR"
  "${PYTHON:-python3}" -m venv "$ENV_DIR"
fi
if ! "$ENV_DIR/bin/python" -c "import importlib.metadata as m; assert m.version('$TOOL') == '$VERSION'" 2>/dev/null; then
  say "installing $WANT"
  # uv (the project's pinned copy, when make has installed it) resolves and installs in seconds
  # what pip takes minutes over; pip otherwise.
  UV="$(cd "$(dirname "$0")/.." && pwd)/.tools/bin/uv"
  if [ -x "$UV" ]; then
    "$UV" pip install --quiet --python "$ENV_DIR/bin/python" "$WANT" >&2
  else
    "$ENV_DIR/bin/pip" install --quiet --disable-pip-version-check "$WANT" >&2
  fi
fi

say "checking the command"
"$ENV_DIR/bin/$TOOL" --help >/dev/null
echo "$WANT" > "$STAMP"
echo "$ENV_DIR"
