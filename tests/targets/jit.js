// The JIT test's Node.js target (tests/tests/jit.rs): prints `ready`, then
// on a line of stdin runs `buildReport` (JIT-compiled code, named only in
// the perf map that `node --perf-basic-prof` writes) for SECONDS seconds,
// between turns of the event loop, then asks the host name once (libuv's
// uv_os_gethostname, libc's gethostname: the trigger, called nowhere else
// after `ready`), so the hit's snapshot holds the whole run, and exits
// 300 ms later.
const SECONDS = Number(process.argv[1] || 2);

function buildReport(n) {
  const t0 = process.hrtime.bigint();
  const rows = [];
  for (let i = 0; i < n; i++) rows.push({ id: i, name: "row" + i, v: Math.sqrt(i) });
  let s = 0;
  for (const r of rows) s += r.v + r.name.length;
  return s + Number(process.hrtime.bigint() - t0) * 0;
}

console.log("ready");
process.stdin.once("data", () => {
  const end = Date.now() + SECONDS * 1000;
  let total = 0;
  (function tick() {
    total += buildReport(20000);
    if (Date.now() < end) setImmediate(tick);
    else {
      require("os").hostname();
      console.log(`done ${total}`);
      setTimeout(() => process.exit(0), 300);
    }
  })();
});
