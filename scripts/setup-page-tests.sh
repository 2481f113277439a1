#!/usr/bin/env bash
# What the chat page's browser test (crates/nuvec-cli/tests/serve_page.rs) needs: Debian's
# chromium (headless, driven over CDP) and the pinned npm playwright-core in a node_modules of
# its own under $NUVEC_CACHE, keyed by the hash of scripts/page/package-lock.json. playwright-core
# downloads no browser: the test hands it Debian's. Prints the two variables as shell exports,
# which scripts/test.sh evaluates:
#
#   eval "$(scripts/setup-page-tests.sh)"   # NUVEC_CHROMIUM, NUVEC_PAGE_NODE_MODULES
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NUVEC_CACHE="${NUVEC_CACHE:-$HOME/.cache/nuvec}"
mkdir -p "$NUVEC_CACHE"
NUVEC_CACHE="$(cd "$NUVEC_CACHE" && pwd)"
log() { echo "[setup-page-tests] $*" >&2; }

# Debian's packages: chromium, node and npm, and a font so the screenshot shows text. Only what
# is missing, without recommends, to keep a clean machine's install short.
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need+=(fonts-dejavu-core)
if ((${#need[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        log "installing ${need[*]}"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "error: the page test needs ${need[*]}; install them (apt-get install --no-install-recommends ${need[*]})" >&2
        exit 1
    fi
fi
CHROMIUM="$(command -v chromium)"
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then
    echo "error: playwright-core (scripts/page/package.json) needs Node.js 20 or newer; node is $(node --version)" >&2
    exit 1
fi

LOCK="$ROOT/scripts/page/package-lock.json"
DIR="$NUVEC_CACHE/page-node-$(sha256sum "$LOCK" | cut -c1-12)"
if [[ ! -f "$DIR/.installed" ]]; then
    log "installing playwright-core into $DIR"
    rm -rf "$DIR"
    mkdir -p "$DIR"
    cp "$ROOT/scripts/page/package.json" "$LOCK" "$DIR/"
    (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2)
    touch "$DIR/.installed"
fi
printf 'export NUVEC_CHROMIUM=%q\nexport NUVEC_PAGE_NODE_MODULES=%q\n' "$CHROMIUM" "$DIR/node_modules"
