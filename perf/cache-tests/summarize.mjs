// perf/cache-tests/summarize.mjs: writes perf/CACHE-TESTS.md from the cache-tests client's JSON
// results (run by perf/cache-tests.sh, which documents the setup). Results are judged by the
// suite's own code (test-engine/lib/results.mjs, dependencies honoured), the way cache-tests.fyi
// shows them, so the totals are comparable with the published runs in the suite's results/.
//
//   node summarize.mjs SUITE_DIR META_JSON OUT_MD NAME=RESULTS_JSON...
//
// SUITE_DIR: the copy of the suite that ran (its tests/ and published results/); META_JSON: the
// run's facts (date, machine, commits, versions, command, configs) written by the script.
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'

const [suiteDir, metaFile, outFile, ...columnArgs] = process.argv.slice(2)
if (!suiteDir || !metaFile || !outFile || columnArgs.length === 0) {
  console.error('usage: node summarize.mjs SUITE_DIR META_JSON OUT_MD NAME=RESULTS_JSON...')
  process.exit(2)
}
const suiteUrl = p => pathToFileURL(path.resolve(suiteDir, p)).href
const tests = (await import(suiteUrl('tests/index.mjs'))).default
const { determineTestResult, resultTypes } = await import(suiteUrl('test-engine/lib/results.mjs'))
const meta = JSON.parse(fs.readFileSync(metaFile, 'utf8'))
const columns = columnArgs.map(arg => {
  const at = arg.indexOf('=')
  return { name: arg.slice(0, at), results: JSON.parse(fs.readFileSync(arg.slice(at + 1), 'utf8')) }
})

const CDN = 'cdn-cache-control'
// The published reverse proxies and CDN the issue quotes (required tests of 150), with the file
// each came from in the suite's results/: recounted below from the snapshot as a check that this
// summary counts the way the issue's figures were counted.
const ANCHORS = [
  ['Apache Traffic Server', 'trafficserver.json', 132],
  ['Apache httpd', 'apache.json', 131],
  ['Squid', 'squid.json', 122],
  ['Varnish', 'varnish.json', 119],
  ['Caddy (cache handler)', 'caddy.json', 116],
  ['nginx', 'nginx.json', 99],
  ['Fastly', 'fastly.json', 96],
  ['HAProxy', 'haproxy.json', 89]
]

const kindOf = t => t.kind || 'required'
// The tests a reverse proxy runs: the CLI skips browser-only ones (test-engine/client/runner.mjs).
const runnable = s => s.tests.filter(t => t.browser_only !== true)
const verdict = (results, id) => determineTestResult(tests, id, results)
const passed = (results, t) => {
  const v = verdict(results, t.id)
  return v === resultTypes.pass || v === resultTypes.yes
}
const outcomeName = v => {
  for (const [k, val] of Object.entries(resultTypes)) if (val === v) return k
  return '?'
}

// Counts of one result set: required outside CDN-Cache-Control (the issue's 150), and the
// CDN-Cache-Control suite's required and optimal passes (the issue's "Caddy passes 11" counts
// both) and checks.
function totals (results) {
  const t = { req: 0, reqOwn: 0, reqN: 0, opt: 0, optN: 0, chk: 0, chkN: 0, cdnReq: 0, cdnReqN: 0, cdnOpt: 0, cdnOptN: 0, cdnChk: 0, cdnChkN: 0, reqOutcomes: {} }
  for (const s of tests) {
    for (const test of runnable(s)) {
      const k = kindOf(test)
      const ok = passed(results, test) ? 1 : 0
      if (s.id === CDN) {
        if (k === 'required') { t.cdnReq += ok; t.cdnReqN++ } else if (k === 'optimal') { t.cdnOpt += ok; t.cdnOptN++ } else { t.cdnChk += ok; t.cdnChkN++ }
        continue
      }
      if (k === 'required') {
        t.req += ok; t.reqN++
        if (determineTestResult(tests, test.id, results, false) === resultTypes.pass) t.reqOwn++
        const o = outcomeName(verdict(results, test.id))
        t.reqOutcomes[o] = (t.reqOutcomes[o] || 0) + 1
      } else if (k === 'optimal') { t.opt += ok; t.optN++ } else { t.chk += ok; t.chkN++ }
    }
  }
  return t
}

