"""``python -m tests.soak --minutes N [--seed S]`` (``make soak MINUTES=N``): exit 0 when every
invariant held, 1 otherwise; the report is reports/soak.json and reports/soak.png."""

from __future__ import annotations

import argparse
import random
import signal
import sys
from pathlib import Path
from types import FrameType

from agentledger import settings
from tests.soak import faults, runner


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C: the fault in progress heals and everything is stopped.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed (default: random)")
    parser.add_argument("--out", default=str(settings.REPO_ROOT / "reports"),
                        help="where soak.json, soak.png and soak/history.jsonl go")
    parser.add_argument("--faults", default="", help="only these fault kinds, comma-separated "
                        "(e.g. pause:executor-billing:before-call); default: every kind")
    parser.add_argument("--load-share", type=float, default=None,
                        help="the soak at load: measure the box's burst capacity on the soak's "
                        "stack first, then propose at this share of it (e.g. 0.5)")
    parser.add_argument("--evidence", default=None,
                        help="also write the report here, paths relative to the repository "
                        "(e.g. docs/evidence/soak-load.json)")
    args = parser.parse_args(argv)
    if args.load_share is not None and not 0 < args.load_share <= 1:
        parser.error("--load-share is a share of the capacity: more than 0, at most 1")
    kinds = tuple(k for k in args.faults.split(",") if k)
    unknown = sorted(set(kinds) - {f.kind for f in faults.REGISTRY})
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; known: "
                     f"{sorted(f.kind for f in faults.REGISTRY)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"soak: {args.minutes} min, seed {seed}", flush=True)
    code = runner.run(args.minutes, seed, Path(args.out), kinds, load_share=args.load_share,
                      evidence=None if args.evidence is None else Path(args.evidence))
    print(f"soak: {'every invariant held' if code == 0 else 'INVARIANTS VIOLATED'} "
          f"(reports in {args.out})", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
