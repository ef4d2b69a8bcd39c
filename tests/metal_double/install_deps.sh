#!/usr/bin/env bash
# Test-only Debian packages for the Metal backend's host code on Linux: GNU Objective-C (gobjc) and GNUstep's
# Foundation (libgnustep-base-dev), which build libh3/backend/metal/*.m against the Metal test double
# (`make metal-double`, tests/test_metal_double.py). Best effort, as .ci/run installs clang: where apt-get is
# missing or fails, one line says so and the double's tests skip (outside CI) or fail (in CI) with the reason.
if command -v gcc >/dev/null 2>&1 && [ -x "$(gcc -print-prog-name=cc1obj 2>/dev/null)" ] && \
   [ -f /usr/include/GNUstep/Foundation/Foundation.h ]; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        gobjc libgnustep-base-dev; } >/dev/null 2>&1 && exit 0
fi
echo "metal-double: gobjc and libgnustep-base-dev could not be installed (no apt-get, or it failed); the Metal host's tests against the test double will not run"
exit 0
