#!/usr/bin/env bash
# The guidellm environment of the end-to-end tests: scripts/load-tool-env.sh says how.
exec "$(dirname "$0")/load-tool-env.sh" guidellm "$@"
