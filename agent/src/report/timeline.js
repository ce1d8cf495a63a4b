// mt-agent report: a hit's timeline on a <canvas> (issue 26 §1), drawn
// from the JSON of its `.tl` element (timeline_page.rs) when the hit's
// section opens. Times are ns after the timeline's start.
"use strict";
const TL = {
  label: 78, axis: 18, lane: 14, gap: 3, row: 15, fgRow: 16, font: "11px sans-serif",
  col: { on: "#e0793a", rq: "#f2c14e", bl: "#4f7fc9", tick: "#444", lane: "#f6f6f6" },
  mark: { call_start: "#1a8f1a", hit: "#d00000", switch: "#8a2be2", ring_start: "#008b8b" },
  markName: { call_start: "call start", hit: "hit", switch: "perf's switch", ring_start: "ring start" },
};

// "12.3 ms" for a duration in ns.
function tlDur(ns) {
  const a = Math.abs(ns);
  if (a >= 1e9) return (ns / 1e9).toFixed(3) + " s";
  if (a >= 1e6) return (ns / 1e6).toFixed(a >= 1e8 ? 0 : 2) + " ms";
  if (a >= 1e3) return (ns / 1e3).toFixed(1) + " µs";
  return ns + " ns";
}

// A warm colour per name, stable (as inferno's "hot" palette).
function tlColour(name) {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619);
  const u = (s) => ((h >>> s) & 255) / 255;
  return `rgb(${205 + Math.round(50 * u(0))},${Math.round(80 + 150 * u(8))},${Math.round(55 * u(16))})`;
}

// Builds the timeline of `el` once; returns its object.
function mtTimeline(el) {
  if (el._tl) return el._tl;
  const d = JSON.parse(el.querySelector("script.tl-data").textContent);
  const tl = new Timeline(el, d);
  el._tl = tl;
  return tl;
}

class Timeline {
  constructor(el, d) {
    this.el = el;
    this.d = d;
    this.span = Math.max(1, d.span);
    this.v0 = 0;
    this.v1 = this.span;
    this.sel = null;
    this.zero = (d.marks.find((m) => m[0] === "hit") || [null, 0])[1];
    let depth = 0;
    for (let i = 0; i < d.boxes.length; i += 4) depth = Math.max(depth, d.boxes[i] + 1);
    this.chartY = TL.axis + d.lanes.length * (TL.lane + TL.gap) + 6;
    this.height = this.chartY + depth * TL.row + 4;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "tl-canvas";
    this.tip = document.createElement("div");
    this.tip.className = "tl-tip";
    el.append(this.canvas);
    document.body.append(this.tip);
    this.range = new RangeGraph(el, d, this);
    this.listen();
    this.resize();
    // Only a new width redraws (a height change is the drawing's own).
    new ResizeObserver(() => Math.max(320, el.clientWidth) !== this.width && this.resize()).observe(el);
    this.range.show(0, this.span);
  }

  resize() {
    const w = Math.max(320, this.el.clientWidth);
    const r = window.devicePixelRatio || 1;
    this.width = w;
    this.canvas.width = Math.round(w * r);
    this.canvas.height = Math.round(this.height * r);
    this.canvas.style.width = w + "px";
    this.canvas.style.height = this.height + "px";
    this.draw();
    this.range.draw();
  }

  x(t) {
    return TL.label + ((t - this.v0) / (this.v1 - this.v0)) * (this.width - TL.label);
  }

  t(x) {
    return this.v0 + ((x - TL.label) / (this.width - TL.label)) * (this.v1 - this.v0);
  }

  // Where each mark is drawn, CSS px (for the browser test too).
  markX() {
    return this.d.marks.map(([kind, t]) => ({ kind, t, x: this.x(t), colour: TL.mark[kind] }));
  }

  draw() {
    const c = this.canvas.getContext("2d");
    const r = this.canvas.width / this.width;
    c.setTransform(r, 0, 0, r, 0, 0);
    c.clearRect(0, 0, this.width, this.height);
    c.font = TL.font;
    c.textBaseline = "middle";
    this.drawAxis(c);
    this.drawLanes(c);
    this.drawChart(c);
    this.drawSelection(c);
    this.drawMarks(c);
  }

