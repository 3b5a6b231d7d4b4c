// The console's behaviour: action forms sent to the JSON API, a confirmation dialog, live regions,
// charts, and the runbook form's dry-run-first flow. Text from the server reaches the page only as
// server-rendered (escaped) HTML or through textContent, never through innerHTML.
(function () {
  "use strict";

  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.content : "";
  const flash = document.getElementById("flash");

  function show(text, kind) {
    if (!flash) {
      return;
    }
    flash.textContent = text;
    flash.className = "flash " + kind;
    flash.setAttribute("role", kind === "error" ? "alert" : "status");
  }

  // -- reading values out of forms and responses ----------------------------------------------

  function lookup(data, path) {
    return path.split(".").reduce(function (value, key) {
      return value !== null && value !== undefined ? value[key] : undefined;
    }, data);
  }

  function fill(template, data) {
    return template.replace(/\{([A-Za-z_][A-Za-z0-9_.]*)\}/g, function (_, path) {
      const value = lookup(data, path);
      if (value === undefined || value === null) {
        return "";
      }
      return typeof value === "object" ? JSON.stringify(value) : String(value);
    });
  }

  function setPath(target, path, value) {
    const keys = path.split(".");
    let node = target;
    keys.forEach(function (key, i) {
      const last = i === keys.length - 1;
      const slot = /^\d+$/.test(key) ? Number(key) : key;
      if (last) {
        node[slot] = value;
        return;
      }
      if (node[slot] === undefined) {
        node[slot] = /^\d+$/.test(keys[i + 1]) ? [] : {};
      }
      node = node[slot];
    });
  }

  function fieldValue(el) {
    const type = el.dataset.type || "";
    if (el.type === "checkbox") {
      if (type === "bool") {
        return el.checked;
      }
      return el.checked ? el.value : undefined;
    }
    const raw = el.value.trim();
    if (raw === "") {
      return undefined;
    }
    if (type === "number") {
      const number = Number(raw);
      if (!Number.isFinite(number)) {
        throw new Error((el.labels && el.labels[0] ? el.labels[0].textContent.trim() : el.name) + " must be a number");
      }
      return number;
    }
    if (type === "int-list") {
      return raw.split(/[\s,]+/).filter(Boolean).map(function (part) {
        if (!/^\d+$/.test(part)) {
          throw new Error("'" + part + "' is not a whole number");
        }
        return Number(part);
      });
    }
    if (type === "bool-text") {
      return raw === "true";
    }
    return el.value;
  }

  // Drop form rows left empty (a matcher row with no label): array items without any text in them.
  function compact(value) {
    if (Array.isArray(value)) {
      return value.map(compact).filter(function (item) {
        if (item === undefined || item === null) {
          return false;
        }
        if (typeof item === "object" && !Array.isArray(item)) {
          return Object.values(item).some(function (v) { return typeof v === "string" && v !== ""; });
        }
        return true;
      });
    }
    if (value && typeof value === "object") {
      Object.keys(value).forEach(function (key) { value[key] = compact(value[key]); });
    }
    return value;
  }

  function formBody(form) {
    const body = {};
    for (const el of form.elements) {
      if (!el.name || el.tagName === "BUTTON" || el.tagName === "FIELDSET" || el.hasAttribute("data-path")) {
        continue;
      }
      if (el.type === "checkbox" && el.dataset.type === "list") {
        const list = lookup(body, el.name) || [];
        if (el.checked) {
          list.push(el.value);
        }
        setPath(body, el.name, list);
        continue;
      }
      const value = fieldValue(el);
      if (value !== undefined) {
        setPath(body, el.name, value);
      }
    }
    return compact(body);
  }

  function formValues(form) {
    const values = {};
    for (const el of form.elements) {
      if (el.name && el.tagName !== "BUTTON") {
        values[el.name] = el.type === "checkbox" ? String(el.checked) : el.value;
      }
    }
    return values;
  }

  function actionUrl(form) {
    let url = form.dataset.api;
    const field = form.dataset.pathField;
    if (field) {
      url = url.replace("__" + field + "__", encodeURIComponent(form.elements[field].value));
    }
    return url;
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      const error = body && body.error;
      if (error && typeof error.message === "string") {
        return error.message;
      }
      if (typeof error === "string") {
        return error;
      }
    } catch (ignored) {
      // Not JSON (a proxy's error page): the status line says enough.
    }
    return response.status + " " + response.statusText;
  }

  // Shared with the pages' own scripts (dashboards.js, models.js), which this file loads before.
  window.flightdeck = { errorText: errorText, show: show, refreshLive: refreshLive, csrf: csrf };

  // -- the confirmation dialog -----------------------------------------------------------------

  function confirmAction(text) {
    const dialog = document.getElementById("confirm-dialog");
    if (!dialog || typeof dialog.showModal !== "function") {
      return Promise.resolve(window.confirm(text));
    }
    document.getElementById("confirm-text").textContent = text;
    return new Promise(function (resolve) {
      dialog.addEventListener("close", function () { resolve(dialog.returnValue === "ok"); }, { once: true });
      dialog.returnValue = "";
      dialog.showModal();
    });
  }

  // -- action forms ------------------------------------------------------------------------------

  async function send(form, body) {
    const method = (form.dataset.method || "POST").toUpperCase();
    const response = await fetch(actionUrl(form), {
      method: method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      throw new Error(await errorText(response));
    }
    return response.status === 204 ? {} : response.json();
  }

  async function submit(form, submitter) {
    let body;
    try {
      body = formBody(form);
    } catch (err) {
      show(err.message, "error");
      return;
    }
    const runbookMode = form.hasAttribute("data-runbook-form") ? (submitter && submitter.value) || "dry" : null;
    if (runbookMode) {
      body.dry_run = runbookMode === "dry";
    }
    if (form.dataset.confirm && !(await confirmAction(fill(form.dataset.confirm, formValues(form))))) {
      show("Cancelled: nothing was changed.", "pending");
      return;
    }
    const buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.dataset.wasDisabled = String(b.disabled); b.disabled = true; });
    show("Working…", "pending");
    let data;
    try {
      data = await send(form, body);
    } catch (err) {
      show(err.message, "error");
      buttons.forEach(function (b) { b.disabled = b.dataset.wasDisabled === "true"; });
      return;
    }
    buttons.forEach(function (b) { b.disabled = b.dataset.wasDisabled === "true"; });
    if (runbookMode) {
      runbookStarted(form, body, data, runbookMode);
      return;
    }
    show(fill(form.dataset.success || "Done.", data), "ok");
    form.reset(); // what was typed went through: a second press must not repeat it by accident
    const then = form.dataset.then || "refresh";
    if (then === "goto") {
      window.location.assign(fill(form.dataset.goto, data));
    } else if (then === "refresh") {
      refreshLive();
    }
  }

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.dataset.api) {
      return;
    }
    event.preventDefault();
    submit(form, event.submitter);
  });

  // -- live regions: the page fetches itself and swaps in its [data-live] parts ------------------

  let liveTimer = null;

  async function refreshLive() {
    let response;
    try {
      response = await fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
    } catch (err) {
      show("Lost contact with the server: " + err.message, "error");
      return true;
    }
    if (response.redirected && new URL(response.url).pathname === "/login") {
      show("Your session has ended: reload the page to log in again.", "error");
      return false;
    }
    if (!response.ok) {
      return true;
    }
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    const typing = document.activeElement && document.activeElement.matches("input, select, textarea");
    document.querySelectorAll("[data-live]").forEach(function (region) {
      const replacement = fresh.getElementById(region.id);
      // NOTE: a region someone is typing into stays as it is until the next refresh.
      if (replacement && !(typing && region.contains(document.activeElement))) {
        region.replaceWith(document.adoptNode(replacement));
      }
    });
    return Number(fresh.body.dataset.liveEvery || 0) > 0;
  }

  function scheduleLive() {
    const every = Number(document.body.dataset.liveEvery || 0);
    if (!every) {
      return;
    }
    liveTimer = window.setTimeout(async function tick() {
      const again = document.hidden ? true : await refreshLive();
      liveTimer = again ? window.setTimeout(tick, every * 1000) : null;
    }, every * 1000);
  }

  // -- charts: figures from /api/dashboards/figures drawn by the local plotly.js ------------------

  function loadCharts(grid) {
    const status = grid.parentElement.querySelector(".chart-status");
    const config = { responsive: true, displaylogo: false };
    async function load() {
      if (typeof Plotly === "undefined") {
        if (status) {
          status.textContent = "plotly.js did not load, so the charts cannot be drawn.";
        }
        return;
      }
      try {
        const response = await fetch(grid.dataset.figures, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) {
          throw new Error(await errorText(response));
        }
        const body = await response.json();
        for (const figure of body.figures || []) {
          const div = grid.querySelector('[data-figure="' + figure.id + '"]');
          if (div) {
            figure.layout.uirevision = "keep";
            Plotly.react(div, figure.data, figure.layout, config);
            div.dataset.drawn = "true";
          }
        }
        if (status) {
          status.textContent = "Updated at " + new Date().toLocaleTimeString();
        }
      } catch (err) {
        if (status) {
          status.textContent = "Could not load the charts: " + err.message;
        }
      }
    }
    load();
    const every = Number(grid.dataset.every || 0);
    if (every) {
      window.setInterval(function () { if (!document.hidden) { load(); } }, every * 1000);
    }
  }

  // -- runbooks: dry run first, watch it, then unlock the real run ----------------------------------

  function paramsKey(body) {
    return JSON.stringify(body.params || {});
  }

  function runbookStarted(form, body, run, mode) {
    if (mode !== "dry") {
      show("Run #" + run.id + " is " + run.state + ".", "ok");
      window.location.assign(form.dataset.runPage + run.id);
      return;
    }
    const panel = document.getElementById("dry-run");
    const output = document.getElementById("dry-run-output");
    const state = document.getElementById("dry-run-state");
    panel.hidden = false;
    output.textContent = "";
    show("Dry run #" + run.id + " started.", "pending");
    const key = paramsKey(body);
    async function poll() {
      const response = await fetch("/api/runbooks/runs/" + run.id, { credentials: "same-origin" });
      if (!response.ok) {
        show("Could not follow the dry run: " + (await errorText(response)), "error");
        return;
      }
      const current = await response.json();
      output.textContent = current.output || "";
      state.textContent = "#" + current.id + ": " + current.state;
      if (current.state === "queued" || current.state === "running") {
        window.setTimeout(poll, 300);
        return;
      }
      const passed = current.state === "succeeded";
      form.dataset.dryRunPassed = passed ? key : "";
      syncRunButton(form);
      show(passed ? "Dry run #" + current.id + " succeeded: Run is unlocked for these arguments."
                  : "Dry run #" + current.id + " " + current.state + (current.error ? ": " + current.error : "."),
           passed ? "ok" : "error");
    }
    poll();
  }

  function syncRunButton(form) {
    const run = form.querySelector("[data-needs-dry-run]");
    const fieldset = form.querySelector("fieldset");
    if (!run || (fieldset && fieldset.disabled)) {
      return;
    }
    let key = null;
    try {
      key = paramsKey(formBody(form));
    } catch (ignored) {
      key = null;
    }
    run.disabled = !(form.dataset.dryRunPassed && form.dataset.dryRunPassed === key);
  }

  // NOTE: after every deferred script has run (plotly.js is one, loaded after this file).
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-runbook-form]").forEach(function (form) {
      form.addEventListener("input", function () { syncRunButton(form); });
      form.addEventListener("change", function () { syncRunButton(form); });
    });
    document.querySelectorAll("[data-figures]").forEach(loadCharts);
    scheduleLive();
  });
})();
