// gpuplan dashboard: small progressive enhancements; every page works without this file.
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  // The plan form: show the catalog search or the config.json box, whichever is chosen.
  function syncModelSource() {
    var chosen = document.querySelector("input[name=model_source]:checked");
    if (!chosen) return;
    document.querySelectorAll("[data-source]").forEach(function (el) {
      el.hidden = el.getAttribute("data-source") !== chosen.value;
    });
  }
  document.querySelectorAll("input[name=model_source]").forEach(function (el) {
    el.addEventListener("change", syncModelSource);
  });
  syncModelSource();

  // The plan form: show the training inputs or the serving inputs, whichever mode is chosen.
  function syncMode() {
    var chosen = document.querySelector("input[name=mode]:checked");
    if (!chosen) return;
    document.querySelectorAll("[data-mode]").forEach(function (el) {
      el.hidden = el.getAttribute("data-mode") !== chosen.value;
    });
  }
  document.querySelectorAll("input[name=mode]").forEach(function (el) {
    el.addEventListener("change", syncMode);
  });
  syncMode();

  // Move focus to the error summary after a rejected submission, so keyboard and screen-reader users hear it.
  // The quote form's message is far down the plan page: focusing it scrolls it into view too.
  var summary =
    document.getElementById("form-errors") ||
    document.getElementById("quote-error") ||
    document.getElementById("calibrate-error");
  if (summary) summary.focus();

  // Live status of a plan being estimated: poll, then reload once it is done or failed.
  var poller = document.querySelector("[data-poll]");
  if (poller) {
    var url = poller.getAttribute("data-poll");
    var label = document.getElementById("plan-status");
    var tick = function () {
      fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
        .then(function (body) {
          if (label) { label.textContent = body.status; label.className = "status status-" + body.status; }
          if (body.status === "done" || body.status === "failed") { window.location.reload(); }
          else { window.setTimeout(tick, 700); }
        })
        .catch(function () { window.setTimeout(tick, 3000); });
    };
    window.setTimeout(tick, 500);
  }

  // The quote form: the spot checkbox only for a setup whose offer has a spot price, checked when the
  // setup's listed price is its spot price (so the quote costs what the option says).
  var setup = document.getElementById("setup");
  var spotField = document.getElementById("spot-field");
  if (setup && spotField) {
    var syncSpot = function (picked) {
      var option = setup.options[setup.selectedIndex];
      var available = !!option && option.getAttribute("data-spot") === "yes";
      spotField.hidden = !available;
      var box = document.getElementById("spot");
      if (box) {
        box.disabled = !available;
        if (!available) box.checked = false;
        else if (picked) box.checked = option.getAttribute("data-pricing") === "spot";
      }
    };
    setup.addEventListener("change", function () { syncSpot(true); });
    syncSpot(false);
  }

  // Every form is sent once: a second click (or Enter) while the answer loads sent it again, a second plan or
  // quote. Sendable again when the page comes back from the browser's cache (Back) or after 10 s without answer.
  var release = function (form) {
    form.removeAttribute("data-sending");
    form.querySelectorAll("button[type=submit]").forEach(function (b) { b.removeAttribute("aria-disabled"); });
  };
  document.querySelectorAll("form[method=post]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (form.hasAttribute("data-sending")) { event.preventDefault(); return; }
      form.setAttribute("data-sending", "");
      form.querySelectorAll("button[type=submit]").forEach(function (b) { b.setAttribute("aria-disabled", "true"); });
      window.setTimeout(function () { release(form); }, 10000);
    });
  });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted) document.querySelectorAll("form[data-sending]").forEach(release);
  });

  document.querySelectorAll("[data-print]").forEach(function (el) {
    el.addEventListener("click", function () { window.print(); });
  });
})();
