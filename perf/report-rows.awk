# Renders perf/bench.sh's rows (tab-separated: label, better, printf format, shardline value,
# nginx value, target, meaning) as the markdown table (-v mode=table) or the list of what each
# row means (-v mode=meaning). Empty value = not measured.
function num(v) { return v ~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ }
function show(v, f) { return num(v) ? sprintf(f, v) : "n/a" }
function ratio(a, b) {
  if (!num(a) || !num(b)) return ""
  if (b + 0 == 0) return ""
  return a / b
}
function ahead(a, b, better,   r) {
  if (!num(a) || !num(b)) return "n/a"
  if (better == "info") return ""
  if (a + 0 == b + 0) return "tie"
  if (b + 0 == 0) return (better == "higher") == (a > 0) ? "shardline" : "nginx"
  r = a / b
  if (r > 0.95 && r < 1.0 / 0.95) return "tie"
  return (better == "higher") == (r > 1) ? "shardline" : "nginx"
}
# target: ";"-separated conditions on "ratio" or "sl", e.g. "sl<=5;ratio<=0.25"
function target(spec, a, b,   n, i, c, m, lhs, op, rhs, v, ok, all, txt) {
  if (spec == "") return ""
  n = split(spec, c, ";")
  all = 1
  txt = ""
  for (i = 1; i <= n; i++) {
    match(c[i], /(<=|>=|==)/)
    lhs = substr(c[i], 1, RSTART - 1); op = substr(c[i], RSTART, RLENGTH); rhs = substr(c[i], RSTART + RLENGTH) + 0
    v = (lhs == "ratio") ? ratio(a, b) : (num(a) ? a + 0 : "")
    if (v == "") return "n/a (" spec ")"
    ok = (op == "<=") ? v <= rhs : (op == ">=") ? v >= rhs : v == rhs
    all = all && ok
    txt = txt (txt == "" ? "" : ", ") (lhs == "sl" ? "shardline" : "ratio") " " op " " rhs
  }
  return (all ? "met" : "**missed**") " (" txt ")"
}
mode == "table" {
  r = ratio($4, $5)
  printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, show($4, $3), show($5, $3), \
    (r == "" ? "—" : sprintf("%.2f", r)), ahead($4, $5, $2), target($6, $4, $5)
}
mode == "meaning" {
  a = ahead($4, $5, $2)
  verdict = (a == "tie" && $4 + 0 == $5 + 0) ? "equal" : (a == "tie") ? "within 5% of each other" : (a == "n/a") ? "not measured" : (a == "") ? "context" : a " ahead"
  printf "- **%s** (%s): %s This run: shardline %s, nginx %s (%s).\n", $1, \
    ($2 == "info" ? "context, no direction" : $2 " is better"), $7, show($4, $3), show($5, $3), verdict
}