  drawAxis(c) {
    c.fillStyle = "#eaeaea";
    c.fillRect(TL.label, 0, this.width - TL.label, TL.axis);
    const dt = this.v1 - this.v0;
    const raw = dt / 8;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
    c.fillStyle = "#333";
    const first = Math.ceil((this.v0 - this.zero) / step) * step + this.zero;
    for (let t = first; t <= this.v1; t += step) {
      const x = this.x(t);
      c.fillRect(x, TL.axis - 5, 1, 5);
      c.fillText(tlDur(t - this.zero), x + 2, TL.axis / 2 - 2);
    }
    c.fillText(this.zero ? "from the hit" : "", 2, TL.axis / 2);
  }

  drawLanes(c) {
    this.d.lanes.forEach((l, i) => {
      const y = TL.axis + i * (TL.lane + TL.gap) + TL.gap;
      c.fillStyle = TL.col.lane;
      c.fillRect(TL.label, y, this.width - TL.label, TL.lane);
      c.fillStyle = "#222";
      c.font = (l.tid === this.d.tid ? "bold " : "") + TL.font;
      c.fillText("tid " + l.tid, 2, y + TL.lane / 2);
      c.font = TL.font;
      for (const k of ["on", "rq", "bl"]) if (l[k]) this.drawIntervals(c, l[k], TL.col[k], y);
      if (l.ticks) {
        c.fillStyle = TL.col.tick;
        for (const t of l.ticks) if (t >= this.v0 && t <= this.v1) c.fillRect(this.x(t), y + 2, 1, TL.lane - 4);
      }
    });
  }

  drawIntervals(c, v, colour, y) {
    c.fillStyle = colour;
    for (let i = 0; i < v.length; i += 2) {
      if (v[i + 1] < this.v0 || v[i] > this.v1) continue;
      const x0 = Math.max(TL.label, this.x(v[i]));
      const x1 = Math.min(this.width, this.x(v[i + 1]));
      c.fillRect(x0, y, Math.max(1, x1 - x0), TL.lane);
    }
  }

  drawChart(c) {
    const b = this.d.boxes;
    c.save();
    c.beginPath();
    c.rect(TL.label, this.chartY, this.width - TL.label, this.height - this.chartY);
    c.clip();
    for (let i = 0; i < b.length; i += 4) {
      if (b[i + 3] < this.v0 || b[i + 2] > this.v1) continue;
      const x0 = this.x(b[i + 2]);
      const w = Math.max(1, this.x(b[i + 3]) - x0);
      const y = this.chartY + b[i] * TL.row;
      const name = this.d.names[b[i + 1]];
      c.fillStyle = tlColour(name);
      c.fillRect(x0, y, w, TL.row - 1);
      if (w > 28) {
        c.fillStyle = "#000";
        const left = Math.max(x0, TL.label) + 2;
        c.fillText(tlFit(c, name, x0 + w - left - 2), left, y + TL.row / 2);
      }
    }
    c.restore();
    c.fillStyle = "#222";
    if (b.length) c.fillText("stacks", 2, this.chartY + TL.row / 2);
  }

  drawSelection(c) {
    if (!this.sel) return;
    const x0 = this.x(Math.min(this.sel[0], this.sel[1]));
    const x1 = this.x(Math.max(this.sel[0], this.sel[1]));
    c.fillStyle = "rgba(0,110,255,0.15)";
    c.fillRect(x0, 0, Math.max(1, x1 - x0), this.height);
  }

  // Labels first, then the lines over them.
  drawMarks(c) {
    const shown = this.markX().filter((m) => m.x >= TL.label && m.x <= this.width);
    for (const m of shown) {
      // Right of its line, or left of it near the right edge.
      const name = TL.markName[m.kind];
      const w = c.measureText(name).width;
      c.fillStyle = m.colour;
      c.fillText(name, m.x + 3 + w > this.width ? m.x - 3 - w : m.x + 3, TL.axis + 1);
    }
    for (const m of shown) {
      c.fillStyle = m.colour;
      c.fillRect(Math.round(m.x) - 1, 0, 2, this.height);
    }
  }

}

// `s` cut to fit `w` px.
function tlFit(c, s, w) {
  if (c.measureText(s).width <= w) return s;
  let n = Math.floor((s.length * w) / c.measureText(s).width);
  while (n > 0 && c.measureText(s.slice(0, n) + "…").width > w) n--;
  return n > 0 ? s.slice(0, n) + "…" : "";
}

