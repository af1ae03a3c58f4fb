// The SDG drawing as a navigable canvas: layout.py lays the graph out, each group on its own
// (the SVG arrives in the `svg` trait); this module only moves the view box (zoom, pan, fit, centre), reports clicks
// (a node selects its op, a grey group node expands, a group's title collapses it) and offers
// a type-ahead search over `index` ([op id, "name kind file:line scope"]).

const HELP = "a: the whole graph · click a node: select · click a grey group: expand · click a group's title: " +
  "collapse · drag: pan · wheel: zoom once the graph is clicked (or with Ctrl/⌘), else it " +
  "scrolls the page · keys: f fit, c centre, + - zoom, arrows pan, / search, Esc clear";

function render({ model, el }) {
  el.classList.add("tl-graph");
  const bar = document.createElement("div");
  bar.className = "tl-graph-bar";
  const view = document.createElement("div");
  view.className = "tl-graph-view";
  view.tabIndex = 0;
  // JupyterLab's command-mode keys (c copies a cell, arrows move between cells) stay out
  view.setAttribute("data-lm-suppress-shortcuts", "true");
  const status = document.createElement("div");
  status.className = "tl-graph-status";
  const search = document.createElement("input");
  search.type = "search";
  search.className = "tl-graph-search";
  search.placeholder = "find an op: name, kind:softmax, scope:layer1, line:19, /re/  ( / )";
  search.setAttribute("data-lm-suppress-shortcuts", "true");
  const results = document.createElement("div");
  results.className = "tl-graph-results";
  const button = (text, title, action, cls) => {
    const b = document.createElement("button");
    b.textContent = text;
    b.title = title;
    b.className = "tl-graph-btn " + cls;
    b.addEventListener("click", (e) => { e.preventDefault(); action(); view.focus(); });
    bar.appendChild(b);
  };
  button("fit", "fit the graph (f); where the whole graph would not read, its start at a " +
    "size that reads", () => fit(), "tl-fit");
  button("all", "the whole graph, however small (a)", () => fit(true), "tl-all");
  button("+", "zoom in (+)", () => zoomAt(1 / 1.25), "tl-zoom-in");
  button("−", "zoom out (-)", () => zoomAt(1.25), "tl-zoom-out");
  button("centre", "centre on the selected op (c)", () => centre(true), "tl-centre");
  button("SVG", "download the graph as an SVG file", () => download(), "tl-svg");
  bar.appendChild(search);
  const tip = document.createElement("div");   // what the wheel does, shown when it scrolls
  tip.className = "tl-graph-tip";
  tip.textContent = "click the graph, or hold Ctrl (⌘), to zoom with the wheel";
  el.append(bar, results, view, tip, status);

  let svg = null, box = null, full = null, drag = null;
  let pending = false;  // a selection to centre on once its node is drawn
  let anchor = null;    // a group opened or closed: keep it where it was on screen
  const READ = 8;       // px: the smallest text drawn; smaller labels give way to group names
  const NODE = 10;      // an op label's font size in graph units (layout.py's NODE_FONT)
  let partW = null;     // the width of the view box a fit showing part of the graph set

  function scale() {    // screen px per SVG unit (the SVG keeps its aspect ratio)
    const r = view.getBoundingClientRect();
    return box && r.width ? Math.min(r.width / box[2], r.height / box[3]) : 0;
  }
  let following = false;   // moved by a canvas it pans and zooms with: not sent back
  function setBox(b) {
    box = b;
    if (!following && model.get("sync")) {
      window.dispatchEvent(new CustomEvent("tl-graph-sync", {
        detail: { sync: model.get("sync"), box: b.slice(), source: el } }));
    }
    svg.setAttribute("viewBox", b.map((v) => v.toFixed(2)).join(" "));
    const pct = Math.round((100 * full[2]) / b[2]);
    const part = partW !== null && Math.abs(b[2] - partW) < 1e-6;
    status.textContent = (part ? "fit: part of the graph, at a size that reads (the " +
      "whole graph would not); all (a) shows all of it · " : "") +
      `zoom ${pct}% of the whole graph · ${svg.querySelectorAll("g.node").length} ` +
      `nodes · ${HELP}`;
    el.dataset.zoom = String(pct);
    el.dataset.fit = part ? "part" : pct === 100 ? "all" : "";
    const s = scale();
    el.dataset.scale = s.toFixed(4);   // screen px per graph unit
    detail(s);
    clearTimeout(setBox.timer);
    if (!s) return;   // not on screen yet (a hidden tab): nothing the user has seen
    setBox.timer = setTimeout(() => { model.set("view", box); model.save_changes(); }, 300);
  }
  // Level of detail at ``s`` screen px per graph unit: when op labels would be drawn under
  // READ px, they are hidden and the names of groups (collapsed groups and open groups'
  // titles) are drawn at READ + 2 px instead; an op's name stays, at READ px, where it fits
  // inside its box.
  function detail(s) {
    if (!s || !svg) return;
    const far = 10 * s < READ;
    svg.classList.toggle("tl-far", far);
    el.dataset.far = far ? "1" : "0";
    const size = far ? `${(READ + 2) / s}px` : "";
    const titles = groupTitles();
    titles.forEach(({ text }) => { text.style.fontSize = size; });
    if (names === null) measure();   // sizes exist only once the SVG is on screen
    for (const { text, width, chars } of names) {
      const fits = far && width * s >= chars * READ * 0.62;
      text.classList.toggle("tl-name", fits);
      text.style.fontSize = fits ? `${READ / s}px` : "";
    }
    if (s === detail.scale) return;
    detail.scale = s;
    // Titles drawn larger than their bands (far) would run into each other: outer groups
    // first, a title that overlaps one already shown gives way, and so does the title of a
    // group inside another whose box is on screen under 2.5 titles high.
    // A title taller than half its box is centred on it, not hung from its top, so that
    // it stays over its own box (and the middle of what a closed group draws is on it); so
    // is a closed group's name, which hung from its top ran into the title of the group
    // around it, drawn as large, and gave way (two in three names of a 16-layer decoder).
    const shown = [];
    const high = (READ + 2) / s;    // a far title's height, in graph units
    titles.forEach(({ text, box, depth, bb }) => {
      text.classList.remove("tl-hide");
      if (text.dataset.y === undefined) text.dataset.y = text.getAttribute("y");
      const closed = text.parentElement.classList.contains("node");
      text.setAttribute("y", far && (closed || bb.height < 2 * high) ?
        (bb.y + bb.height / 2 - high / 2).toFixed(1) : text.dataset.y);
      if (!far) return;
      const r = text.getBoundingClientRect();
      if ((depth && box.getBoundingClientRect().height < 2.5 * (READ + 2)) ||
          shown.some((q) => r.left < q.right && q.left < r.right && r.top < q.bottom &&
                     q.top < r.bottom)) text.classList.add("tl-hide");
      else shown.push(r);
    });
  }
  let titled = null;  // open groups' titles and closed groups' names, outer groups first
  function groupTitles() {
    if (titled) return titled;
    const depth = (g) => { let k = 0; for (let p = g.parentElement; p; p = p.parentElement)
      k += p.classList && p.classList.contains("cluster") ? 1 : 0; return k; };
    // (of groups at one depth, the larger boxes first: a layer's name before that of a
    // two-op group above it whose title, drawn larger than its box, would hide it)
    titled = [...svg.querySelectorAll("g.cluster > text, g.node[id^='g'] > text:first-of-type")]
      .map((text) => { const box = text.parentElement.querySelector(":scope > path");
        const bb = box ? box.getBBox() : null;
        return { text, box, bb, depth: depth(text.parentElement),
                 area: bb ? bb.width * bb.height : 0 }; })
      .filter(({ box }) => box)
      .sort((a, b) => a.depth - b.depth || b.area - a.area);
    return titled;
  }
  let names = null;   // op nodes' first lines, with their boxes' widths (graph units)
  function measure() {
    names = [...svg.querySelectorAll("g.node[id^='op']")].map((n) => {
      const text = n.querySelector("text");
      const shape = n.querySelector("polygon, path");
      return text && shape ? { text, width: shape.getBBox().width,
                               chars: text.textContent.length } : null;
    }).filter(Boolean);
  }
  // The share of the labels in view (ops' names, groups' titles and closed groups' names)
  // that are drawn at READ px or more.
  function readShare() {
    const v = view.getBoundingClientRect(), s = scale();
    let all = 0, drawn = 0;
    svg.querySelectorAll("g.node > text:first-of-type, g.cluster > text").forEach((t) => {
      const shape = t.parentElement.querySelector(":scope > path, :scope > polygon");
      const b = (shape || t).getBoundingClientRect();
      if (b.right < v.left || b.left > v.right || b.bottom < v.top || b.top > v.bottom) return;
      all += 1;
      if (t.getBoundingClientRect().height > 0 &&
          parseFloat(getComputedStyle(t).fontSize) * s >= READ - 0.01) drawn += 1;
    });
    return all ? drawn / all : 1;
  }
  // Fit: the whole graph, where at that size at least half the labels in view are drawn
  // (zoomed out, op labels give way to group names); else (a 16-layer decoder with every
  // group open: 341 ops) its start, the first box (or, once drawn, around the selected op), at a
  // size where op labels read (9 px), and the status line says so. ``all``: the whole graph
  // however small.
  function fit(all) {
    if (!svg) return;
    partW = null;
    setBox(full.slice());
    if (all || !scale() || readShare() >= 0.5) return;
    const r = view.getBoundingClientRect(), z = (READ + 1) / NODE;
    partW = Math.min(full[2], r.width / z);
    // the start: the first box drawn at the top level (program order), at the top of the
    // view and centred across it, but not past the left of what is drawn at the top level
    const tops = [...svg.querySelectorAll("#graph0 > g.node > path, #graph0 > g.cluster > path")]
      .map((p) => p.getBBox());
    let x = full[0], y = full[1];
    if (tops.length) {
      const b = tops[0];
      x = Math.max(Math.min(...tops.map((t) => t.x)) - 6, b.x + b.width / 2 - partW / 2);
      y = b.y - 6;
    }
    setBox([x, y, partW, (partW * r.height) / r.width]);
  }
  // A fitted drawing with a `focus` box (a pass diff's first change) is centred on it
  // instead, zoomed in until labels read (12 px), never out.
  function focusView() {
    const f = model.get("focus") || [];
    const r = view.getBoundingClientRect();
    if (!svg || f.length !== 4 || !r.width || !scale()) return;
    const s = Math.max(scale(), 12 / 10);
    const w = r.width / s, h = r.height / s;
    setBox([f[0] + f[2] / 2 - w / 2, f[1] + f[3] / 2 - h / 2, w, h]);
  }
  // A graph taller than wide gets a taller view (up to TALL px), so that fit reads larger,
  // but never taller than what the page shows of it (the notebook's scrolling area, less
  // room for the bar above and the status below), so that all of it can be seen at once.
  const TALL = 900;
  function room() {     // the height of the notebook's scrolling area (JupyterLab's, or the
    // first scrolling element around the canvas), else of the window
    let p = el.closest(".jp-WindowedPanel-outer");
    for (let q = el.parentElement; q && !p; q = q.parentElement) {
      const o = getComputedStyle(q).overflowY;
      if ((o === "auto" || o === "scroll") && q.scrollHeight > q.clientHeight + 1) p = q;
    }
    return Math.min(window.innerHeight, p ? p.clientHeight : window.innerHeight);
  }
  function size() {
    const w = view.getBoundingClientRect().width;
    if (!w) return;
    const want = full ? Math.max(model.get("height"), (w * full[3]) / full[2]) : model.get("height");
    const h = Math.max(200, Math.min(TALL, room() - 90, want));
    view.style.height = `${Math.round(h)}px`;
  }
  function zoomAt(f, cx, cy) {
    if (!svg) return;
    const [x, y, w, h] = box;
    cx = cx ?? x + w / 2;
    cy = cy ?? y + h / 2;
    setBox([cx - (cx - x) * f, cy - (cy - y) * f, w * f, h * f]);
  }
  function toSvg(clientX, clientY) {
    const m = svg.getScreenCTM();
    if (!m) return null;
    const p = svg.createSVGPoint();
    p.x = clientX;
    p.y = clientY;
    return p.matrixTransform(m.inverse());
  }
  function nodeOf(id) { return svg ? svg.querySelector(`g.node[id="op${id}"]`) : null; }
  function mark() {
    if (!svg) return;
    svg.querySelectorAll(".tl-selected").forEach((n) => n.classList.remove("tl-selected"));
    const n = nodeOf(model.get("selected"));
    if (n) n.classList.add("tl-selected");
    el.dataset.selected = String(model.get("selected"));
  }
  function centre(zoomIn) {
    const n = nodeOf(model.get("selected"));
    if (!n) return;
    const r = n.getBoundingClientRect();
    if (!r.width) return;  // not laid out yet (a hidden tab): centred when shown
    const a = toSvg(r.left, r.top), b = toSvg(r.right, r.bottom);
    let [, , w, h] = box;
    if (zoomIn) {          // zoom in until its label reads (12 px text), never out
      const f = Math.min(1, (10 * scale()) / 12);
      w *= f;
      h *= f;
    }
    setBox([(a.x + b.x) / 2 - w / 2, (a.y + b.y) / 2 - h / 2, w, h]);
  }
  function cornerOf(g) {   // a node's or group's box (its outline, not its title)
    const r = (g.querySelector(":scope > path, :scope > polygon") || g).getBoundingClientRect();
    return { x: r.left, y: r.top };
  }
  function draw() {
    const before = box ? box.slice() : null, s0 = scale();
    view.innerHTML = model.get("svg");
    svg = view.querySelector("svg");
    if (!svg) { status.textContent = ""; return; }
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    svg.style.width = "100%";
    svg.style.height = "100%";
    // fit the drawing's own box (data-box): the view box also holds the colour legend that
    // a download keeps, drawn above the graph and hidden here (the HTML legend says it)
    const vb = svg.viewBox.baseVal, own = (svg.getAttribute("data-box") || "").split(" ");
    full = own.length === 4 ? own.map(Number) : [vb.x, vb.y, vb.width, vb.height];
    names = null;
    titled = null;
    detail.scale = null;
    const kept = model.get("view");
    const refit = model.get("refit") !== draw.refit;
    draw.refit = model.get("refit");
    if (refit && before) {
      size();                                 // expand or collapse all: fit what is drawn
      fit();
      focusView();
    } else if (anchor && before && s0) {
      // the group opened or closed keeps its top-left corner under the pointer, at the same
      // zoom: its box is the same open or closed (layout.py), so nothing outside it moves
      const g = svg.querySelector(`[id="${anchor.id}"]`);
      setBox(before);
      if (g) {
        const c = cornerOf(g), p = toSvg(c.x, c.y), q = toSvg(anchor.x, anchor.y);
        if (p && q) setBox([before[0] + p.x - q.x, before[1] + p.y - q.y, before[2], before[3]]);
      }
    } else if (before) {
      setBox(before);                         // a new colouring or mark: the view stays
    } else if (kept && kept.length === 4) {
      setBox(kept.slice());                   // drawn again (a tab shown again): as it was
    } else {
      size();
      fit();
      focusView();
    }
    anchor = null;
    mark();
    centre(pending);
    pending = false;
  }
  function download() {   // the SVG as layout.py made it: light, with its colour legend
    const blob = new Blob([model.get("svg")], { type: "image/svg+xml" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "sdg.svg";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }
  function select(id) {
    model.set("selected", id);
    model.save_changes();
  }

  view.style.height = `${model.get("height")}px`;
  // The wheel zooms once the canvas has the focus (a click in it) or with Ctrl/⌘ held, as maps
  // in web pages do; otherwise it scrolls the page, and a tip says how to zoom.
  view.addEventListener("wheel", (e) => {
    if (!svg) return;
    if (!(e.ctrlKey || e.metaKey || document.activeElement === view)) {
      tip.classList.add("tl-show");
      clearTimeout(tip.timer);
      tip.timer = setTimeout(() => tip.classList.remove("tl-show"), 1500);
      return;
    }
    tip.classList.remove("tl-show");
    e.preventDefault();
    const p = toSvg(e.clientX, e.clientY);
    zoomAt(e.deltaY > 0 ? 1.15 : 1 / 1.15, p?.x, p?.y);
  }, { passive: false });
  view.addEventListener("pointerdown", (e) => {
    if (!svg || e.button !== 0) return;
    view.focus({ preventScroll: true });
    drag = { x: e.clientX, y: e.clientY, box: box.slice(), moved: false };
  });
  view.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (!drag.moved) return;
    const s = svg.getScreenCTM().a || 1;
    setBox([drag.box[0] - dx / s, drag.box[1] - dy / s, drag.box[2], drag.box[3]]);
  });
  const endDrag = () => { setTimeout(() => { drag = null; }, 0); };
  view.addEventListener("pointerup", endDrag);
  view.addEventListener("pointerleave", endDrag);
  view.addEventListener("click", (e) => {
    if (drag && drag.moved) return;
    view.focus({ preventScroll: true });
    const node = e.target.closest("g.node");
    if (node && node.id.startsWith("op")) return select(Number(node.id.slice(2)));
    const toggle = (g) => { anchor = { id: g.id, ...cornerOf(g) }; model.send({ toggle: g.id }); };
    if (node && node.id.startsWith("g")) return toggle(node);
    const cluster = e.target.closest("g.cluster");
    if (cluster && e.target.tagName === "text") toggle(cluster);
  });
  view.addEventListener("keydown", (e) => {
    const step = box ? box[2] / 10 : 0;
    const keys = {
      f: () => fit(), a: () => fit(true), c: () => centre(true), "+": () => zoomAt(1 / 1.25),
      "=": () => zoomAt(1 / 1.25), "-": () => zoomAt(1.25), "/": () => search.focus(),
      Escape: () => select(-1),
      ArrowLeft: () => setBox([box[0] - step, box[1], box[2], box[3]]),
      ArrowRight: () => setBox([box[0] + step, box[1], box[2], box[3]]),
      ArrowUp: () => setBox([box[0], box[1] - step, box[2], box[3]]),
      ArrowDown: () => setBox([box[0], box[1] + step, box[2], box[3]]),
    };
    if (keys[e.key] && svg) { e.preventDefault(); e.stopPropagation(); keys[e.key](); }
  });

  // search: every term must match (search.js, as search.py in Python), best first
  let hits = [], active = 0;
  function findHits(q) { return tlSearch(model.get("index"), q); }
  function showResults() {
    hits = findHits(search.value);
    active = 0;
    results.replaceChildren();
    if (!search.value.trim()) return;
    const head = document.createElement("div");
    head.className = "tl-graph-more";
    head.textContent = hits.length ? `${hits.length} op${hits.length > 1 ? "s" : ""} match · ` +
      "↑ ↓ choose · Enter select · Shift+Enter mark all in the graph" : "no op matches";
    results.appendChild(head);
    const list = document.createElement("div");
    list.className = "tl-graph-list";
    hits.forEach(([, , id, text], k) => {
      const row = document.createElement("div");
      row.className = "tl-graph-hit";
      row.textContent = text;
      row.dataset.op = String(id);
      row.addEventListener("mousedown", (e) => { e.preventDefault(); pick(id); });
      row.addEventListener("mouseenter", () => highlight(k));
      list.appendChild(row);
    });
    results.appendChild(list);
    highlight(0);
  }
  function highlight(k) {
    const rows = results.querySelectorAll(".tl-graph-hit");
    if (!rows.length) return;
    active = (k + rows.length) % rows.length;
    rows.forEach((r, j) => r.classList.toggle("tl-active", j === active));
    rows[active].scrollIntoView({ block: "nearest" });
  }
  function pick(id) {
    search.value = "";
    results.replaceChildren();
    select(id);
    view.focus();
  }
  search.addEventListener("input", showResults);
  search.addEventListener("keydown", (e) => {
    e.stopPropagation();  // keep JupyterLab's command shortcuts out of the search box
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      highlight(active + (e.key === "ArrowDown" ? 1 : -1));
    } else if (e.key === "Enter" && e.shiftKey) {
      model.set("query", search.value.trim());   // Python keeps every hit drawn and marked
      model.save_changes();
      results.replaceChildren();
    } else if (e.key === "Enter") {
      if (hits.length) pick(hits[active][2]);
    } else if (e.key === "Escape") {
      search.value = "";
      results.replaceChildren();
      view.focus();
    }
  });

  model.on("change:svg", draw);
  model.on("change:selected", () => {
    mark();
    if (nodeOf(model.get("selected"))) centre(true);
    else pending = model.get("selected") >= 0;  // its group opens: the new drawing centres
  });
  draw.refit = model.get("refit");
  draw();
  const shown = new IntersectionObserver((entries) => {
    if (entries.some((x) => x.isIntersecting) && svg && !el.dataset.shown) {
      el.dataset.shown = "1";   // first shown (a tab opened): sized now, so fit again
      size();
      if (!(model.get("view") || []).length) { fit(); focusView(); }
      centre(false);
    }
  });
  shown.observe(view);
  const resized = () => { if (svg && el.dataset.shown) size(); };
  window.addEventListener("resize", resized);
  // canvases with the same `sync` name (a pass's before and after) pan and zoom together
  const onSync = (e) => {
    const d = e.detail;
    if (!svg || !d || d.source === el || !model.get("sync") || d.sync !== model.get("sync")) {
      return;
    }
    following = true;
    try { setBox(d.box.slice()); } finally { following = false; }
  };
  window.addEventListener("tl-graph-sync", onSync);
  // the inspector's reads and readers (a.tl-op-link, data-op) beside this canvas: a click
  // selects the op, and the graph centres on it (its groups open first if they are closed)
  const onLink = (e) => {
    const a = e.target && e.target.closest ? e.target.closest("a.tl-op-link") : null;
    if (!a) return;
    const root = a.closest(".tempo-lab-sdg");
    if (!root || !root.contains(el)) return;
    e.preventDefault();
    select(Number(a.dataset.op));
  };
  document.addEventListener("click", onLink);
  return () => {
    shown.disconnect();
    document.removeEventListener("click", onLink);
    window.removeEventListener("resize", resized);
    window.removeEventListener("tl-graph-sync", onSync);
  };
}

export default { render };
