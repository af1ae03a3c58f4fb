// A plotly chart as a small anywidget (chart.py says why not FigureWidget). The figure arrives as JSON (trait `figure_json`, part
// of the comm_open state); plotly.js is loaded once per page from the kernel's PlotlyJS model
// (trait `loader`, a widget reference whose `source` is plotly.min.js as a binary buffer).
// The chart is drawn only while visible: a hidden tab (display: none) defers the draw, and a
// ResizeObserver draws/resizes it when it gets a size. Clicks go to Python with model.send.

function plotlyFrom(model) {
  if (window.Plotly && window.Plotly.react) return Promise.resolve(window.Plotly);
  if (!window.__tempoPlotly) {
    window.__tempoPlotly = (async () => {
      const ref = model.get("loader") || "";
      const loader = await model.widget_manager.get_model(ref.replace(/^IPY_MODEL_/, ""));
      const source = loader.get("source");          // DataView (binary buffer)
      const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      try {
        await new Promise((resolve, reject) => {
          const script = document.createElement("script");
          script.src = url;
          script.onload = resolve;
          script.onerror = () => reject(new Error("plotly.js failed to load"));
          document.head.appendChild(script);
        });
      } finally {
        URL.revokeObjectURL(url);
      }
      if (!window.Plotly) throw new Error("plotly.js did not define window.Plotly");
      return window.Plotly;
    })().catch((err) => { window.__tempoPlotly = null; throw err; });
  }
  return window.__tempoPlotly;
}

function pointsOf(ev) {
  return (ev.points || []).map((p) => ({
    curve: p.curveNumber,
    point: p.pointNumber !== undefined ? p.pointNumber : p.pointIndex,
    x: typeof p.x === "object" ? String(p.x) : p.x,
    y: typeof p.y === "object" ? String(p.y) : p.y,
  }));
}

function render({ model, el }) {
  const gd = document.createElement("div");
  gd.className = "tl-plotly";
  gd.dataset.state = "loading";
  el.appendChild(gd);
  let Plotly = null, dirty = true, bound = false, alive = true, queue = Promise.resolve();
  let lastWidth = 0;

  const visible = () => gd.isConnected && gd.offsetWidth > 0 && gd.offsetHeight >= 0 &&
    gd.getClientRects().length > 0;

  function figure() {
    const fig = JSON.parse(model.get("figure_json") || "{}");
    const layout = fig.layout || {};
    if (!layout.height) layout.height = 360;
    gd.style.minHeight = layout.height + "px";
    const config = { displaylogo: false, responsive: true, ...model.get("config") };
    return { data: fig.data || [], layout, config };
  }

  async function draw() {
    if (!alive) return;
    if (!Plotly) Plotly = await plotlyFrom(model);
    if (!alive) return;
    if (!visible()) { gd.dataset.state = "waiting-for-visible"; return; }
    if (dirty) {
      dirty = false;
      const { data, layout, config } = figure();
      await Plotly.react(gd, data, layout, config);
      if (!bound) {
        bound = true;
        gd.on("plotly_click", (ev) => model.send({ event: "click", points: pointsOf(ev) }));
      }
    } else if (gd.offsetWidth !== lastWidth && gd._fullLayout) {
      await Plotly.Plots.resize(gd);
    }
    lastWidth = gd.offsetWidth;
    gd.dataset.state = "drawn";
  }
  const schedule = () => {
    queue = queue.then(draw).catch((err) => {
      gd.dataset.state = "error";
      gd.textContent = "plot failed: " + err;
      console.error("[tempo_lab plotly]", err);
    });
    return queue;
  };

  model.on("change:figure_json", () => { dirty = true; schedule(); });
  model.on("change:config", () => { dirty = true; schedule(); });
  // display:none -> shown (a tab opens), or the panel is resized: draw now or resize
  const ro = new ResizeObserver(() => {
    if (visible() && (dirty || gd.offsetWidth !== lastWidth)) schedule();
  });
  ro.observe(gd);
  schedule();
  requestAnimationFrame(() => schedule());   // after JupyterLab attaches the view
  return () => {
    alive = false;
    ro.disconnect();
    if (Plotly) Plotly.purge(gd);
  };
}

export default { render };
