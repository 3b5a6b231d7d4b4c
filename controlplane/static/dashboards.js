// The dashboards page: fetch the figures for the chosen model and range, draw them, refresh on a timer.
// Text from the server only ever reaches the page through textContent and Plotly (whose labels the
// server escapes), never through innerHTML.
(function () {
  "use strict";

  const form = document.getElementById("dashboard-controls");
  const status = document.getElementById("dashboard-status");
  if (!form || !status) {
    return;
  }
  const api = form.dataset.api;
  const plotConfig = { responsive: true, displaylogo: false };
  let timer = null;
  let inFlight = null;

  function showStatus(text, isError) {
    status.textContent = text;
    status.classList.toggle("error", Boolean(isError));
  }

  function query() {
    const params = new URLSearchParams();
    params.set("model", form.elements.model.value);
    params.set("range", form.elements.range.value);
    return params;
  }

  const errorText = window.flightdeck.errorText; // from console.js: the API's message, else the status line

  function draw(figures, revision) {
    for (const figure of figures) {
      const div = document.getElementById("fig-" + figure.id);
      if (!div) {
        continue;
      }
      // Keep the user's zoom across refreshes; a new model or range resets it.
      figure.layout.uirevision = revision;
      Plotly.react(div, figure.data, figure.layout, plotConfig);
    }
  }

  async function load() {
    if (inFlight) {
      inFlight.abort();
    }
    const controller = new AbortController();
    inFlight = controller;
    const params = query();
    showStatus("Loading…", false);
    try {
      const response = await fetch(api + "?" + params.toString(), {
        signal: controller.signal,
        headers: { Accept: "application/json" },
      });
      if (!response.ok) {
        showStatus("Could not load the figures: " + (await errorText(response)), true);
        return;
      }
      const body = await response.json();
      draw(body.figures || [], params.toString());
      showStatus("Updated at " + new Date().toLocaleTimeString(), false);
    } catch (err) {
      if (err.name !== "AbortError") {
        showStatus("Could not load the figures: " + err.message, true);
      }
    } finally {
      if (inFlight === controller) {
        inFlight = null;
      }
    }
  }

  function schedule() {
    if (timer !== null) {
      clearInterval(timer);
      timer = null;
    }
    if (form.elements.refresh.checked) {
      const seconds = Number(form.elements.every.value) || 30;
      timer = setInterval(function () {
        if (!document.hidden) {
          load();
        }
      }, seconds * 1000);
    }
  }

  function rememberChoices() {
    const params = query();
    if (form.elements.refresh.checked) {
      params.set("refresh", "on");
      params.set("every", form.elements.every.value);
    }
    window.history.replaceState(null, "", "?" + params.toString());
  }

  form.addEventListener("change", function (event) {
    rememberChoices();
    if (event.target.name === "model" || event.target.name === "range") {
      load();
    }
    schedule();
  });
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    rememberChoices();
    load();
  });

  if (typeof Plotly === "undefined") {
    showStatus("plotly.js did not load, so the charts cannot be drawn.", true);
    return;
  }
  load();
  schedule();
})();
