#!/usr/bin/env python3
"""Summarise the per-SASS-line CSV of an Nsight Compute profile.

Reads the sass.csv that `scripts/device_check.sh BUILD OUT profile` puts in
OUT/profile.tgz (ncu --page source --csv --print-source sass) and prints:
- the stall samples by reason, over the whole kernel;
- the executed warp instructions grouped by how often a line ran. In a
  kernel whose roles run fixed code per tile, each role's lines share one
  count (v17: 393,216 for the MXFP4 producers' decode, 131,072 for the
  consumer), so the groups separate the roles;
- the lines with the most stall samples, with their two main reasons.

Usage: scripts/profile_summary.py sass.csv [--top N]
"""
import argparse
import collections
import csv


def number(text):
    try:
        return float(text.replace(',', '')) if text else 0.0
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('csv_file')
    ap.add_argument('--top', type=int, default=20, help='lines with the most stall samples to list')
    args = ap.parse_args()

    with open(args.csv_file, newline='') as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; row 1 is the header; then one row per SASS line.
    header = next(i for i, r in enumerate(rows) if 'Source' in r)
    names, lines = rows[header], [r for r in rows[header + 1:] if len(r) == len(rows[header])]
    col = {n: i for i, n in enumerate(names)}
    reasons = [(i, n[len('stall_'):]) for i, n in enumerate(names) if n.startswith('stall_') and '(Not Issued)' not in n]
    # Each line parsed once: (source, executions, stall samples, samples by reason).
    parsed = [(r[col['Source']].strip(), number(r[col['Instructions Executed']]),
               number(r[col['Warp Stall Sampling (All Samples)']]), {name: number(r[i]) for i, name in reasons})
              for r in lines]

    total_samples = sum(p[2] for p in parsed)
    total_executed = sum(p[1] for p in parsed)
    print(f'{len(parsed)} SASS lines, {total_executed:,.0f} warp instructions executed, '
          f'{total_samples:,.0f} stall samples')

    by_reason = collections.Counter()
    for _, _, _, stalls in parsed:
        by_reason.update(stalls)
    print('\nstall samples by reason:')
    for reason, n in by_reason.most_common():
        if n > 0:
            print(f'  {reason:<20} {n:>10,.0f}  {100 * n / max(total_samples, 1):5.1f}%')

    groups = collections.defaultdict(lambda: [0, 0.0])  # executions of a line -> [lines, samples]
    for _, executed, samples, _ in parsed:
        if executed > 0:
            groups[executed][0] += 1
            groups[executed][1] += samples
    print('\nlines grouped by executions (a role per group where roles run fixed code):')
    print(f'  {"executions":>12} {"lines":>6} {"instructions":>14} {"samples":>9}')
    for e, (n, s) in sorted(groups.items(), key=lambda kv: -kv[0] * kv[1][0])[:12]:
        print(f'  {e:>12,.0f} {n:>6} {e * n:>14,.0f} {s:>9,.0f}')

    print(f'\nthe {args.top} lines with the most stall samples:')
    for source, executed, samples, stalls in sorted(parsed, key=lambda p: -p[2])[:args.top]:
        if samples <= 0:
            break
        main_reasons = sorted(((n, name) for name, n in stalls.items()), reverse=True)[:2]
        why = ', '.join(f'{name} {n:,.0f}' for n, name in main_reasons if n > 0)
        print(f'  {samples:>8,.0f}  x{executed:<10,.0f} {source[:60]:<60} {why}')

if __name__ == '__main__':
    main()
