// The SDG drawing as a navigable canvas: graphviz lays the graph out (the SVG arrives in the
// `svg` trait); this module only moves the view box (zoom, pan, fit, centre), reports clicks
// (a node selects its op, a grey group node expands, a group's title collapses it) and offers
// a type-ahead search over `index` ([op id, "name kind file:line scope"]).

const HELP = "click a node: select · click a grey group: expand · click a group's title: " +
  "collapse · drag: pan · wheel: zoom · keys: f fit, c centre, + - zoom, arrows pan, / search, " +
  "Esc clear";

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
  search.placeholder = "find an op: name, kind, file:line, scope  ( / )";
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
  button("fit", "fit the whole graph (f)", () => fit(), "tl-fit");
  button("+", "zoom in (+)", () => zoomAt(1 / 1.25), "tl-zoom-in");
  button("−", "zoom out (-)", () => zoomAt(1.25), "tl-zoom-out");
  button("centre", "centre on the selected op (c)", () => centre(true), "tl-centre");
  button("SVG", "download the graph as an SVG file", () => download(), "tl-svg");
  bar.appendChild(search);
  el.append(bar, results, view, status);

  let svg = null, box = null, full = null, drag = null;
  let pending = false;  // a selection to centre on once its node is drawn

  function setBox(b) {
    box = b;
    svg.setAttribute("viewBox", b.map((v) => v.toFixed(2)).join(" "));
    const pct = Math.round((100 * full[2]) / b[2]);
    status.textContent = `zoom ${pct}% of fit · ${svg.querySelectorAll("g.node").length} ` +
      `nodes · ${HELP}`;
    el.dataset.zoom = String(pct);
  }
  function fit() { if (svg) setBox(full.slice()); }
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
    const nodeW = Math.abs(b.x - a.x);
    if (zoomIn && w > nodeW * 8) { h *= (nodeW * 8) / w; w = nodeW * 8; }
    setBox([(a.x + b.x) / 2 - w / 2, (a.y + b.y) / 2 - h / 2, w, h]);
  }
  function draw() {
    view.innerHTML = model.get("svg");
    svg = view.querySelector("svg");
    if (!svg) { status.textContent = ""; return; }
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    svg.style.width = "100%";
    svg.style.height = "100%";
    const vb = svg.viewBox.baseVal;
    full = [vb.x, vb.y, vb.width, vb.height];
    fit();
    mark();
    centre(pending);
    pending = false;
  }
  function download() {
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
  view.addEventListener("wheel", (e) => {
    if (!svg) return;
    e.preventDefault();
    const p = toSvg(e.clientX, e.clientY);
    zoomAt(e.deltaY > 0 ? 1.15 : 1 / 1.15, p?.x, p?.y);
  }, { passive: false });
  view.addEventListener("pointerdown", (e) => {
    if (!svg || e.button !== 0) return;
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
    view.focus();
    const node = e.target.closest("g.node");
    if (node && node.id.startsWith("op")) return select(Number(node.id.slice(2)));
    if (node && node.id.startsWith("g")) return model.send({ toggle: node.id });
    const cluster = e.target.closest("g.cluster");
    if (cluster && e.target.tagName === "text") model.send({ toggle: cluster.id });
  });
  view.addEventListener("keydown", (e) => {
    const step = box ? box[2] / 10 : 0;
    const keys = {
      f: () => fit(), c: () => centre(true), "+": () => zoomAt(1 / 1.25),
      "=": () => zoomAt(1 / 1.25), "-": () => zoomAt(1.25), "/": () => search.focus(),
      Escape: () => select(-1),
      ArrowLeft: () => setBox([box[0] - step, box[1], box[2], box[3]]),
      ArrowRight: () => setBox([box[0] + step, box[1], box[2], box[3]]),
      ArrowUp: () => setBox([box[0], box[1] - step, box[2], box[3]]),
      ArrowDown: () => setBox([box[0], box[1] + step, box[2], box[3]]),
    };
    if (keys[e.key] && svg) { e.preventDefault(); e.stopPropagation(); keys[e.key](); }
  });

  function showResults() {
    const q = search.value.trim().toLowerCase();
    results.replaceChildren();
    if (!q) return;
    const hits = model.get("index").filter(([, text]) => text.toLowerCase().includes(q));
    for (const [id, text] of hits.slice(0, 8)) {
      const row = document.createElement("div");
      row.className = "tl-graph-hit";
      row.textContent = text;
      row.addEventListener("mousedown", (e) => { e.preventDefault(); pick(id); });
      results.appendChild(row);
    }
    if (hits.length > 8) {
      const more = document.createElement("div");
      more.className = "tl-graph-more";
      more.textContent = `… ${hits.length - 8} more: type more of the name`;
      results.appendChild(more);
    }
    if (!hits.length) results.textContent = "no op matches";
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
    if (e.key === "Enter") {
      const first = results.querySelector(".tl-graph-hit");
      if (first) first.dispatchEvent(new MouseEvent("mousedown"));
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
  draw();
  const shown = new IntersectionObserver((entries) => {
    if (entries.some((x) => x.isIntersecting) && svg && !el.dataset.shown) {
      el.dataset.shown = "1";
      fit();
      centre(false);
    }
  });
  shown.observe(view);
  return () => shown.disconnect();
}

export default { render };
