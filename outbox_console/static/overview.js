// Draws the overview's charts from /api/history (samples taken while the console runs).
"use strict";
(function () {
  async function draw() {
    const response = await fetch("/api/history", { credentials: "same-origin" });
    const data = await response.json();
    document.querySelectorAll("canvas[data-series]").forEach(function (canvas) {
      const series = data[canvas.dataset.series];
      const datasets = Object.keys(series).map(function (topic) {
        return { label: topic, data: series[topic], tension: 0.2, pointRadius: 2 };
      });
      const labels = data.labels.map(function (at) { return at.slice(11, 19); });
      if (canvas.chart) { canvas.chart.destroy(); }
      canvas.chart = new Chart(canvas, {
        type: "line",
        data: { labels: labels, datasets: datasets },
        options: { animation: false, scales: { y: { beginAtZero: true } } },
      });
    });
  }
  draw();
  setInterval(draw, 10000);
})();