// What is under (x, y): a mark, a box, or a lane's state.
Timeline.prototype.at = function (x, y) {
  const t = this.t(x);
  const px = (this.v1 - this.v0) / (this.width - TL.label);
  const m = this.d.marks.find((m) => Math.abs(m[1] - t) <= 3 * px);
  if (m) return { text: `${TL.markName[m[0]]} at ${tlDur(m[1] - this.zero)}` };
  if (y >= this.chartY) {
    const depth = Math.floor((y - this.chartY) / TL.row);
    const b = this.d.boxes;
    for (let i = 0; i < b.length; i += 4) {
      if (b[i] === depth && b[i + 2] <= t + px && b[i + 3] >= t - px) {
        const name = this.d.names[b[i + 1]];
        const span = `${tlDur(b[i + 2] - this.zero)} to ${tlDur(b[i + 3] - this.zero)}`;
        return { name, text: `${name}\n${span} (${tlDur(b[i + 3] - b[i + 2])})` };
      }
    }
    return null;
  }
  const i = Math.floor((y - TL.axis) / (TL.lane + TL.gap));
  const l = this.d.lanes[i];
  if (!l || y < TL.axis) return { text: `${tlDur(t - this.zero)}` };
  const st = [["on", "on CPU"], ["rq", "runnable"], ["bl", "blocked"]].find(([k]) => tlIn(l[k], t));
  const what = st ? st[1] : l.on ? "no record" : `${l.n} samples (no switch records)`;
  return { text: `tid ${l.tid}: ${what} at ${tlDur(t - this.zero)}` };
};

function tlIn(v, t) {
  if (!v) return false;
  for (let i = 0; i < v.length; i += 2) if (v[i] <= t && t <= v[i + 1]) return true;
  return false;
}

// Zoom, pan, hover, range selection and click.
Timeline.prototype.listen = function () {
  const cv = this.canvas;
  const pos = (e) => {
    const r = cv.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  };
  cv.addEventListener("wheel", (e) => {
    e.preventDefault();
    const [x] = pos(e);
    this.zoom(this.t(Math.max(TL.label, x)), Math.exp(e.deltaY * 0.002));
  }, { passive: false });
  cv.addEventListener("mousedown", (e) => {
    const [x, y] = pos(e);
    const select = e.shiftKey || y < TL.axis;
    this.drag = { x, y, v0: this.v0, v1: this.v1, select, moved: false, t: this.t(x) };
    if (select) this.sel = [this.drag.t, this.drag.t];
    e.preventDefault();
  });
  window.addEventListener("mousemove", (e) => this.move(pos(e), e));
  window.addEventListener("mouseup", (e) => this.up(pos(e)));
  cv.addEventListener("mouseleave", () => (this.tip.style.display = "none"));
  cv.addEventListener("dblclick", () => this.view(0, this.span));
};

Timeline.prototype.view = function (a, b) {
  const w = Math.min(this.span, Math.max(1000, b - a));
  this.v0 = Math.min(Math.max(0, a), this.span - w);
  this.v1 = this.v0 + w;
  this.draw();
};

Timeline.prototype.zoom = function (at, f) {
  this.view(at - (at - this.v0) * f, at + (this.v1 - at) * f);
};

Timeline.prototype.move = function ([x, y], e) {
  const g = this.drag;
  if (!g) return this.hover(x, y, e);
  if (Math.abs(x - g.x) > 3) g.moved = true;
  if (g.select) {
    this.sel = [g.t, Math.min(this.span, Math.max(0, this.t(x)))];
    this.draw();
  } else if (g.moved) {
    const dt = ((x - g.x) / (this.width - TL.label)) * (g.v1 - g.v0);
    this.view(g.v0 - dt, g.v1 - dt);
  }
};

Timeline.prototype.up = function ([x, y]) {
  const g = this.drag;
  if (!g) return;
  this.drag = null;
  if (g.select && g.moved) return this.select(Math.min(...this.sel), Math.max(...this.sel));
  if (g.select) return this.select(0, this.span);
  if (g.moved) return;
  const hit = this.at(x, y);
  if (hit && hit.name) {
    const q = document.getElementById("search");
    if (q) q.value = hit.name;
    if (typeof searchAll === "function") searchAll(hit.name);
  }
};

