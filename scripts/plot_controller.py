#!/usr/bin/python3
"""Draws the controller bench's figures against pod count, beside their ceilings.

Reads the CSV files `bench_controller --csv FILE` writes (one or more runs; rows are merged by
pod count, the last run of a size wins) and writes one PNG: time to all Bound and to all
Released beside the ceilings measured in the same run, and the controller's peak RSS; the time to
all Bound and the memory are projected to 150 000 pods (Kubernetes' published limit) along the
line through the smallest and the largest size.

    /usr/bin/python3 scripts/plot_controller.py OUT.png RUN.csv [RUN.csv ...]

`bench_controller --csv RUN.csv --plot OUT.png` runs it. It runs with the system's Python and
Debian's python3-matplotlib (`make deps` installs it), not the project's .venv.
"""

import csv
import sys

try:
    import matplotlib
except ImportError as e:
    sys.exit(f"plot_controller.py: {e}: install Debian's python3-matplotlib (make deps, "
             "or apt-get install python3-matplotlib) and run it with /usr/bin/python3")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(paths):
    rows = {}
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                rows[int(row["pods"])] = {k: v for k, v in row.items()}
    return [rows[p] for p in sorted(rows)]


KUBERNETES_PODS = 150_000


def projected(axes, pods, values, style, label):
    """A dotted line from the largest size to 150 000 pods, along the smallest-to-largest slope."""
    if len(pods) < 2 or pods[-1] >= KUBERNETES_PODS:
        return
    per_pod = (values[-1] - values[0]) / (pods[-1] - pods[0])
    axes.plot([pods[-1], KUBERNETES_PODS],
              [values[-1], values[-1] + per_pod * (KUBERNETES_PODS - pods[-1])], style, label=label)


def main(out, paths):
    rows = read(paths)
    pods = [int(r["pods"]) for r in rows]
    col = lambda name: [float(r[name]) for r in rows]  # noqa: E731
    fig, (times, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    times.plot(pods, col("bound_s"), "o-", label="controller: all Bound")
    times.plot(pods, col("bound_ceiling_s"), "o--", label="ceiling: spec + status apply each")
    projected(times, pods, col("bound_s"), "C0:", "controller: all Bound, projected")
    projected(times, pods, col("bound_ceiling_s"), "C1:", "ceiling, projected")
    times.plot(pods, col("released_s"), "s-", label="controller: all Released (started with the pods gone)")
    times.plot(pods, col("released_ceiling_s"), "s--", label="ceiling: one status apply each")
    times.set_xlabel("annotated pods")
    times.set_ylabel("seconds")
    times.set_title("time, beside the API server's ceiling")
    times.legend(fontsize="small")
    times.grid(alpha=0.3)
    memory.plot(pods, col("peak_rss_mib"), "o-", label="controller peak RSS")
    projected(memory, pods, col("peak_rss_mib"), "C0:", "projected")
    memory.plot([KUBERNETES_PODS], [300], "rx", label="goal: 300 MiB at 150 000 (2 KiB per pod)")
    memory.set_xlabel("annotated pods")
    memory.set_ylabel("MiB")
    memory.set_title("memory")
    memory.grid(alpha=0.3)
    memory.legend(fontsize="small")
    loads = sorted({r["load_average"].replace("/", " ") for r in rows})
    fig.suptitle("ipkeep controller on the real kube-apiserver (load average " + "; ".join(loads) + ")",
                 fontsize="medium")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
