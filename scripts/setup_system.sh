#!/usr/bin/env bash
# Installs the Debian packages that some tests drive for real (scripts/system-packages.txt: one package
# a line, a comment saying which test needs it). Idempotent and quiet when everything is there. Where
# apt-get or root is missing, it says so and exits 0: those tests then skip with a visible reason.
set -uo pipefail
cd "$(dirname "$0")/.."
mapfile -t wanted < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' scripts/system-packages.txt | awk '{print $1}')
((${#wanted[@]})) || exit 0
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || { echo "setup_system: all ${#wanted[@]} packages present"; exit 0; }
if ! command -v apt-get >/dev/null; then
  echo "setup_system: no apt-get; tests that need ${missing[*]} will skip"; exit 0
fi
SUDO=()
if [[ $(id -u) != 0 ]]; then
  if sudo -n true 2>/dev/null; then SUDO=(sudo -n); else
    echo "setup_system: not root and no sudo; tests that need ${missing[*]} will skip"; exit 0
  fi
fi
echo "setup_system: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq >/dev/null 2>&1 || true
# --no-install-recommends keeps the install to what the tests use; policy-rc.d stops Debian from
# starting the services at install time (the tests start their own, under a temporary folder)
printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null && "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/setup_system.log 2>&1; then
  echo "setup_system: apt-get install failed (log /tmp/setup_system.log); tests that need them will skip"
fi
"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
exit 0
