#!/usr/bin/env bash
# Refreshes the dashboard's vendored front-end files (master/web/static/vendor/) from the npm
# registry: pinned versions, the tarball checked against npm's sha512 integrity, each file
# checked against its pinned sha256, then MANIFEST.json and the licence texts rewritten.
# Nothing here runs at install or start-up: the files are committed, so the master never
# needs Node or the network.
#
#   scripts/vendor-frontend.sh            # fetch, verify, write
#   scripts/vendor-frontend.sh --check    # verify the committed files against MANIFEST.json only
#   scripts/vendor-frontend.sh --print    # fetch and print the sha256 of each file (for a bump)
#
# To bump a library: change its version and integrity below (`npm view NAME@VERSION
# dist.integrity`), run with --print, paste the new sha256 values, run without flags.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/master/web/static/vendor"
REGISTRY=${NPM_REGISTRY:-https://registry.npmjs.org}
MODE=${1:-write}

# name|version|licence|tarball sha512 (npm dist.integrity)
PACKAGES=(
  "htmx.org|2.0.11|0BSD|sha512-Thx/WtpeOQqSrqBCw/A1cwGJGg4UrVa3+sW0GmrM3p4gJgO89ecH4qtbnyzDDWFvBTqjnIMCgELTNt636dtamA=="
  "uplot|1.6.32|MIT|sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
)
# package|path in the tarball|vendored file name|sha256
FILES=(
  "htmx.org|package/dist/htmx.min.js|htmx.min.js|d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"
  "htmx.org|package/LICENSE|LICENSES/htmx.org-LICENSE|d3d2456f76414f2456104660ebd65aff1c04cd7966b942bdabd63f3cdb316a38"
  "uplot|package/dist/uPlot.iife.min.js|uPlot.iife.min.js|19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f"
  "uplot|package/dist/uPlot.min.css|uPlot.min.css|df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04"
  "uplot|package/LICENSE|LICENSES/uplot-LICENSE|8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd"
)

sha256() { sha256sum "$1" | cut -d' ' -f1; }

if [ "$MODE" = "--check" ]; then
  status=0
  for entry in "${FILES[@]}"; do
    IFS='|' read -r _pkg _src name want <<<"$entry"
    got=$(sha256 "$DEST/$name" 2>/dev/null || echo missing)
    if [ "$got" != "$want" ]; then
      echo "vendor: $name is $got, expected $want" >&2
      status=1
    fi
  done
  [ $status = 0 ] && echo "vendor: every file matches its pinned sha256"
  exit $status
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

for entry in "${PACKAGES[@]}"; do
  IFS='|' read -r pkg version _licence integrity <<<"$entry"
  base=${pkg##*/}
  url="$REGISTRY/$pkg/-/$base-$version.tgz"
  echo "vendor: fetching $url" >&2
  curl -sSfL --retry 3 -o "$WORK/$pkg.tgz" "$url"
  got="sha512-$(openssl dgst -sha512 -binary "$WORK/$pkg.tgz" | base64 -w0)"
  if [ "$got" != "$integrity" ]; then
    echo "vendor: $pkg@$version tarball integrity is $got, expected $integrity" >&2
    exit 1
  fi
  mkdir -p "$WORK/$pkg"
  tar xzf "$WORK/$pkg.tgz" -C "$WORK/$pkg"
done

if [ "$MODE" = "--print" ]; then
  for entry in "${FILES[@]}"; do
    IFS='|' read -r pkg src name _want <<<"$entry"
    echo "$pkg|$src|$name|$(sha256 "$WORK/$pkg/$src")"
  done
  exit 0
fi

for entry in "${FILES[@]}"; do
  IFS='|' read -r pkg src name want <<<"$entry"
  got=$(sha256 "$WORK/$pkg/$src")
  if [ "$got" != "$want" ]; then
    echo "vendor: $pkg $src is $got, expected $want (run --print after a version bump)" >&2
    exit 1
  fi
done

mkdir -p "$DEST/LICENSES"
for entry in "${FILES[@]}"; do
  IFS='|' read -r pkg src name _want <<<"$entry"
  install -m 0644 "$WORK/$pkg/$src" "$DEST/$name"
done

{
  echo '{'
  echo '  "comment": "Written by scripts/vendor-frontend.sh; tests/web/test_vendor.py checks every sha256.",'
  echo '  "packages": ['
  i=0
  for entry in "${PACKAGES[@]}"; do
    IFS='|' read -r pkg version licence integrity <<<"$entry"
    base=${pkg##*/}
    [ $i -gt 0 ] && echo '    },'
    i=$((i + 1))
    echo '    {'
    echo "      \"name\": \"$pkg\","
    echo "      \"version\": \"$version\","
    echo "      \"licence\": \"$licence\","
    echo "      \"source\": \"$REGISTRY/$pkg/-/$base-$version.tgz\","
    echo "      \"integrity\": \"$integrity\","
    echo '      "files": ['
    first=1
    for file in "${FILES[@]}"; do
      IFS='|' read -r fpkg src name want <<<"$file"
      [ "$fpkg" = "$pkg" ] || continue
      [ $first = 1 ] || echo ','
      first=0
      printf '        {"path": "%s", "from": "%s", "sha256": "%s"}' "$name" "$src" "$want"
    done
    echo
    echo '      ]'
  done
  echo '    }'
  echo '  ]'
  echo '}'
} >"$DEST/MANIFEST.json"
echo "vendor: wrote $(ls "$DEST" | wc -l) entries under ${DEST#"$ROOT"/}" >&2
