"""The trainer's loss per step from its logs, one curve a log, in one PNG.

    python benchmarks/plot_loss.py online=run_online.log cached=run_cache.log --out loss.png [--title T]

A log is what `python -m dart_jax.train ... --log-every 1` writes to stderr: one JSON object a
logged step ("step", "epoch", "loss", ...) among other lines, which are passed over. Epoch
boundaries are drawn as dotted lines. Made for the online vs cached taps comparison of
benchmarks/RESULTS.md (2026-11-28), whose curves should lie on each other.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_log(path: Path) -> list[dict]:
    """The metrics lines of a training log, in order (other lines skipped)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if "step" in row and "loss" in row:
                rows.append(row)
    if not rows:
        raise SystemExit(f"{path}: no metrics lines (JSON objects with 'step' and 'loss'); pass a log of "
                         "`python -m dart_jax.train ... --log-every 1`")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", metavar="LABEL=LOG", help="a curve: its label and the training log it reads")
    ap.add_argument("--out", required=True, type=Path, help="the PNG to write")
    ap.add_argument("--title", default="loss per step")
    args = ap.parse_args(argv)
    curves = []
    for spec in args.logs:
        label, eq, path = spec.partition("=")
        if not eq or not label or not path:
            ap.error(f"{spec!r}: expected LABEL=LOG, e.g. online=run_online.log")
        curves.append((label, read_log(Path(path))))

    import matplotlib  # noqa: PLC0415 (a script's optional dependency: --help works without it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    styles = [dict(lw=2.5, alpha=0.6), dict(lw=1.0, ls="--", marker="o", ms=3)]  # the second drawn over the first
    for n, (label, rows) in enumerate(curves):
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=label, **styles[n % len(styles)])
    first = curves[0][1]
    for before, after in zip(first, first[1:]):  # a new epoch starts between two logged steps
        if after["epoch"] != before["epoch"]:
            ax.axvline((before["step"] + after["step"]) / 2, color="grey", lw=0.8, ls=":")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("step (micro-batch); dotted: a new epoch")
    ax.set_ylabel("loss")
    ax.set_title(args.title, fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