Timeline.prototype.hover = function (x, y, e) {
  const r = this.canvas.getBoundingClientRect();
  if (x < 0 || y < 0 || x > r.width || y > r.height) return;
  const hit = x >= TL.label ? this.at(x, y) : null;
  this.tip.style.display = hit ? "block" : "none";
  if (!hit) return;
  this.tip.textContent = hit.text;
  this.tip.style.left = e.pageX + 12 + "px";
  this.tip.style.top = e.pageY + 12 + "px";
};

// Selects [a, b] (ns after the start): the range graph shows its samples.
Timeline.prototype.select = function (a, b) {
  this.sel = a === 0 && b === this.span ? null : [a, b];
  this.draw();
  this.range.show(a, b);
  return this.range.total;
};

// The flame graph of the hit thread's samples in a time range.
class RangeGraph {
  constructor(el, d, tl) {
    this.d = d;
    this.tl = tl;
    const box = document.createElement("div");
    box.className = "tl-range";
    box.innerHTML = '<p class="tl-range-title"></p>';
    this.title = box.firstChild;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "tl-fg";
    box.append(this.canvas);
    el.append(box);
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => (tl.tip.style.display = "none"));
  }

  // Counts the samples in [a, b] into a tree, root first.
  show(a, b) {
    const root = { name: "all", n: 0, kids: new Map() };
    const ss = this.d.ss;
    for (let i = 0; i < ss.length; i += 2) {
      if (ss[i] < a || ss[i] > b) continue;
      root.n++;
      let node = root;
      for (const f of this.d.st[ss[i + 1]]) {
        let k = node.kids.get(f);
        if (!k) node.kids.set(f, (k = { name: this.d.sn[f], n: 0, kids: new Map() }));
        k.n++;
        node = k;
      }
    }
    this.root = root;
    this.total = root.n;
    this.range = [a, b];
    const z = this.tl.zero;
    this.title.innerHTML = "";
    this.title.append(
      `Thread ${this.d.tid}'s samples from ${tlDur(a - z)} to ${tlDur(b - z)}: `,
      Object.assign(document.createElement("b"), { className: "tl-total", textContent: String(root.n) }),
      " samples (shift-drag on the timeline, or drag on its time axis, to choose the range).",
    );
    this.draw();
  }

  draw() {
    if (!this.root) return;
    const w = this.tl.width;
    const rows = [];
    this.layout(this.root, 0, 0, w, rows);
    const depth = rows.reduce((m, r) => Math.max(m, r.depth + 1), 1);
    const h = depth * TL.fgRow;
    const r = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(w * r);
    this.canvas.height = Math.round(h * r);
    this.canvas.style.width = w + "px";
    this.canvas.style.height = h + "px";
    const c = this.canvas.getContext("2d");
    c.setTransform(r, 0, 0, r, 0, 0);
    c.font = TL.font;
    c.textBaseline = "middle";
    this.boxes = rows;
    for (const b of rows) {
      b.y = h - (b.depth + 1) * TL.fgRow;
      c.fillStyle = b.depth === 0 ? "#ccc" : tlColour(b.name);
      c.fillRect(b.x, b.y, Math.max(0.5, b.w - 0.5), TL.fgRow - 1);
      if (b.w > 28) {
        c.fillStyle = "#000";
        c.fillText(tlFit(c, b.name, b.w - 4), b.x + 2, b.y + TL.fgRow / 2);
      }
    }
  }

  // Each node's box: children sorted by name, as inferno does.
  layout(node, depth, x, w, out) {
    if (!node.n) return;
    out.push({ name: node.name, n: node.n, depth, x, w });
    let at = x;
    const kids = [...node.kids.values()].sort((p, q) => (p.name < q.name ? -1 : 1));
    for (const k of kids) {
      const kw = (w * k.n) / node.n;
      if (kw >= 0.3) this.layout(k, depth + 1, at, kw, out);
      at += kw;
    }
  }

  hover(e) {
    const r = this.canvas.getBoundingClientRect();
    const [x, y] = [e.clientX - r.left, e.clientY - r.top];
    const b = (this.boxes || []).find((b) => x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + TL.fgRow);
    const tip = this.tl.tip;
    tip.style.display = b ? "block" : "none";
    if (!b) return;
    tip.textContent = `${b.name}\n${b.n} samples (${((100 * b.n) / this.total).toFixed(1)}%)`;
    tip.style.left = e.pageX + 12 + "px";
    tip.style.top = e.pageY + 12 + "px";
  }
}
