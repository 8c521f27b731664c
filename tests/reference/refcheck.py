"""refcheck.py: the check plumbing the reference self-tests share (selftest.py,
kl_selftest.py, ds_selftest.py). Test code only; the references never import it."""

import argparse
import os
import shutil
import subprocess
import tempfile

import numpy as np

from refcommon import RefError

FAILS = []


def check(name, value, bound):
    """A measured value against its bound; prints both, records a failure."""
    ok = bool(np.isfinite(value)) and value <= bound
    print('%-4s %-66s %.3e (<= %.0e)' % ('ok' if ok else 'FAIL', name, value, bound))
    if not ok:
        FAILS.append(name)


def check_true(name, cond, detail=''):
    print('%-4s %-66s %s' % ('ok' if cond else 'FAIL', name, detail))
    if not cond:
        FAILS.append(name)


def maxabs(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) if np.size(a) else 0.0


def rel(a, b):
    return maxabs(a, b) / max(float(np.max(np.abs(b))), 1e-300)


def raises(fn, *words):
    """(whether fn raised a RefError naming every word, the message's start)."""
    try:
        fn()
    except RefError as e:
        return all(w in str(e) for w in words), str(e)[:90]
    return False, 'no error'


def report(what):
    """The closing line and the exit status of a self-test run."""
    if FAILS:
        print('%d FAILED: %s' % (len(FAILS), ', '.join(FAILS)))
        return 1
    print('all %s checks passed' % what)
    return 0


def selftest_main(what, prefix, description, body):
    """A self-test's main: --model DIR (repeatable) names more checkpoints for the
    model checks; body(tmp, models) runs in a scratch directory (prefix) removed
    afterwards. The exit status (report)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument('--model', action='append', default=[], help='also run model checks on DIR')
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        body(tmp, a.model)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(what)


def fake_opt(a, key, default=None):
    """The value after key in a stand-in engine's arguments a, or default."""
    return a[a.index(key) + 1] if key in a else default


def fake_run(ref_main, a, extra=()):
    """A stand-in engine's `run MODEL --ids .. --gen .. --dump-logits FILE` (a: the
    arguments after `run`) answered by a reference's main, extra passed on to it;
    FAKE_PERTURB (environment) adds to every 7th logit of the dump, so a check
    script has an error to find. The exit status."""
    dump = fake_opt(a, '--dump-logits')
    rc = ref_main([a[0], '--ids', fake_opt(a, '--ids'), '--gen', fake_opt(a, '--gen'), '--print-ids',
                   '--dump-logits', dump] + list(extra) + ['--quiet'])
    p = float(os.environ.get('FAKE_PERTURB', '0'))
    if p:
        x = np.fromfile(dump, '<f4')
        x[::7] += p
        x.tofile(dump)
    return rc


def check_script(tmp, fake_src, script, model_dir, cases):
    """Runs tests/reference/SCRIPT (kl_check.sh, ds_check.sh) on model_dir against a
    stand-in engine (fake_src, a Python script written to tmp): each case is
    (label, env, args, wanted exit status, text wanted in the output)."""
    here = os.path.dirname(os.path.abspath(__file__))
    fake = os.path.join(tmp, 'fake-strata')
    with open(fake, 'w') as f:
        f.write(fake_src % here)
    os.chmod(fake, 0o755)
    for label, env, args, want_rc, want in cases:
        r = subprocess.run(['bash', os.path.join(here, script), model_dir, fake] + args,
                           env=dict(os.environ, **env), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
        check_true('%s: %s' % (script, label), r.returncode == want_rc and want in r.stdout,
                   'rc %d: %s' % (r.returncode, r.stdout.strip()[:70]))
