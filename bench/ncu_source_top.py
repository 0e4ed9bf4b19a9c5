#!/usr/bin/env python3
"""The SASS instructions of a kernel that weigh most in one ncu source-counter column.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass` (one row per SASS
instruction of the profiled kernel) and prints the header's columns, then the `top` rows with the
largest value in every column whose name contains `match` (case-insensitive; e.g. "Shared" for
the shared-memory wavefront and bank-conflict columns, "Stall" for the stall samples), each with
its address and instruction text.

Usage: python3 bench/ncu_source_top.py SOURCE.csv [match] [top]
"""
import csv
import sys


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    match = (sys.argv[2] if len(sys.argv) > 2 else "Shared").lower()
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # ncu's banner and the "Kernel Name" row come before the header (the row starting "Address")
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header, body = rows[start], [r for r in rows[start + 1:] if r and r[0].startswith("0x")]
    print("columns:", " | ".join(header))
    text_col = next((i for i, h in enumerate(header) if h.strip().lower() == "source"), 1)
    for ci, name in enumerate(header):
        if match not in name.lower():
            continue
        ranked = sorted(body, key=lambda r: -number(r[ci]) if ci < len(r) else 0.0)
        total = sum(number(r[ci]) for r in body if ci < len(r))
        print(f"\n== {name}: total {total:.0f}")
        for r in ranked[:top]:
            if ci >= len(r) or number(r[ci]) == 0:
                break
            print(f"  {number(r[ci]):>12.0f}  {r[0]:>8}  {r[text_col][:110]}")


if __name__ == "__main__":
    main()