const esc = s => String(s).replace(/\|/g, '\\|').replace(/\n/g, ' ')
const lines = []
const out = s => lines.push(s)
const colNames = columns.map(c => c.name)
const tot = columns.map(c => totals(c.results))

out('# cache-tests: shardline beside nginx (issue 42, item 11)')
out('')
out('The [http-tests/cache-tests](https://github.com/http-tests/cache-tests) suite (cache-tests.fyi), ' +
  `pinned snapshot at \`${meta.suite_commit}\`, run by \`${meta.command}\` against shardline and against ` +
  'nginx set up as a proxy cache the way the suite\'s own `docker/nginx/nginx.conf` sets it up. ' +
  'Results are judged by the suite\'s own code (`test-engine/lib/results.mjs`, dependencies honoured, ' +
  'as cache-tests.fyi shows them); the raw client output is in `perf/cache-tests/*.json`.')
out('')
out(`- Date: ${meta.date}`)
out(`- Machine: ${meta.machine}`)
out(`- shardline: commit \`${meta.shardline_commit}\` (release build), ${meta.shardline_setup}`)
out(`- nginx: ${meta.nginx_version}, ${meta.nginx_setup}`)
out(`- Router in front of shardline: ${meta.router}`)
out(`- Client and test server: Node ${meta.node_version}, the suite's CLI (\`test-engine/cli.mjs\`) and server (\`test-engine/server/server.mjs\`)`)
out('')
if (meta.diagnostic) {
  out(meta.diagnostic)
  out('')
}

out('## Totals')
out('')
out('"Required" is the issue\'s count: the 150 required tests a reverse proxy runs, CDN-Cache-Control aside. ' +
  'A test whose prerequisite (`depends_on`) did not pass counts as not passed, as on cache-tests.fyi. ' +
  'CDN-Cache-Control (24 tests: 10 required, 7 optimal, 7 checks) is counted apart; its "passes" are ' +
  'required plus optimal, as the issue counts Caddy\'s 11.')
out('')
out(`| | ${colNames.join(' | ')} |`)
out(`|---|${colNames.map(() => '---:').join('|')}|`)
out(`| **Required passed (of ${tot[0].reqN})** | ${tot.map(t => `**${t.req}**`).join(' | ')} |`)
const outcomeKeys = [...new Set(tot.flatMap(t => Object.keys(t.reqOutcomes)))].filter(k => k !== 'pass')
out(`| required whose own run passed (\`depends_on\` ignored) | ${tot.map(t => t.reqOwn).join(' | ')} |`)
for (const k of outcomeKeys) {
  out(`| required: ${k.replace('_', ' ')} | ${tot.map(t => t.reqOutcomes[k] || 0).join(' | ')} |`)
}
out(`| Optimal passed (of ${tot[0].optN}) | ${tot.map(t => t.opt).join(' | ')} |`)
out(`| Checks answered "yes" (of ${tot[0].chkN}) | ${tot.map(t => t.chk).join(' | ')} |`)
out(`| CDN-Cache-Control passes, required + optimal (of ${tot[0].cdnReqN + tot[0].cdnOptN}) | ${tot.map(t => t.cdnReq + t.cdnOpt).join(' | ')} |`)
out(`| CDN-Cache-Control required passed (of ${tot[0].cdnReqN}) | ${tot.map(t => t.cdnReq).join(' | ')} |`)
out(`| CDN-Cache-Control checks "yes" (of ${tot[0].cdnChkN}) | ${tot.map(t => t.cdnChk).join(' | ')} |`)
out('')

out('### Beside the published anchors')
out('')
out('The issue\'s figures (cache-tests.fyi), and the same count made by this summary from the snapshot\'s ' +
  '`results/*.json` (the published runs, with their versions in `results/index.mjs`).')
out('')
out('| implementation | required of 150 (issue) | recounted from the snapshot | CDN-Cache-Control passes (recounted) |')
out('|---|---:|---:|---:|')
columns.forEach((c, i) => out(`| **${c.name} (this run)** | | **${tot[i].req}** | ${tot[i].cdnReq + tot[i].cdnOpt} |`))
for (const [name, file, issued] of ANCHORS) {
  const f = path.join(suiteDir, 'results', file)
  if (!fs.existsSync(f)) { out(`| ${name} | ${issued} | (no ${file}) | |`); continue }
  const t = totals(JSON.parse(fs.readFileSync(f, 'utf8')))
  out(`| ${name} | ${issued} | ${t.req} | ${t.cdnReq + t.cdnOpt} |`)
}
out('')

