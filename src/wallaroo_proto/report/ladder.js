// The ladder diagrams: drawn from each connection's JSON frames into SVG, with paging and zoom.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const LANE_A = 230, LANE_B = 760, WIDTH = 900, HEAD = 46;

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function cut(text, n) {
    return text.length > n ? text.slice(0, n - 1) + "\u2026" : text;
  }

  const BEFORE = 5; // frames drawn above the one a view opens at

  class Ladder {
    constructor(root, data) {
      this.root = root;
      this.data = data;
      this.kept = data.head.concat(data.middle || [], data.tail);
      this.pageSize = Math.max(2 * data.shown, 10);
      this.from = null; // null: the first and the last frames; else the view's first kept frame
      this.row = 26;
      this.svg = root.querySelector("svg.ladder");
      this.status = root.querySelector(".ladder-status");
      root.querySelectorAll("button[data-act]").forEach((b) =>
        b.addEventListener("click", () => this.act(b.dataset.act)));
      // A connection with findings opens at its first one (what went wrong, before the handshake),
      // unless its first and last frames, the view it opens on otherwise, already show it.
      if (data.first == null || this.showsAtFirst(data.first) || !this.openAt(data.first)) this.draw();
    }

    showsAtFirst(index) {
      const at = this.kept.findIndex((f) => f[0] === index), n = this.data.shown;
      return at >= 0 && (this.kept.length <= 2 * n || at < n || at >= this.kept.length - n);
    }

    act(what) {
      const next = (this.from ?? -this.pageSize) + this.pageSize;
      if (what === "ends") this.from = null;
      else if (what === "prev") this.from = Math.max(0, (this.from ?? 0) - this.pageSize);
      else if (what === "next" && next < this.kept.length) this.from = next;
      else if (what === "in") this.row = Math.min(80, Math.round(this.row * 1.4));
      else if (what === "out") this.row = Math.max(12, Math.round(this.row / 1.4));
      this.draw();
    }

    // Open the view at the frame with this index, a few frames above it; false when not kept.
    openAt(index) {
      const at = this.kept.findIndex((f) => f[0] === index);
      if (at < 0) return false;
      this.from = Math.max(0, at - BEFORE);
      this.draw();
      return true;
    }

    // The rows of the current view: frames, and the elisions between them.
    rows() {
      const kept = this.kept, d = this.data, n = d.shown;
      const out = [];
      const pushRange = (from, to) => {
        for (let i = from; i < to; i++) {
          const missing = i > 0 ? kept[i][10] - kept[i - 1][10] - 1 : 0;
          if (missing > 0)
            out.push({ elision: `\u2026 ${missing} frames not kept in this report (bounded) \u2026` });
          out.push({ frame: kept[i] });
        }
      };
      if (this.from === null) {
        if (kept.length <= 2 * n) pushRange(0, kept.length);
        else {
          pushRange(0, n);
          const hidden = kept[kept.length - n][10] - kept[n - 1][10] - 1;
          out.push({ elision: `\u2026 ${hidden} more frames: page through them \u2026`, paging: true });
          pushRange(kept.length - n, kept.length);
        }
      } else {
        pushRange(this.from, Math.min(kept.length, this.from + this.pageSize));
      }
      return out;
    }

    draw() {
      const svg = this.svg, d = this.data, row = this.row;
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      const defs = el("defs");
      for (const [id, colour] of [["ah", "#333"], ["ahb", "#d62828"]]) {
        const m = el("marker", { id: `${id}-${d.id}`, viewBox: "0 0 10 10", refX: 10, refY: 5,
          markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
        m.appendChild(el("path", { d: "M0,0 L10,5 L0,10 z", fill: colour }));
        defs.appendChild(m);
      }
      svg.appendChild(defs);
      const rows = this.rows();
      let y = HEAD;
      const body = el("g");
      for (const r of rows) {
        if (r.elision) {
          const g = el("g", { class: "elision" });
          g.appendChild(el("text", { x: (LANE_A + LANE_B) / 2, y: y + 14, "text-anchor": "middle" }, r.elision));
          body.appendChild(g);
          y += 22;
          continue;
        }
        const [index, ts, outbound, label, fields, packet, bad, violations, notes, finding] = r.frame;
        for (const note of notes) {
          const g = el("g", { class: "note" });
          g.appendChild(el("line", { x1: 4, x2: WIDTH - 4, y1: y + 6, y2: y + 6 }));
          g.appendChild(el("text", { x: (LANE_A + LANE_B) / 2, y: y + 3, "text-anchor": "middle" }, cut(note, 110)));
          body.appendChild(g);
          y += 16;
        }
        const [x1, x2] = outbound ? [LANE_A, LANE_B] : [LANE_B, LANE_A];
        const kind = bad ? "arrow bad" : finding ? `arrow finding sev-${finding[0]}` : "arrow";
        const g = el("g", { class: kind, id: `f-${d.id}-${index}` });
        const why = violations.length ? violations[0] : finding ? finding[1] : null;
        const top = y + Math.max(12, row * 0.55);
        g.appendChild(el("text", { x: 8, y: top, class: "time" }, (ts - d.t0).toFixed(6)));
        g.appendChild(el("text", { x: 96, y: top, class: "meta" }, `#${index} p${packet ?? "?"}`));
        g.appendChild(el("line", { x1, y1: top - 4, x2, y2: top + Math.min(10, row * 0.35),
          "marker-end": `url(#${bad ? "ahb" : "ah"}-${d.id})` }));
        const words = fields ? `${label}  ${fields}` : label;
        g.appendChild(el("text", { x: (LANE_A + LANE_B) / 2, y: top - 7, "text-anchor": "middle", class: "label" },
          cut(words, 84)));
        if (why !== null && row >= 20)
          g.appendChild(el("text", { x: (LANE_A + LANE_B) / 2, y: top + 16, "text-anchor": "middle", class: "why" },
            cut(why, 90)));
        const tip = [`frame ${index}, packet ${packet}`, words].concat(violations, notes, finding ? [finding.join(": ")] : []).join("\n");
        g.appendChild(el("title", {}, tip));
        body.appendChild(g);
        y += row + (why !== null && row >= 20 ? 12 : 0);
      }
      const height = y + 10;
      for (const [x, title] of [[LANE_A, d.lanes[0]], [LANE_B, d.lanes[1]]]) {
        svg.appendChild(el("line", { x1: x, x2: x, y1: HEAD - 12, y2: height, class: "lane" }));
        svg.appendChild(el("text", { x, y: 18, "text-anchor": "middle", class: "lane-title" }, title));
      }
      svg.appendChild(el("text", { x: 8, y: 36, class: "meta" }, "seconds"));
      svg.appendChild(el("text", { x: 96, y: 36, class: "meta" }, "frame, packet"));
      svg.appendChild(body);
      svg.setAttribute("viewBox", `0 0 ${WIDTH} ${height}`);
      svg.setAttribute("width", WIDTH);
      svg.setAttribute("height", height);
      const shown = rows.filter((r) => r.frame);
      const where = this.from === null ? "first and last frames"
        : `frames #${shown[0].frame[0]} to #${shown[shown.length - 1].frame[0]}`;
      const kept = this.kept.length < d.total ? `, ${this.kept.length} of ${d.total} kept` : "";
      this.status.textContent = `${where} (${d.total} frames${kept})`;
    }

    // Show the frame with this index (from a table's link or the address), opening the view at it.
    show(index) {
      let target = this.svg.querySelector(`#f-${this.data.id}-${index}`);
      if (!target) {
        if (!this.openAt(index)) return false;
        target = this.svg.querySelector(`#f-${this.data.id}-${index}`);
      }
      target.scrollIntoView({ block: "center" });
      target.classList.add("flash");
      setTimeout(() => target.classList.remove("flash"), 1600);
      return true;
    }
  }

  const ladders = {};
  document.querySelectorAll("div.ladder-box").forEach((root) => {
    const data = JSON.parse(document.getElementById(root.dataset.frames).textContent);
    ladders[data.id] = new Ladder(root, data);
  });
  document.querySelectorAll("a[data-goto]").forEach((a) =>
    a.addEventListener("click", (event) => {
      const [id, index] = a.dataset.goto.split(":");
      if (ladders[id] && ladders[id].show(Number(index))) event.preventDefault();
    }));
  // An address such as report.html#f-c1-1-25 opens that frame's ladder at it.
  const fromAddress = () => {
    const m = /^#f-(c\d+-\d+)-(\d+)$/.exec(location.hash);
    if (m && ladders[m[1]]) ladders[m[1]].show(Number(m[2]));
  };
  window.addEventListener("hashchange", fromAddress);
  fromAddress();
  document.body.dataset.ladders = String(Object.keys(ladders).length);
})();
