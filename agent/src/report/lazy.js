// mt-agent report: each hit's section is a <details>; its graphs and
// timeline travel gzip-compressed and base64-encoded in a
// <script type="application/octet-stream" class="gz"> and are built when
// the section opens (docs/report.md, "Page size").
"use strict";

// Searches every flame graph built so far (each graph's own `search`).
function searchAll(t) {
  for (const f of document.querySelectorAll("iframe.fg")) {
    const w = f.contentWindow;
    if (!w || !w.search) continue;
    if (t) w.search(t);
    else w.reset_search();
  }
}

async function mtInflate(b64) {
  const bin = atob(b64);
  const u = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
  const s = new Blob([u]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Response(s).text();
}

// Builds section `d` once; the promise resolves when its graphs have
// loaded and its timelines are drawn.
function mtBuild(d) {
  if (!d._built) d._built = mtBuildNow(d);
  return d._built;
}

// inferno's scripts, kept once after the parts (embed.rs, `Lazy`); a
// part holds `<!--mt-fg-script-N-->` where its graphs' script goes.
let mtScripts;
function mtFgScripts() {
  if (!mtScripts) mtScripts = Promise.all([...document.querySelectorAll("script.fg-js")].map((s) => mtInflate(s.textContent)));
  return mtScripts;
}

async function mtBuildNow(d) {
  for (const s of d.querySelectorAll("script.gz")) {
    const div = document.createElement("div");
    div.className = "built";
    const [html, scripts] = await Promise.all([mtInflate(s.textContent), mtFgScripts()]);
    div.innerHTML = html.replace(/<!--mt-fg-script-(\d+)-->/g, (_, n) => scripts[n]);
    const loaded = [...div.querySelectorAll("iframe.fg")].map(
      (f) => new Promise((r) => f.addEventListener("load", r, { once: true })),
    );
    s.replaceWith(div);
    await Promise.all(loaded);
  }
  for (const t of d.querySelectorAll(".tl")) mtTimeline(t);
  const q = document.getElementById("search");
  if (q && q.value) {
    for (const f of d.querySelectorAll("iframe.fg")) if (f.contentWindow.search) f.contentWindow.search(q.value);
  }
}

// Opens every hit's section; resolves when all are built.
function mtOpenAll() {
  return Promise.all([...document.querySelectorAll("details.hit")].map((d) => ((d.open = true), mtBuild(d))));
}

// A link to a hit (the table's) opens its section.
function mtReveal() {
  const el = location.hash.length > 1 && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  const d = el && el.closest("details.hit");
  if (d && !d.open) d.open = true;
  if (d) mtBuild(d).then(() => el.scrollIntoView());
}

document.addEventListener("toggle", (e) => e.target.matches("details.hit") && e.target.open && mtBuild(e.target), true);
window.addEventListener("hashchange", mtReveal);
document.addEventListener("DOMContentLoaded", mtReveal);
