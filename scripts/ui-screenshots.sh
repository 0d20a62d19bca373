#!/usr/bin/env bash
# Retakes docs/ui-chat.png and docs/ui-completion.png: runs the page's browser test with
# STRATA_UI_SCREENSHOTS set (needs chromium, chromium-driver, the models and a built binary:
# STRATA_BIN, default target/release/strata).
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA_UI_SCREENSHOTS="${1:-docs}" python3 -m pytest tests/e2e/test_ui.py -q
