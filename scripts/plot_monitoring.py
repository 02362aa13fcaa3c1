#!/usr/bin/python3
"""Draws what Prometheus saw of the tiny node during the real-node monitoring scenario.

Reads the CSV `e2e/tests/realnode/monitoring.rs` writes with IPKEEP_MONITORING_CSV (seconds since
the scenario began; the node's free, allocated, Bound- and Released-held addresses; the states of
IpkeepRangeNearlyFull and IpkeepNotInCharge, 0 inactive, 1 pending, 2 firing) and writes one PNG:
the addresses above, the alerts' states below, on one time axis.

    /usr/bin/python3 scripts/plot_monitoring.py OUT.png IN.csv

`make monitoring-picture` runs the scenario and then this. It runs with the system's Python and
Debian's python3-matplotlib (`make deps` installs it), not the project's .venv.
"""

import csv
import sys

try:
    import matplotlib
except ImportError as e:
    sys.exit(f"plot_monitoring.py: {e}: install Debian's python3-matplotlib (make deps, "
             "or apt-get install python3-matplotlib) and run it with /usr/bin/python3")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def number(text):
    return float(text) if text not in ("", "NaN") else float("nan")


def main(out, path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"plot_monitoring.py: {path} holds no row")
    minutes = [int(r["seconds"]) / 60 for r in rows]
    column = {k: [number(r[k]) for r in rows] for k in rows[0] if k != "seconds"}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    for key, label in [("free", "free"), ("allocated", "allocated (a container holds it)"),
                       ("bound", "held: Bound"), ("released", "held: Released")]:
        top.step(minutes, column[key], where="post", label=label)
    top.set_ylabel("addresses of the tiny node's /29")
    top.set_title("A node's range filling up and freed, as Prometheus saw it (ipkeep_agent_range_*)")
    top.legend(loc="center right")
    top.grid(alpha=0.3)
    for key, label in [("nearly_full", "IpkeepRangeNearlyFull"),
                       ("not_in_charge", "IpkeepNotInCharge")]:
        bottom.step(minutes, column[key], where="post", label=label)
    bottom.set_yticks([0, 1, 2], ["inactive", "pending", "firing"])
    bottom.set_xlabel("minutes since the scenario began")
    bottom.legend(loc="upper left")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_monitoring.py OUT.png IN.csv")
    main(sys.argv[1], sys.argv[2])
