// The Models page's push form: the archive goes to POST /api/models through XMLHttpRequest, whose
// upload events drive the progress bar (fetch has none). Like every console action it carries the
// session's CSRF token, and a refusal shows the API's own message, as text.
(function () {
  "use strict";

  const form = document.getElementById("push-form");
  if (!form) {
    return; // a viewer's page has no push form
  }
  const app = window.flightdeck; // from console.js: show, refreshLive, csrf
  const panel = document.getElementById("push-progress");
  const bar = panel.querySelector("progress");
  const status = document.getElementById("push-status");
  const button = form.querySelector("button[type=submit]");

  function size(bytes) {
    if (bytes < 1048576) {
      return Math.ceil(bytes / 1024) + " KB";
    }
    return (bytes / 1048576).toFixed(bytes < 10485760 ? 1 : 0) + " MB";
  }

  function refusal(xhr) {
    try {
      const error = JSON.parse(xhr.responseText).error;
      if (error && typeof error.message === "string") {
        return error.message;
      }
    } catch (ignored) {
      // Not JSON (a proxy's error page): the status line says enough.
    }
    return xhr.status + " " + xhr.statusText;
  }

  function progress(text, loaded, total) {
    panel.hidden = false;
    status.textContent = text;
    if (total === undefined) {
      bar.removeAttribute("value"); // indeterminate: the server is checking, no byte count to show
    } else {
      bar.max = total || 1;
      bar.value = loaded;
    }
  }

  function finish(text, kind) {
    button.disabled = false;
    panel.hidden = kind !== "ok";
    app.show(text, kind);
  }

  function pushed(xhr, file) {
    if (xhr.status !== 200 && xhr.status !== 201) {
      finish("Push of " + file.name + " refused: " + refusal(xhr), "error");
      return;
    }
    const version = JSON.parse(xhr.responseText);
    const what = version.name + " v" + version.version;
    progress("Done: " + size(file.size) + " sent and checked.", 1, 1);
    finish(xhr.status === 201 ? "Pushed " + what + ": deploy it below to serve it."
                              : what + " was already in the registry with the same archive; nothing changed.", "ok");
    form.reset();
    app.refreshLive();
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const file = form.elements.archive.files[0];
    if (!file) {
      app.show("Choose an archive (.tar.gz) to push.", "error");
      return;
    }
    const limit = Number(form.dataset.maxBytes || 0);
    if (limit && file.size > limit) {
      app.show(file.name + " is " + size(file.size) + "; the server takes archives up to " + size(limit) + ".", "error");
      return;
    }
    const body = new FormData();
    body.append("archive", file, file.name);
    const digest = form.elements.sha256.value.trim();
    if (digest) {
      body.append("sha256", digest);
    }
    const xhr = new XMLHttpRequest();
    xhr.open("POST", form.dataset.upload);
    xhr.setRequestHeader("X-CSRF-Token", app.csrf);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", function (e) {
      if (e.lengthComputable) {
        const percent = Math.floor((100 * e.loaded) / e.total);
        progress("Uploading " + file.name + ": " + percent + "% (" + size(e.loaded) + " of " + size(e.total) + ")", e.loaded, e.total);
      }
    });
    xhr.upload.addEventListener("load", function () {
      progress("Uploaded; the server is checking the archive (files, ONNX graph, a real load, golden samples)…");
    });
    xhr.addEventListener("load", function () { pushed(xhr, file); });
    xhr.addEventListener("error", function () {
      finish("The upload of " + file.name + " failed: the connection to the server was lost.", "error");
    });
    button.disabled = true;
    progress("Uploading " + file.name + ": 0%", 0, file.size);
    app.show("Pushing " + file.name + "…", "pending");
    xhr.send(body);
  });
})();
