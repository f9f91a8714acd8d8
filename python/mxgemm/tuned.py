"""Tuned-config tables: python/mxgemm/configs/<op file>_<arch>.csv (the op file's name in ops/),
one row per tuned problem with the config a planner should use, its time (us) and its source:
"measured" (an op_tests/tune_*.py script timed every candidate on the GPU) or "heuristic" (the
planner's own rule, written without a GPU). Planners read them (exact or nearest problem, their
rule otherwise); tuners write them."""
from __future__ import annotations

import csv
import fcntl
import os
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def table_path(op: str, arch: str) -> Path:
    return CONFIG_DIR / f"{op}_{arch}.csv"


def read_rows(path) -> list[dict]:
    """The table's rows as dicts of strings ([] when there is no table)."""
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def by_size(path, key, size: str, value) -> dict:
    """The table's rows as {key(row): [(int(row[size]), value(row), row["source"]), ...]}, each
    list in increasing size (planners take the row at the nearest tuned size at or above a call's)."""
    table: dict = {}
    for r in read_rows(path):
        table.setdefault(key(r), []).append((int(r[size]), value(r), r["source"]))
    for rows in table.values():
        rows.sort(key=lambda r: r[0])
    return table


def at_or_above(rows, size: int):
    """The first (size, value, source) of ``rows`` (by_size's list) at or above ``size``, else None."""
    return next((r for r in rows if r[0] >= size), None)


def write_rows(rows, path, fields) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def put_row(row, path, fields, key) -> None:
    """Writes ``row`` into the table at ``path`` in place of the row with the same key(row), else
    at its end. The file is re-read under a lock, so tuners running side by side on one table
    keep each other's rows."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as lock:       # rewritten in place: the lock stays on the same file
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = {key(r): r for r in read_rows(path)}
        rows[key(row)] = row
        write_rows(list(rows.values()), path, fields)
