"""The median over repetitions of one figure of `pipeline bench-serve --json` reports, for the
benchmark scripts: the report of repetition r of run `name` is <out>/<name>-<r>.json."""
import json
import statistics


def median(out, reps, name, *path):
    values = []
    for rep in range(1, reps + 1):
        with open(f"{out}/{name}-{rep}.json") as report:
            value = json.load(report)
        for key in path:
            value = value[key]
        values.append(value)
    return statistics.median(values)
