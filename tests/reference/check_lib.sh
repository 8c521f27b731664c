# check_lib.sh: the engine-vs-reference comparison kl_check.sh and ds_check.sh
# share; sourced, never run. The caller sets here, PY, M (model dir), STRATA, gen,
# ids, long, tol, out (may be empty) and calls chk_compare once.

# chk_compare REF LABEL [ENGINE_ARGS...]: REF is the reference module (klref, dsref);
# LABEL follows the model name in every output line (e.g. " router=hf", or "");
# the array ref_extra holds the reference's extra arguments. Prints the one
# PASS/FAIL line and exits 0 (PASS) or 1.
chk_compare() {
  local ref=$1 label=$2; shift 2
  if [ -n "$out" ]; then mkdir -p "$out" || exit 2; keep=1; else out=$(mktemp -d) || exit 1; keep=0; fi
  trap '[ $keep = 1 ] || rm -rf "$out"' EXIT

  # Prompt ids modulo the vocabulary (--long: 150 ids from a fixed LCG).
  local prompt vocab
  prompt=$("$PY" -c "
import sys; sys.path.insert(0, '$here'); import $ref as R
v = R.load_config(sys.argv[1]).vocab
ids = [int(x) for x in (sys.argv[2] or '1,17,42,9,250,3,88,130').split(',') if x]
x = 12345
while int(sys.argv[3]) and len(ids) < 150:
    x = (x * 1103515245 + 12345) % 2**31
    ids.append(x >> 8)
print(v, ','.join(str(i % v) for i in ids))" "$M" "$ids" "$long" 2>"$out/cfg.log") || {
    echo "FAIL $M$label: the reference cannot read the config: $(tail -n 1 "$out/cfg.log")"; exit 1; }
  vocab=${prompt%% *}; prompt=${prompt#* }

  if ! "$STRATA" run "$M" --ids "$prompt" --gen "$gen" --temp 0 --print-ids \
       --dump-logits "$out/engine.bin" "$@" >"$out/engine.ids" 2>"$out/engine.log"; then
    echo "FAIL $M$label: strata run failed: $(tail -n 1 "$out/engine.log")"; exit 1
  fi
  if ! "$PY" "$here/$ref.py" "$M" --ids "$prompt" --gen "$gen" "${ref_extra[@]}" --quiet \
       --print-ids --dump-logits "$out/ref.bin" >"$out/ref.ids" 2>"$out/ref.log"; then
    echo "FAIL $M$label: the reference failed: $(tail -n 1 "$out/ref.log")"; exit 1
  fi
  local eng_ids ref_ids cmp_ref="$out/ref.bin" json
  eng_ids=$(tail -n 1 "$out/engine.ids" | tr -d ' \r')
  ref_ids=$(tail -n 1 "$out/ref.ids" | tr -d ' \r')
  # Ids differ: compare the logits with the reference forced along the engine's ids.
  if [ "$eng_ids" != "$ref_ids" ] && [ -n "$eng_ids" ]; then
    "$PY" "$here/$ref.py" "$M" --ids "$prompt" --gen "$gen" "${ref_extra[@]}" --quiet \
      --force-ids "$eng_ids" --dump-logits "$out/ref-forced.bin" >/dev/null 2>>"$out/ref.log" \
      && cmp_ref="$out/ref-forced.bin"
  fi
  json=$("$PY" "$here/compare.py" --vocab "$vocab" "$out/engine.bin" "$cmp_ref" \
         --ids-a "${eng_ids:-}" --ids-b "$ref_ids" --tol "$tol" --json 2>&1)
  "$PY" -c "
import json, sys
m, tol, raw = sys.argv[1:4]
try:
    r = json.loads(raw)
except ValueError:
    print('FAIL %s: compare.py: %s' % (m, raw.replace(chr(10), ' '))); sys.exit(1)
lg, ids = r['logits'], r['ids']
same = ids['len_a'] == ids['len_b'] and ids['equal'] == ids['len_b']
ok = same and lg['finite'] and lg['steps_a'] == lg['steps_ref'] and lg['max_rel'] <= float(tol)
note = ''
if lg['steps_a'] != lg['steps_ref']: note += ' steps %d vs %d;' % (lg['steps_a'], lg['steps_ref'])
if not lg['finite']: note += ' non-finite logits;'
if not same and 'first_divergence' in ids:
    note += ' first divergence at step %d (reference top-2 gap %.2e)' % (ids['first_divergence'], ids['ref_rel_gap'])
print('%s %s steps=%d max_rel=%.3e (tol %s) ids=%s %d/%d%s' % (
    'PASS' if ok else 'FAIL', m, lg['steps'], lg['max_rel'], tol,
    'equal' if same else 'differ', ids['equal'], max(ids['len_a'], ids['len_b']), note))
sys.exit(0 if ok else 1)
" "$M$label" "$tol" "$json"
  exit $?
}
