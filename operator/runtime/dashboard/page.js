/* Pliant's dashboard page (docs/dashboard.md). It keeps a state made from the feed's
 * events (PliantDashboard.apply) and draws it (PliantDashboard.render): the same code
 * renders a live feed (WebSocket /feed) or a history built into the page (a script
 * element #pliant-history holding the events as a JSON array: a static report). No
 * library, nothing fetched but the feed. */
(function () {
  "use strict";

  var PALETTE = ["#60a5fa", "#f472b6", "#34d399", "#fbbf24", "#a78bfa", "#f87171",
                 "#2dd4bf", "#fb923c", "#94a3b8", "#a3e635"];

  function newState() {
    return { hello: null, steps: [], plan: null, reconfigs: [], checkpoints: [],
             timeline: [], phase: null };
  }

  /* One event into the state. */
  function apply(st, ev) {
    switch (ev.type) {
      case "hello": st.hello = ev; break;
      case "step": st.steps.push(ev); break;
      case "plan": st.plan = ev; break;
      case "phase": st.phase = ev; break;
      case "reconfig":
        ev.recovered = null;
        st.reconfigs.push(ev);
        st.timeline.push(ev);
        break;
      case "recovered":
        st.reconfigs.forEach(function (r) { if (r.index === ev.index) r.recovered = ev; });
        break;
      case "checkpoint":
        st.checkpoints.push(ev);
        st.timeline.push(ev);
        break;
      case "notice": st.timeline.push(ev); break;
      default: break; /* newer event types: ignored */
    }
  }

  function $(id) { return document.getElementById(id); }

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;" }[c];
    });
  }

  function fmtNum(x, digits) {
    if (x === undefined || x === null || !isFinite(x)) return "–";
    if (Math.abs(x) >= 1e6) return (x / 1e6).toFixed(2) + " M";
    if (Math.abs(x) >= 1e4) return (x / 1e3).toFixed(1) + " k";
    return x.toFixed(digits === undefined ? 0 : digits);
  }

  function fmtBytes(b) {
    if (!b) return "0 B";
    var u = ["B", "kB", "MB", "GB", "TB"], i = 0;
    while (b >= 1000 && i < u.length - 1) { b /= 1000; i++; }
    return b.toFixed(i ? 1 : 0) + " " + u[i];
  }

  function fmtSecs(s) {
    if (s === undefined || s === null || s < 0) return "–";
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    var m = Math.floor(s / 60);
    if (m < 60) return m + " min " + Math.round(s - 60 * m) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " min";
  }

  /* ---- charts: SVG drawn here ---- */

  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    var err = (hi - lo) / n / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    var ticks = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) ticks.push(v);
    return ticks;
  }

  /* An SVG line chart: series [{cls, points: [[x, y]...], dots}], vertical markers
   * [{x, cls, title}], over x in [x0, x1]. Each series is one polyline whose points are
   * its points, in order (the tests count them). */
  function lineChart(el, series, markers, x0, x1) {
    var W = el.clientWidth || 600, H = 220, L = 48, R = 8, T = 8, B = 20;
    var ys = [];
    series.forEach(function (s) { s.points.forEach(function (p) { ys.push(p[1]); }); });
    var y0 = ys.length ? Math.min.apply(null, ys) : 0, y1 = ys.length ? Math.max.apply(null, ys) : 1;
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    if (!(x1 > x0)) x1 = x0 + 1;
    function sx(x) { return L + (x - x0) / (x1 - x0) * (W - L - R); }
    function sy(y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); }
    var out = ['<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ' + W + " " + H + '">'];
    niceTicks(y0, y1, 4).forEach(function (v) {
      out.push('<line class="axis" x1="' + L + '" x2="' + (W - R) + '" y1="' + sy(v) + '" y2="' +
               sy(v) + '"/><text x="' + (L - 4) + '" y="' + (sy(v) + 3) +
               '" text-anchor="end">' + fmtNum(v, v < 10 ? 2 : 0) + "</text>");
    });
    niceTicks(x0, x1, 6).forEach(function (v) {
      if (v !== Math.round(v)) return;
      out.push('<text x="' + sx(v) + '" y="' + (H - 6) + '" text-anchor="middle">' + v + "</text>");
    });
    markers.forEach(function (m) {
      out.push('<line class="' + m.cls + '" x1="' + sx(m.x) + '" x2="' + sx(m.x) + '" y1="' + T +
               '" y2="' + (H - B) + '"><title>' + esc(m.title) + "</title></line>");
    });
    series.forEach(function (s) {
      var pts = s.points.map(function (p) { return sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); });
      out.push('<polyline class="' + s.cls + '" data-series="' + s.cls + '" points="' +
               pts.join(" ") + '"/>');
      if (s.dots) s.points.forEach(function (p) {
        out.push('<circle class="' + s.cls + '-pt" r="2.5" cx="' + sx(p[0]) + '" cy="' + sy(p[1]) + '"/>');
      });
    });
    out.push("</svg>");
    el.innerHTML = out.join("");
  }

  function renderCharts(st) {
    var steps = st.steps, total = st.hello ? st.hello.steps : 0;
    var x1 = Math.max(total - 1, steps.length ? steps[steps.length - 1].step : 1);
    var markers = st.reconfigs.map(function (r) {
      return { x: r.step, cls: "reconf", title: "generation " + r.generation + ": " + r.cause };
    }).concat(st.checkpoints.filter(function (c) { return !c.error; }).map(function (c) {
      return { x: c.step, cls: "ckpt", title: "checkpoint of step " + c.step };
    }));
    var train = steps.filter(function (s) { return s.loss !== undefined; })
                     .map(function (s) { return [s.step, s.loss]; });
    var val = steps.filter(function (s) { return s.val_loss !== undefined; })
                   .map(function (s) { return [s.step, s.val_loss]; });
    var series = [{ cls: "train", points: train }];
    if (val.length) series.push({ cls: "val", points: val, dots: true });
    $("loss-fig").hidden = !!(st.hello && st.hello.simulated); /* a simulation has no loss */
    lineChart($("loss-chart"), series, markers, 0, x1);
    lineChart($("tps-chart"), [{ cls: "tps", points: steps.map(function (s) {
      return [s.step, s.tokens_per_second]; }) }], markers, 0, x1);
  }

  /* ---- the pipeline map: one row per worker, one cell per layer, kept in place ---- */

  function renderMap(st) {
    var plan = st.plan;
    $("map-section").hidden = !plan && !!(st.hello && st.hello.simulated);
    if (!plan) return;
    var nl = plan.layers || 0;
    plan.workers.forEach(function (w) { if (w.layers.length) nl = Math.max(nl, w.layers[1]); });
    var table = $("map"), head = table.tHead, body = table.tBodies[0];
    if (head.dataset.layers !== String(nl)) {
      var h = "<tr><th>worker</th><th>zone</th><th>device</th><th>state</th><th>pipeline</th>";
      for (var l = 0; l < nl; l++) h += '<th class="layer">' + l + "</th>";
      head.innerHTML = h + "</tr>";
      head.dataset.layers = String(nl);
      body.innerHTML = "";
    }
    var rows = {};
    Array.prototype.forEach.call(body.rows, function (tr) { rows[tr.dataset.worker] = tr; });
    plan.workers.forEach(function (w) {
      var tr = rows[w.name];
      if (!tr) {
        tr = body.insertRow();
        tr.dataset.worker = w.name;
        var html = '<td class="name"></td><td class="zone"></td><td class="device"></td>' +
                   '<td><span class="state"></span></td><td class="pipe"></td>';
        for (var l = 0; l < nl; l++) html += '<td class="cell" data-layer="' + l + '"></td>';
        tr.innerHTML = html;
      }
      tr.className = w.state;
      tr.cells[0].textContent = w.name;
      tr.cells[1].textContent = w.zone || "–";
      tr.cells[2].textContent = w.device;
      var badge = tr.cells[3].firstChild;
      badge.className = "state " + w.state;
      badge.textContent = w.state;
      tr.cells[4].textContent = w.pipeline >= 0 ? "p" + w.pipeline + "." + w.stage : "–";
      for (var l = 0; l < nl; l++) {
        var td = tr.cells[5 + l];
        var held = w.layers.length && l >= w.layers[0] && l < w.layers[1];
        if (held) {
          td.dataset.pipeline = String(w.pipeline);
          td.style.backgroundColor = PALETTE[w.pipeline % PALETTE.length];
          td.title = w.name + ": layer " + l + ", pipeline " + w.pipeline + ", stage " + w.stage;
        } else {
          delete td.dataset.pipeline;
          td.style.backgroundColor = "";
          td.title = "";
        }
      }
    });
  }

  /* ---- the timeline ---- */

  function reconfigItem(r) {
    var rec = r.recovered;
    var facts = [
      "removed " + (r.removed.length ? r.removed.join(", ") : "–"),
      "added " + (r.added.length ? r.added.join(", ") : "–"),
      rec ? fmtBytes(rec.bytes_copied) + " copied" : fmtBytes(r.bytes_planned) + " to copy",
      rec ? "recovered in " + fmtSecs(rec.duration_ms / 1000) : "recovering…",
      r.from_checkpoint ? "restarted from the checkpoint of step " + r.step : "no checkpoint read",
      "pipelines " + r.pipelines
    ];
    return '<li class="reconfig" data-generation="' + r.generation + '"><span class="when">' +
           fmtSecs(r.t) + "</span><b>generation " + r.generation + "</b> at step " + r.step +
           ": " + esc(r.cause) + '<div class="facts">' + esc(facts.join(" · ")) + "</div></li>";
  }

  function timelineItem(e) {
    if (e.type === "reconfig") return reconfigItem(e);
    var when = '<span class="when">' + fmtSecs(e.t) + "</span>";
    if (e.type === "checkpoint")
      return '<li class="checkpoint">' + when + "checkpoint of step " + e.step +
             (e.error ? " failed: " + esc(e.error) : " complete") + "</li>";
    return '<li class="notice" data-what="' + esc(e.what) + '">' + when +
           (e.worker ? "<b>" + esc(e.worker) + "</b> " : "") + esc(e.what) + ": " +
           esc(e.detail) + "</li>";
  }

  function renderTimeline(st) {
    var items = st.timeline.slice().reverse().map(timelineItem);
    $("timeline").innerHTML = items.join("");
  }

  /* ---- the summary cards ---- */

  /* "2x3+1x2": pipelines by their stage count, largest first (the metrics' notation). */
  function pipelinesOf(plan) {
    var stages = {};
    plan.workers.forEach(function (w) {
      if (w.pipeline >= 0) stages[w.pipeline] = (stages[w.pipeline] || 0) + 1;
    });
    var count = {};
    Object.keys(stages).forEach(function (q) { count[stages[q]] = (count[stages[q]] || 0) + 1; });
    var parts = Object.keys(count).map(Number).sort(function (a, b) { return b - a; })
      .map(function (n) { return count[n] + "x" + n; });
    return parts.length ? parts.join("+") : "none";
  }

  function renderSummary(st) {
    var h = st.hello, last = st.steps.length ? st.steps[st.steps.length - 1] : null;
    if (h) {
      $("job").textContent = h.job;
      document.title = h.job + " · Pliant";
      $("strategy").textContent = h.strategy + ", F = " + h.tolerate;
    }
    if (st.phase) {
      $("phase").textContent = st.phase.phase + (st.phase.reason ? ": " + st.phase.reason : "");
      $("phase").className = "phase " + st.phase.phase;
    }
    var done = last ? last.step + 1 : 0, total = h ? h.steps : 0;
    $("progress").textContent = done + " / " + total + " steps";
    $("progress-bar").style.width = total ? (100 * done / total).toFixed(1) + "%" : "0";
    var ended = st.phase && (st.phase.phase === "done" || st.phase.phase === "failed");
    $("eta").textContent = ended ? "ended" : last ? fmtSecs(last.eta_s) : "–";
    $("tps").textContent = last ? fmtNum(last.tokens_per_second) : "–";
    $("loss").textContent = last && last.loss !== undefined ? last.loss.toFixed(4) : "–";
    $("plan").textContent = st.plan ? "generation " + st.plan.generation + ", " +
      pipelinesOf(st.plan) : "–";
    $("nreconfigs").textContent = String(st.reconfigs.length);
    renderCost(last);
  }

  /* Dollars and samples per dollar, where the job sets spec.cost (the step's fields). */
  function renderCost(last) {
    var spot = last && last.usd !== undefined, od = last && last.usd_on_demand !== undefined;
    $("cost-card").hidden = !(spot || od);
    if (!(spot || od)) return;
    function part(usd, per) {
      return "$" + (usd > 0 && usd < 0.01 ? usd.toPrecision(2) : usd.toFixed(2)) + (per !== undefined ? ", " + fmtNum(per) + " samples/$" : "");
    }
    $("cost").textContent = spot ? part(last.usd, last.samples_per_usd) : "–";
    $("cost-od").textContent = od ? "on demand: " +
      part(last.usd_on_demand, last.samples_per_usd_on_demand) : "";
  }

  function render(st) {
    renderSummary(st);
    renderCharts(st);
    renderMap(st);
    renderTimeline(st);
  }

  /* ---- live: the feed; static: the history in the page ---- */

  function setConn(text, live) {
    $("conn").textContent = text;
    $("conn").className = "conn" + (live ? " live" : "");
  }

  function connect(st) {
    var pending = null;
    function later() {
      if (!pending) pending = setTimeout(function () { pending = null; render(st); }, 50);
    }
    /* the feed is next to the page: /feed, or /jobs/NS/NAME/feed in the operator */
    var dir = location.pathname.replace(/\/(index\.html)?$/, "") + "/feed";
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + dir;
    var ws = new WebSocket(url, "pliant-dashboard");
    ws.onopen = function () { setConn("live", true); };
    ws.onmessage = function (m) {
      var ev = JSON.parse(m.data);
      if (ev.type === "history") ev.events.forEach(function (e) { apply(st, e); });
      else apply(st, ev);
      later();
    };
    ws.onclose = function () {
      setConn("disconnected: the final page of the job", false);
      render(st);
    };
  }

  /* A static page's run: a fresh state from its events, drawn on a cleared map. */
  function showRun(events) {
    var st = newState();
    window.pliantState = st; /* for the tests and the curious */
    events.forEach(function (e) { apply(st, e); });
    $("map").tHead.dataset.layers = "";
    $("map").tHead.innerHTML = "";
    $("map").tBodies[0].innerHTML = "";
    render(st);
    return st;
  }

  /* The history built into the page: an array of events (one run) or {"runs": [{name,
   * events}]}, the runs chosen with the selector. */
  function startStatic(embedded) {
    var h = JSON.parse(embedded.textContent), runs = Array.isArray(h) ? [{ events: h }] : h.runs;
    var sel = $("runs"), st = showRun(runs.length ? runs[0].events : []);
    setConn("report", false);
    if (runs.length > 1) {
      sel.innerHTML = runs.map(function (r, i) {
        return '<option value="' + i + '">' + esc(r.name) + "</option>";
      }).join("");
      sel.hidden = false;
      sel.onchange = function () { st = showRun(runs[sel.value].events); };
    }
    window.addEventListener("resize", function () { render(st); });
  }

  function start() {
    var embedded = document.getElementById("pliant-history");
    if (embedded) return startStatic(embedded);
    var st = newState();
    window.pliantState = st; /* for the tests and the curious */
    connect(st);
    window.addEventListener("resize", function () { render(st); });
  }

  window.PliantDashboard = { newState: newState, apply: apply, render: render };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
