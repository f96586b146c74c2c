#!/usr/bin/env bash
# Installs the system programs some tests drive for real: a Prometheus server (ingestion over the
# HTTP API), headless Chromium with its driver (a screenshot of the report, JupyterLab driven
# in a browser) and a C compiler (the compiled simulation, make native). Needs root and
# apt-get; elsewhere it says what is missing and those tests skip with that reason (they fail
# instead when CI=true).
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# Selenium drives JupyterLab in Chromium through it (tests/test_lab_browser.py).
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# make native compiles the simulation's exact step with mypyc (scripts/build_native.py).
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: not installed (needs root and apt-get): ${missing[*]}" >&2
  exit 0
fi
echo "system-deps: installing ${missing[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the packaged Prometheus as a service where an init system runs; the tests start
# their own instance on their own port, so the packaged one is not needed.
(command -v systemctl >/dev/null 2>&1 && systemctl stop prometheus 2>/dev/null) || true
