#!/usr/bin/python3
"""compare.py: compares two logits dumps (float32 little-endian, steps x vocab, as
written by `strata run --dump-logits` and `k3ref.py --dump-logits`) and/or two id
lists.

  /usr/bin/python3 tests/reference/compare.py --vocab V A.bin REF.bin
      [--ids-a 1,2,3|@file] [--ids-b 1,2,3|@file] [--tol 1e-3] [--per-step] [--json]

The second file is the reference. Per step: rel = max|a - ref| / max|ref| over that
step's vocab; overall: max|a - ref| / max|ref| over all common steps. Ids: count of
equal positions and length of the common prefix. Exit 0 if rel <= tol (and ids equal
when both lists are given), 1 otherwise, 2 on usage errors.
"""

import argparse
import json
import os
import sys

import numpy as np


def load_logits(path, vocab):
    n = os.path.getsize(path)
    if n % (4 * vocab) != 0:
        raise ValueError('%s: %d bytes is not a whole number of %d-wide float32 rows'
                         % (path, n, vocab))
    return np.fromfile(path, dtype='<f4').astype(np.float64).reshape(-1, vocab)


def load_ids(spec):
    if spec is None:
        return None
    if spec.startswith('@'):
        with open(spec[1:]) as f:
            spec = f.read()
    spec = spec.strip().replace(' ', '').replace('\n', ',')
    return [int(x) for x in spec.split(',') if x != '']


def compare_logits(a, ref):
    """Returns dict with per-step and overall relative errors over the common steps."""
    steps = min(len(a), len(ref))
    per = []
    for s in range(steps):
        den = np.max(np.abs(ref[s]))
        num = np.max(np.abs(a[s] - ref[s]))
        per.append(float(num / den) if den > 0 else float(num))
    if steps:
        den = np.max(np.abs(ref[:steps]))
        num = np.max(np.abs(a[:steps] - ref[:steps]))
        overall = float(num / den) if den > 0 else float(num)
        argmax_equal = int(np.sum(np.argmax(a[:steps], 1) == np.argmax(ref[:steps], 1)))
    else:
        overall, argmax_equal = float('nan'), 0
    finite = bool(np.all(np.isfinite(a)) and np.all(np.isfinite(ref)))
    return {'steps_a': len(a), 'steps_ref': len(ref), 'steps': steps, 'per_step': per,
            'max_rel': overall, 'argmax_equal': argmax_equal, 'finite': finite}


def compare_ids(a, b):
    n = min(len(a), len(b))
    same = sum(1 for i in range(n) if a[i] == b[i])
    prefix = 0
    while prefix < n and a[prefix] == b[prefix]:
        prefix += 1
    return {'len_a': len(a), 'len_b': len(b), 'equal': same, 'prefix': prefix,
            'identical': a == b}


def main(argv=None):
    ap = argparse.ArgumentParser(description='compare logits dumps and id lists')
    ap.add_argument('a', nargs='?', help='logits under test')
    ap.add_argument('ref', nargs='?', help='reference logits')
    ap.add_argument('--vocab', type=int, help='row width (needed for logits)')
    ap.add_argument('--ids-a')
    ap.add_argument('--ids-b')
    ap.add_argument('--tol', type=float, default=1e-3)
    ap.add_argument('--per-step', action='store_true')
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--allow-tie-flip', action='store_true',
                    help='ids may diverge where the reference itself is within tol of a tie: '
                         'at the first divergent step s, (ref[s][ids_b[s]] - ref[s][ids_a[s]]) '
                         '/ max|ref[s]| <= tol (REF must be the reference forced along ids_a)')
    o = ap.parse_args(argv)
    res = {}
    ok = True
    try:
        if o.a or o.ref:
            if not (o.a and o.ref and o.vocab):
                ap.error('logits comparison needs A, REF and --vocab')
            r = compare_logits(load_logits(o.a, o.vocab), load_logits(o.ref, o.vocab))
            res['logits'] = r
            ok = ok and r['finite'] and r['steps'] > 0 and r['max_rel'] <= o.tol \
                and r['steps_a'] == r['steps_ref']
        ia, ib = load_ids(o.ids_a), load_ids(o.ids_b)
        if ia is not None and ib is not None:
            r = compare_ids(ia, ib)
            res['ids'] = r
            ids_ok = r['identical']
            s = r['prefix']
            if not ids_ok and 'logits' in res and s < min(len(ia), len(ib)):
                ref = load_logits(o.ref, o.vocab)
                if s < len(ref):
                    den = np.max(np.abs(ref[s]))
                    gap = float((ref[s][ib[s]] - ref[s][ia[s]]) / den) if den > 0 else float('inf')
                    r['first_divergence'] = s
                    r['ref_rel_gap'] = gap
                    if o.allow_tie_flip and 0 <= gap <= o.tol:
                        r['tie_flip'] = True
                        ids_ok = True
            ok = ok and ids_ok
    except (OSError, ValueError) as e:
        sys.stderr.write('compare: %s\n' % e)
        return 2
    if not res:
        ap.error('nothing to compare')
    if o.json:
        print(json.dumps(res))
    else:
        if 'logits' in res:
            r = res['logits']
            if o.per_step:
                for s, v in enumerate(r['per_step']):
                    print('step %3d  rel %.3e' % (s, v))
            print('logits: steps %d/%d  max_rel %.3e  argmax equal %d/%d%s'
                  % (r['steps_a'], r['steps_ref'], r['max_rel'], r['argmax_equal'], r['steps'],
                     '' if r['finite'] else '  NON-FINITE'))
        if 'ids' in res:
            r = res['ids']
            print('ids: %d/%d equal, common prefix %d, lengths %d/%d'
                  % (r['equal'], min(r['len_a'], r['len_b']), r['prefix'], r['len_a'], r['len_b']))
            if 'ref_rel_gap' in r:
                print('ids: first divergence at step %d, reference relative gap %.3e%s'
                      % (r['first_divergence'], r['ref_rel_gap'],
                         ' (tie flip, tolerated)' if r.get('tie_flip') else ''))
        print('PASS' if ok else 'FAIL (tol %.1e)' % o.tol)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
