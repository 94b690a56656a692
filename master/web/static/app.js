// resolute dashboard: live charts (uPlot), the log view, and small form helpers.
// Pages work without this file except for charts and logs; htmx does the table refreshes.
(function () {
  "use strict";

  var PALETTE = ["#2f6fab", "#c2410c", "#0f766e", "#7c3aed", "#b91c1c", "#a16207", "#475569", "#db2777"];
  var GIB = Math.pow(2, 30);
  var AGENT_WINDOW = 300; // samples: five minutes at one a second
  var POLL_MS = 3000;
  var allPlots = []; // every chart drawn, resized with the window

  function fetchJson(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(
      function (reply) {
        if (reply.status === 401) {
          // The session ended: the page itself redirects to the sign-in form.
          window.location.reload();
          throw new Error("signed out");
        }
        if (!reply.ok) throw new Error(url + ": " + reply.status);
        return reply.json();
      }
    );
  }

  function axisFont(el) {
    return (el.classList.contains("small") ? "10px" : "11px") + " system-ui, sans-serif";
  }

  function chartWidth(el) {
    return Math.max(120, Math.floor(el.getBoundingClientRect().width || el.parentNode.clientWidth || 300));
  }

  // Points where a series is sparse: a line needs two values, so a series with a single
  // one (a trial stopped at its first validation) would otherwise draw nothing at all.
  function sparsePoints(u, si, i0, i1) {
    var values = u.data[si] || [];
    var count = 0;
    for (var i = i0; i <= i1; i++) if (values[i] !== null && values[i] !== undefined) count += 1;
    return count <= 1 || u.bbox.width / (window.devicePixelRatio || 1) / count > 24;
  }

  // labels: {x, y} axis titles (drawn by uPlot on the canvas), or none.
  function makePlot(el, series, height, yRange, xIsTime, labels) {
    var font = axisFont(el);
    var xAxis = { font: font, size: xIsTime ? 44 : 30, ticks: { size: 3 }, stroke: "#5b6570", grid: { stroke: "#eef1f4" } };
    var yAxis = { font: font, size: 40, ticks: { size: 3 }, stroke: "#5b6570", grid: { stroke: "#eef1f4" } };
    if (labels) {
      [[xAxis, labels.x], [yAxis, labels.y]].forEach(function (pair) {
        pair[0].label = pair[1];
        pair[0].labelFont = font;
        pair[0].labelSize = 16;
        pair[0].labelGap = 2;
      });
      yAxis.size = 48;
    }
    var opts = {
      width: chartWidth(el),
      height: height,
      cursor: { drag: { x: false, y: false } },
      legend: { live: false },
      scales: { x: { time: xIsTime }, y: { range: yRange } },
      axes: [xAxis, yAxis],
      series: [{}].concat(
        series.map(function (label, i) {
          return { label: label, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true, points: { show: sparsePoints, size: 6, fill: PALETTE[i % PALETTE.length] } };
        })
      ),
    };
    var empty = [[]].concat(series.map(function () { return []; }));
    el.replaceChildren();
    var plot = new uPlot(opts, empty, el);
    allPlots.push(plot);
    return plot;
  }

  function fromZero(u, min, max) {
    // Whole numbers at the top, so the axis always labels more than its zero.
    return [0, Math.max(1, Math.ceil(max * 1.2))];
  }

  // -- agent utilisation charts (cluster page) ---------------------------------------------

  var agentCharts = {}; // "kind|agent" -> {plot, data}
  var agentLast = {}; // agent -> newest unix millis drawn
  var agentTimer = null;

  function agentSeries(kind, gpus) {
    if (kind === "agent-util") return gpus > 0 ? ["CPU %", "GPU %"] : ["CPU %"];
    return gpus > 0 ? ["host", "GPU"] : ["host"];
  }

  function attachAgentCharts() {
    var els = document.querySelectorAll(".chart[data-chart^='agent-']");
    els.forEach(function (el) {
      var kind = el.dataset.chart;
      var gpus = parseInt(el.dataset.gpus || "0", 10);
      var key = kind + "|" + el.dataset.agent;
      var chart = agentCharts[key];
      if (chart && chart.gpus === gpus) {
        // htmx replaced the card: move the live chart into the new placeholder.
        if (chart.plot.root.parentNode !== el) el.replaceChildren(chart.plot.root);
      } else {
        var range = kind === "agent-util" ? [0, 100] : fromZero;
        var series = agentSeries(kind, gpus);
        chart = { gpus: gpus, plot: makePlot(el, series, 110, range, true), data: [[]].concat(series.map(function () { return []; })) };
        chart.plot.keep = true; // detached while htmx swaps its card, then moved back in
        agentCharts[key] = chart;
        delete agentLast[el.dataset.agent];
      }
      el.dataset.points = String(chart.data[0].length);
    });
    if (els.length && agentTimer === null) {
      pollAgents();
      agentTimer = window.setInterval(pollAgents, POLL_MS);
    }
  }

  function mean(values) {
    if (!values.length) return null;
    var total = 0;
    values.forEach(function (v) { total += v; });
    return total / values.length;
  }

  function pushAgentSamples(agent, samples) {
    var last = agentLast[agent] || 0;
    var fresh = samples.filter(function (s) { return s.unixMillis > last; });
    if (!fresh.length) return;
    agentLast[agent] = fresh[fresh.length - 1].unixMillis;
    ["agent-util", "agent-mem"].forEach(function (kind) {
      var chart = agentCharts[kind + "|" + agent];
      if (!chart) return;
      fresh.forEach(function (s) {
        var gpus = s.gpus || [];
        chart.data[0].push(s.unixMillis / 1000);
        if (kind === "agent-util") {
          chart.data[1].push(s.cpu_util_simple);
          if (chart.gpus > 0) chart.data[2].push(mean(gpus.map(function (g) { return g.gpu_util; })));
        } else {
          chart.data[1].push(s.memory_used / GIB);
          if (chart.gpus > 0) {
            var used = 0;
            gpus.forEach(function (g) { used += g.gpu_memory_used || 0; });
            chart.data[2].push(used / GIB);
          }
        }
      });
      var extra = chart.data[0].length - AGENT_WINDOW;
      if (extra > 0) chart.data.forEach(function (column) { column.splice(0, extra); });
      chart.plot.setData(chart.data);
      var el = chart.plot.root.parentNode;
      if (el && el.dataset) el.dataset.points = String(chart.data[0].length);
    });
  }

  function pollAgents() {
    var agents = {};
    document.querySelectorAll(".chart[data-chart^='agent-']").forEach(function (el) {
      agents[el.dataset.agent] = true;
    });
    var ids = Object.keys(agents);
    if (!ids.length) return;
    var params = new URLSearchParams();
    var since = null;
    ids.forEach(function (id) {
      params.append("agent", id);
      if (!(id in agentLast)) since = -1;
      else if (since !== -1 && (since === null || agentLast[id] < since)) since = agentLast[id];
    });
    if (since !== null && since >= 0) params.set("since", String(since + 1));
    fetchJson("/ui/cluster/metrics.json?" + params.toString())
      .then(function (body) {
        Object.keys(body.agents).forEach(function (id) {
          if (!(id in agentLast)) agentLast[id] = 0;
          pushAgentSamples(id, body.agents[id]);
        });
      })
      .catch(function () { /* the next poll retries */ });
  }

  // -- trial metric charts (experiment and trial pages) -----------------------------------

  // One chart per metric, so a loss near 0 and an accuracy near 100 each get their own
  // y axis; the x axis counts batches, as the trial reports them.
  function trialCharts() {
    var groups = document.querySelectorAll("[data-chart='trial-metrics']");
    if (!groups.length) return;
    var trial = groups[0].dataset.trial;
    var plots = {}; // group|metric -> plot

    // Every metric's box first, then the charts: each box's width depends on how many
    // share the row, and a chart takes its width when it is made.
    function metricCharts(groupEl, names) {
      var made = names.map(function (name) {
        var key = groupEl.dataset.group + "|" + name;
        if (plots[key]) return null;
        var figure = document.createElement("figure");
        var caption = document.createElement("figcaption");
        caption.textContent = name;
        var el = document.createElement("div");
        el.className = "chart";
        el.dataset.metric = name;
        figure.appendChild(caption);
        figure.appendChild(el);
        groupEl.appendChild(figure);
        return [key, name, el];
      });
      names.forEach(function (name) {
        var plot = plots[groupEl.dataset.group + "|" + name];
        if (plot) plot.setSize({ width: chartWidth(plot.root.parentNode), height: plot.height });
      });
      made.forEach(function (item) {
        if (item) plots[item[0]] = makePlot(item[2], [item[1]], 200, null, false, { x: "batches", y: item[1] });
      });
      return names.map(function (name) { return plots[groupEl.dataset.group + "|" + name]; });
    }

    function draw(body) {
      groups.forEach(function (groupEl) {
        var group = body.groups[groupEl.dataset.group] || { steps: [], series: {} };
        var names = Object.keys(group.series);
        groupEl.dataset.points = String(group.steps.length);
        if (!group.steps.length || !names.length) {
          if (!groupEl.querySelector(".chart-empty")) {
            var note = document.createElement("p");
            note.className = "chart-empty";
            note.textContent = "No " + groupEl.dataset.group + " metrics reported yet.";
            groupEl.replaceChildren(note);
          }
          return;
        }
        var note = groupEl.querySelector(".chart-empty");
        if (note) note.remove();
        metricCharts(groupEl, names).forEach(function (plot, i) {
          var values = group.series[names[i]];
          plot.setData([group.steps, values]);
          plot.root.parentNode.dataset.points = String(
            values.filter(function (v) { return v !== null; }).length
          );
        });
      });
    }

    function poll() {
      fetchJson("/ui/trials/" + encodeURIComponent(trial) + "/metrics.json")
        .then(function (body) {
          draw(body);
          if (!body.final) window.setTimeout(poll, POLL_MS);
        })
        .catch(function () { window.setTimeout(poll, POLL_MS * 2); });
    }
    poll();
  }

  // -- trials compared (up to 100 trials of one metric, drawn once) -----------------------

  // The first eight as everywhere else, then hues a golden angle apart, so 100 lines differ.
  function compareColour(i) {
    if (i < PALETTE.length) return PALETTE[i];
    return "hsl(" + Math.round((i * 137.508) % 360) + ", 65%, 42%)";
  }

  // Each trial comes with its own steps (a thinned trial skips others than an unthinned
  // one); uPlot wants one x array, so the steps are merged and a trial has null elsewhere
  // (spanGaps draws through them).
  function compareAligned(trials) {
    var all = [];
    trials.forEach(function (t) { for (var i = 0; i < t.steps.length; i++) all.push(t.steps[i]); });
    all.sort(function (a, b) { return a - b; });
    var xs = [];
    for (var i = 0; i < all.length; i++) if (i === 0 || all[i] !== all[i - 1]) xs.push(all[i]);
    var at = new Map();
    xs.forEach(function (x, i) { at.set(x, i); });
    var columns = trials.map(function (t) {
      var column = new Array(xs.length).fill(null);
      for (var i = 0; i < t.steps.length; i++) column[at.get(t.steps[i])] = t.values[i];
      return column;
    });
    return [xs].concat(columns);
  }

  // The trial whose line passes nearest the pointer: each trial's own nearest step (a
  // binary search), so thinned trials are found between their points too.
  function compareNearest(u, trials, left, top) {
    var x = u.posToVal(left, "x");
    var best = null;
    trials.forEach(function (t, si) {
      if (!u.series[si + 1].show || !t.steps.length) return;
      var lo = 0, hi = t.steps.length - 1;
      while (lo < hi) {
        var mid = (lo + hi) >> 1;
        if (t.steps[mid] < x) lo = mid + 1; else hi = mid;
      }
      if (lo > 0 && Math.abs(t.steps[lo - 1] - x) < Math.abs(t.steps[lo] - x)) lo -= 1;
      var value = t.values[lo];
      if (value === null || value === undefined) return;
      var distance = Math.abs(u.valToPos(value, "y") - top);
      if (best === null || distance < best.distance) best = { trial: t, step: t.steps[lo], value: value, distance: distance };
    });
    return best;
  }

  function compareReadout(el, trials, metric) {
    var readout = el.parentNode.querySelector("[data-compare-readout]");
    return function (u) {
      if (!readout) return;
      var left = u.cursor.left, top = u.cursor.top;
      if (left === undefined || left < 0) return;
      var near = compareNearest(u, trials, left, top);
      if (!near || near.distance > 40) return;
      readout.textContent = near.trial.label + " · batch " + near.step.toLocaleString("en") + " · " + metric + " " + near.value.toPrecision(6);
      readout.dataset.trial = String(near.trial.id);
    };
  }

  function compareChart() {
    var el = document.querySelector(".chart[data-chart='compare']");
    var source = document.getElementById("compare-data");
    if (!el || !source) return;
    var chart = JSON.parse(source.textContent);
    var trials = chart.trials;
    var data = compareAligned(trials);
    var font = axisFont(el);
    var axis = function (label, size) {
      return { font: font, size: size, ticks: { size: 3 }, stroke: "#5b6570", grid: { stroke: "#eef1f4" }, label: label, labelFont: font, labelSize: 16, labelGap: 2 };
    };
    var drawn = false;
    var opts = {
      width: chartWidth(el),
      height: trials.length > 20 ? 420 : 300,
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      legend: { live: false },
      scales: { x: { time: false } },
      axes: [axis("batches", 30), axis(chart.metric, 48)],
      series: [{}].concat(trials.map(function (t, i) {
        var colour = compareColour(i);
        return { label: t.label, stroke: colour, width: trials.length > 20 ? 1 : 1.5, spanGaps: true, points: { show: sparsePoints, size: 6, fill: colour } };
      })),
      hooks: {
        setCursor: [compareReadout(el, trials, chart.metric)],
        // Read by the browser tests and the benchmark: the chart is on the canvas.
        draw: [function () {
          if (drawn) return;
          drawn = true;
          el.dataset.drawn = "true";
          if (window.performance && performance.mark) performance.mark("compare-chart-drawn");
        }],
      },
    };
    el.replaceChildren();
    el.dataset.points = String(data[0].length);
    el.dataset.series = String(trials.length);
    allPlots.push(new uPlot(opts, data, el));
  }

  // -- logs (experiment, trial and task pages) --------------------------------------------

  var MAX_LOG_LINES = 5000;

  function logView() {
    var pre = document.querySelector("pre[data-logs]");
    if (!pre) return;
    var rankSelect = document.querySelector("[data-log-rank]");
    var follow = document.querySelector("[data-log-follow]");
    var status = document.querySelector("[data-log-status]");
    var state = { last: null, generation: 0, finished: false, running: false, count: 0 };

    function say(text) { if (status) status.textContent = text; }

    function append(lines) {
      var stick = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
      var fragment = document.createDocumentFragment();
      lines.forEach(function (line) {
        var row = document.createElement("span");
        // Coloured by level: INFO on stderr (Python's logging) is no error.
        if (line.level) row.className = "level-" + line.level.replace("LOG_LEVEL_", "").toLowerCase();
        row.dataset.level = line.level || "";
        if (line.rank !== null && line.rank !== undefined) {
          var rank = document.createElement("span");
          rank.className = "rank";
          rank.textContent = "[rank " + line.rank + "] ";
          row.appendChild(rank);
        }
        row.appendChild(document.createTextNode(line.message + "\n"));
        fragment.appendChild(row);
      });
      pre.appendChild(fragment);
      state.count += lines.length;
      while (pre.childNodes.length > MAX_LOG_LINES) pre.removeChild(pre.firstChild);
      if (follow && follow.checked && stick) pre.scrollTop = pre.scrollHeight;
    }

    function load() {
      var generation = state.generation;
      state.running = true;
      var params = new URLSearchParams({ limit: "500" });
      if (state.last !== null) params.set("after", String(state.last));
      if (rankSelect && rankSelect.value !== "") params.set("rank", rankSelect.value);
      fetchJson(pre.dataset.logsUrl + "?" + params.toString())
        .then(function (body) {
          if (generation !== state.generation) return;
          append(body.lines);
          if (body.last !== null && body.last !== undefined) state.last = body.last;
          state.finished = body.finished;
          pre.dataset.lines = String(state.count);
          if (body.lines.length === 500) return load();
          state.running = false;
          if (state.finished) say("The " + (pre.dataset.logsWhat || "trial") + " has ended; " + state.count + " lines.");
          else if (follow && follow.checked) {
            say("Following…");
            window.setTimeout(function () { if (generation === state.generation) load(); }, 2000);
          } else say("Paused; tick Follow to keep reading.");
        })
        .catch(function () {
          state.running = false;
          say("Could not read the logs; retrying.");
          window.setTimeout(function () { if (generation === state.generation) load(); }, 4000);
        });
    }

    function restart() {
      state.generation += 1;
      state.last = null;
      state.count = 0;
      state.finished = false;
      pre.replaceChildren();
      load();
    }

    if (rankSelect) rankSelect.addEventListener("change", restart);
    if (follow) follow.addEventListener("change", function () {
      if (follow.checked && !state.running && !state.finished) {
        state.generation += 1;
        load();
      }
    });
    load();
  }

  // -- small helpers -----------------------------------------------------------------------

  document.addEventListener(
    "submit",
    function (event) {
      var form = event.target;
      var message = form && form.dataset ? form.dataset.confirm : null;
      if (message && !window.confirm(message)) event.preventDefault();
    },
    true
  );

  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a[data-back]") : null;
    if (link && window.history.length > 1) {
      event.preventDefault();
      window.history.back();
    }
  });

  var resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(function () {
      allPlots = allPlots.filter(function (plot) {
        if (!plot.root.isConnected) return Boolean(plot.keep);
        plot.setSize({ width: chartWidth(plot.root.parentNode), height: plot.height });
        return true;
      });
    }, 150);
  });

  function start() {
    if (typeof uPlot !== "undefined") {
      attachAgentCharts();
      trialCharts();
      compareChart();
    }
    logView();
    document.body.addEventListener("htmx:afterSettle", function () {
      if (typeof uPlot !== "undefined") attachAgentCharts();
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