out('## Per suite')
out('')
out('Passed / tests of each kind (checks: answered "yes"); `-`: the suite has none of that kind.')
out('')
const perCol = (kind, s) => {
  const ts = runnable(s).filter(t => kindOf(t) === kind)
  if (ts.length === 0) return colNames.map(() => '-')
  return columns.map(c => `${ts.filter(t => passed(c.results, t)).length}/${ts.length}`)
}
out(`| suite | ${['required', 'optimal', 'check'].flatMap(k => colNames.map(n => `${k}: ${n}`)).join(' | ')} |`)
out(`|---|${['required', 'optimal', 'check'].flatMap(() => colNames.map(() => '---:')).join('|')}|`)
for (const s of tests) {
  if (runnable(s).length === 0) continue
  out(`| ${esc(s.name)} (\`${s.id}\`) | ${['required', 'optimal', 'check'].flatMap(k => perCol(k, s)).join(' | ')} |`)
}
out('')

// Failing required tests of the first column (shardline), with every column's symbol beside.
const first = columns[0]
const symbols = t => columns.map(c => verdict(c.results, t.id)[2] || '-').join(' | ')
const detail = (results, id) => {
  const r = results[id]
  if (r === undefined) return 'not run'
  if (r === true) return ''
  return esc(Array.isArray(r) ? r.slice(1).join(' ') : JSON.stringify(r)).slice(0, 160)
}
const failingIn = (inCdn) => tests.filter(s => (s.id === CDN) === inCdn).flatMap(s =>
  runnable(s).filter(t => kindOf(t) === 'required' && !passed(first.results, t)).map(t => [s, t]))
// Why a column's result is not a pass: its outcome and the message of the test's own run.
const why = (c, t) => {
  const v = verdict(c.results, t.id)
  if (v === resultTypes.pass || v === resultTypes.yes) return ''
  return v === resultTypes.dependency_fail
    ? `needs ${t.depends_on.join(', ')}; ran: ${detail(c.results, t.id) || 'passed'}`
    : `${outcomeName(v).replace('_', ' ')}: ${detail(c.results, t.id)}`
}
const diagnostic = columns.filter(c => c.name.includes('diagnostic'))
const failTable = (rows) => {
  out(`| id | suite | test | ${colNames.join(' | ')} | ${[first, ...diagnostic].map(c => `${c.name}: outcome, message`).join(' | ')} |`)
  out(`|---|---|---|${colNames.map(() => ':---:').join('|')}|${[first, ...diagnostic].map(() => '---').join('|')}|`)
  for (const [s, t] of rows) {
    out(`| \`${t.id}\` | ${s.id} | ${esc(t.name)} | ${symbols(t)} | ${[first, ...diagnostic].map(c => why(c, t)).join(' | ')} |`)
  }
  out('')
}
const reqFails = failingIn(false)
out(`## ${first.name}'s failing required tests (${reqFails.length} of ${tot[0].reqN})`)
out('')
out('`perf/cache-tests/FAILURES.md` groups them by cause (a hand-written reading of one dated run: check its date against this one).')
out('')
out('Symbols as on cache-tests.fyi: ✅ pass, ⛔️ fail, ⚪️ a prerequisite did not pass, 🔹 setup failed, ⁉️ harness error, ↻ retried. ' +
  'For a dependency failure the message is what the test itself saw when it ran.')
out('')
failTable(reqFails)
const cdnFails = failingIn(true)
out(`### CDN-Cache-Control required tests ${first.name} fails (${cdnFails.length} of ${tot[0].cdnReqN})`)
out('')
failTable(cdnFails)

if (meta.notes && meta.notes.length) {
  out('## Notes')
  out('')
  for (const n of meta.notes) out(`- ${n}`)
  out('')
}
fs.writeFileSync(outFile, lines.join('\n'))
console.error(`wrote ${outFile}: required ${columns.map((c, i) => `${c.name} ${tot[i].req}/${tot[i].reqN}`).join(', ')}`)
