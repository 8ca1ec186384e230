#!/usr/bin/env python3
"""Summarises tools/host_abba.sh's log: per weight type and token count, moeflow's host expert
stage (median of each run's median) against ggml's CPU MUL_MAT_ID (gate/up case + down case,
summed per run, median over runs; or, with ROUTINGS, tools/ggml_moe_cold.c's median of both
cases per run), the ratio and both ranges; and the ratio per round (each round's A B B A: the
mean of its two moeflow runs over the mean of its two ggml runs), their median and range, which
a machine whose speed drifts between rounds moves less.  python3 tools/host_abba_summary.py LOG"""
import json
import re
import statistics
import sys
from collections import defaultdict

ours = defaultdict(list)
ours_by_round = defaultdict(lambda: defaultdict(list))
ggml = defaultdict(lambda: defaultdict(dict))
runs = defaultdict(int)
for line in open(sys.argv[1]):
    parts = line.split(" ", 4)
    if len(parts) < 5 or parts[0] != "round":
        continue
    rnd, dtype, who, rest = parts[1], parts[2], parts[3], parts[4]
    if who == "A":
        for blob in re.findall(r"\{[^}]*\}", rest):
            d = json.loads(blob)
            ours[(dtype, d["tokens"])].append(d["median_ms"])
            ours_by_round[(dtype, d["tokens"])][rnd].append(d["median_ms"])
    elif rest.startswith("{"):
        d = json.loads(rest)
        ggml[(dtype, d["tokens"])][(rnd, len(ggml[(dtype, d["tokens"])]))]["cold"] = d["median_ms"]
    else:
        m = re.search(r"m=(\d+),n=(\d+),k=(\d+)\).*?([\d.]+) us/run", rest)
        if m:
            key = (dtype, int(m.group(2)))
            if m.group(1) == "1536":
                runs[(rnd, dtype, key)] += 1
            run = runs[(rnd, dtype, key)]
            ggml[key][(rnd, run)][m.group(1)] = float(m.group(4)) / 1000


def ggml_ms(run):
    """One ggml run's ms: the cold harness's, else test-backend-ops' two cases summed (None
    where one is missing)."""
    if "cold" in run:
        return run["cold"]
    if "1536" in run and "2048" in run:
        return run["1536"] + run["2048"]
    return None


def per_round(key):
    """Each round's mean moeflow ms over its mean ggml ms."""
    ratios = []
    for rnd, a in ours_by_round[key].items():
        b = [ms for (r, _), run in ggml[key].items() if r == rnd for ms in [ggml_ms(run)] if ms is not None]
        if b:
            ratios.append(statistics.mean(a) / statistics.mean(b))
    return ratios


print(
    f"{'type':<10} {'M':>2} {'moeflow ms (range)':>24} {'ggml ms (range)':>24} {'moeflow/ggml':>12}"
    f" {'per round (range)':>20}"
)
for key in sorted(ours):
    a = ours[key]
    b = [ms for ms in map(ggml_ms, ggml[key].values()) if ms is not None]
    if not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    r = per_round(key)
    print(
        f"{key[0]:<10} {key[1]:>2} {ma:>9.2f} ({min(a):.2f}-{max(a):.2f}) {mb:>9.2f} ({min(b):.2f}-{max(b):.2f})"
        f" {ma / mb:>12.2f} {statistics.median(r):>8.2f} ({min(r):.2f}-{max(r):.2f})"
    )
