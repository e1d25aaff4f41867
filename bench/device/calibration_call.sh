#!/usr/bin/env bash
# One device call of the estimator's calibration matrix (issue #19) on the one-GPU machine (no network):
#   bash bench/device/calibration_call.sh PART [calibration_matrix.py args ...]
# PART is K of `python bench/calibration_matrix.py --list` (K/N is filled in from that list). Runs from a
# clean tree (devtree.tar: `git archive HEAD`, when carried, so that uncommitted work never reaches the
# GPU), installs .whl (bitsandbytes, liger-kernel: ../shared/device/wheels.sh) into /tmp/site, runs the
# part with its runs under /tmp/cal-home (deleted after: the disk is 64 GB). Results land in $OUT:
# calibration-partK.json/.md (rewritten after every row), calibration-partK.log, box.txt.
set -uo pipefail
part=$1; shift
. bench/device/setup.sh
parts=$(python3 bench/calibration_matrix.py --list | tail -n 1 | sed -n 's/.* \([0-9][0-9]*\) parts,.*/\1/p')
[ -n "$parts" ] || { echo "could not read the part count from --list" >&2; exit 1; }
rm -rf /tmp/cal-home
python3 bench/calibration_matrix.py --part "$part/$parts" --out "$out" --home /tmp/cal-home --budget-s 545 "$@" 2>&1 \
  | tee "$out/calibration-part$part.log" | grep -v '^\s*$' | tail -n 40
rc=${PIPESTATUS[0]}
rm -rf /tmp/cal-home
exit "$rc"
