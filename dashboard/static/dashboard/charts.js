// The overview's charts: the last 24 hours from charts.json (dashboard.charts), drawn with the vendored
// Chart.js (VENDORED.md). No inline script and no eval: the page's Content-Security-Policy allows only
// this origin's files. #charts gets data-state="ready" once both are drawn, or "error" with a note.
(function () {
  "use strict";

  var section = document.getElementById("charts");
  if (!section) return;
  var note = document.getElementById("charts-note");

  // One colour per status, kept in the order of the delivery path (the badges' families: amber on its
  // way, blue at WhatsApp, green arrived, red failed).
  var STATUS_COLOURS = {
    QUEUED: "#d97706", SENDING: "#fcd34d", SENT: "#93c5fd", SERVER_ACK: "#1d4ed8",
    DELIVERED: "#4ade80", READ: "#15803d", FAILED: "#b91c1c"
  };
  var PERCENTILES = [
    { key: "p50", label: "p50", colour: "#0f766e" },
    { key: "p90", label: "p90", colour: "#b45309" },
    { key: "p99", label: "p99", colour: "#b91c1c" }
  ];

  function failed(text) {
    section.dataset.state = "error";
    note.textContent = text;
    note.classList.add("charts-error");
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 120) return (Math.round(seconds * 10) / 10) + " s";
    if (seconds < 7200) return (Math.round(seconds / 6) / 10) + " min";
    return (Math.round(seconds / 360) / 10) + " h";
  }

  function hourLabel(iso) { return iso.slice(11, 16); }  // "2026-12-01T14:00:00Z" → "14:00" (UTC)

  function sum(values) { return values.reduce(function (a, b) { return a + b; }, 0); }

  function common() {
    return {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      scales: { x: { grid: { display: false }, ticks: { maxRotation: 0, autoSkipPadding: 8 } } }
    };
  }

  function drawByStatus(data) {
    var labels = data.hours.map(hourLabel);
    var totals = data.byStatus.map(function (s) { return sum(s.counts); });
    var options = common();
    options.scales.x.stacked = true;
    options.scales.y = { stacked: true, beginAtZero: true, ticks: { precision: 0 } };
    // Statuses with no message in the 24 hours stay out of the legend (their bars are empty anyway).
    options.plugins.legend.labels.filter = function (item) { return totals[item.datasetIndex] > 0; };
    var canvas = document.getElementById("chart-by-status");
    var chart = new Chart(canvas, {
      type: "bar",
      data: {
        labels: labels,
        datasets: data.byStatus.map(function (s) {
          return { label: s.label, data: s.counts, backgroundColor: STATUS_COLOURS[s.status] || "#94a3b8",
                   stack: "messages" };
        })
      },
      options: options
    });
    var all = sum(totals);
    canvas.setAttribute("aria-label", "Messages per hour by status over the last 24 hours: " + all + " in all; " +
      data.byStatus.filter(function (s, i) { return totals[i] > 0; })
        .map(function (s) { return s.label + " " + sum(s.counts); }).join(", ") + ".");
    return chart;
  }

  function drawLatency(data) {
    var labels = data.hours.map(hourLabel);
    var options = common();
    options.scales.y = { beginAtZero: true, ticks: { callback: function (v) { return duration(v); } } };
    options.plugins.tooltip = {
      callbacks: {
        label: function (item) { return item.dataset.label + ": " + duration(item.raw); },
        footer: function (items) {
          return items.length ? data.latency.delivered[items[0].dataIndex] + " delivered" : "";
        }
      }
    };
    var canvas = document.getElementById("chart-latency");
    var chart = new Chart(canvas, {
      type: "line",
      data: {
        labels: labels,
        datasets: PERCENTILES.map(function (p) {
          return { label: p.label, data: data.latency[p.key], borderColor: p.colour, backgroundColor: p.colour,
                   pointRadius: 3, borderWidth: 2, spanGaps: false };
        })
      },
      options: options
    });
    var delivered = sum(data.latency.delivered);
    canvas.setAttribute("aria-label", delivered
      ? "Accepted to delivered over the last 24 hours, per hour: " + delivered + " delivered messages."
      : "No message accepted in the last 24 hours has been delivered yet.");
    return chart;
  }

  if (typeof window.Chart !== "function") {
    failed("Charts unavailable: the chart library did not load.");
    return;
  }
  fetch(section.dataset.src, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then(function (r) {
      return r.json().then(function (body) {
        if (!r.ok) throw new Error((body.error && body.error.message) || ("HTTP " + r.status));
        return body;
      });
    })
    .then(function (data) {
      drawByStatus(data);
      drawLatency(data);
      section.dataset.state = "ready";
    })
    .catch(function (error) { failed("Charts unavailable: " + error.message); });
})();
