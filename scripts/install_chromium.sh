#!/usr/bin/env bash
# Debian's chromium for the status page's headless-browser test
# (tests/asyncrl/collectors/test_service_example.py), installed by package name with
# apt-get, as root or through `sudo -n`. Does nothing where a browser is already on
# PATH or apt-get is missing, and never fails: where it cannot install (not root,
# offline, not Debian) it says so and the test skips, naming the browser it wants.
set -uo pipefail
for b in chromium chromium-browser google-chrome google-chrome-stable headless_shell; do
    command -v "$b" >/dev/null 2>&1 && exit 0
done
command -v apt-get >/dev/null 2>&1 || exit 0
as_root=()
if [ "$(id -u)" != 0 ]; then as_root=(sudo -n); fi
if { "${as_root[@]}" apt-get update -qq \
     && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium; } >/dev/null 2>&1; then
    echo "install_chromium.sh: installed Debian's chromium (the status page's browser test)"
else
    echo "install_chromium.sh: apt-get could not install Debian's chromium: the status" \
         "page's browser test will skip" >&2
fi
exit 0
