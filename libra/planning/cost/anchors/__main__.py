"""`python -m libra.planning.cost.anchors [--fit]`: every anchor's error and the MAPE per family under the defaults;
with --fit, first re-run the fit of the defaults (calibrate() on the `split: fit` anchors) and print its values."""

from __future__ import annotations

import sys

from libra.planning.cost.anchors import ANCHOR_FIT, anchor_errors, family_errors, fit_defaults, load_anchors


def main(argv: list[str]) -> int:
    anchors = load_anchors()
    coeffs = None
    if "--fit" in argv:
        result = fit_defaults(anchors)
        coeffs = result.coeffs
        print(f"fit on {sum(a.split == 'fit' for a in anchors)} anchors: MAPE {result.mape_after:.1f} %")
        for name in ANCHOR_FIT:
            print(f"  {name} = {getattr(coeffs, name):.4g}")
    errors = anchor_errors(anchors, coeffs)
    print(f"{'anchor':38s} {'family':13s} {'split':5s} {'measured':>12s} {'error':>8s}")
    for a in anchors:
        print(f"{a.id:38s} {a.family:13s} {a.split:5s} {a.time_s:12.4g}s {100 * errors[a.id]:+7.1f}%")
    print(f"\n{'family':13s} {'anchors':>7s} {'held out':>8s} {'MAPE all':>9s} {'MAPE held out':>14s}")
    for e in family_errors(anchors, coeffs):
        print(f"{e.family:13s} {e.count:7d} {e.held_out:8d} {e.mape_all:8.1f}% {e.mape_held_out:13.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
