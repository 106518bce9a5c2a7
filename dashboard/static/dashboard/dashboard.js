// Small progressive enhancements; every page works without them.
(function () {
  "use strict";

  // Confirm destructive or wide actions.
  document.querySelectorAll("[data-confirm]").forEach(function (button) {
    button.addEventListener("click", function (event) {
      if (!window.confirm(button.getAttribute("data-confirm"))) event.preventDefault();
    });
  });

  // "Select all on this page".
  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll('input[name="ids"]').forEach(function (box) { box.checked = all.checked; });
    });
  }

  function poll(url, every, onData) {
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) { if (data && onData(data) !== false) setTimeout(tick, every); })
        .catch(function () { setTimeout(tick, every * 2); });
    }
    setTimeout(tick, every);
  }

  // A message on its way: reload the page when its status or timeline changes.
  var card = document.getElementById("message-card");
  if (card && card.dataset.poll) {
    poll(card.dataset.poll, 1500, function (data) {
      if (data.status !== card.dataset.status || String(data.events) !== card.dataset.events) {
        window.location.reload();
        return false;
      }
    });
  }

  // Bulk resend progress bar.
  var box = document.getElementById("bulk-progress");
  if (box && box.dataset.done !== "true") {
    poll(box.dataset.progress, 1000, function (data) {
      box.querySelector(".progress-bar").style.width = data.percent + "%";
      box.querySelector(".progress").setAttribute("aria-valuenow", data.percent);
      ["status", "processed", "total", "resent", "refused", "skipped"].forEach(function (key) {
        var el = document.getElementById("bulk-" + key);
        if (el) el.textContent = key === "status" ? data.statusLabel : data[key];
      });
      if (data.done) { box.dataset.done = "true"; return false; }
    });
  }
})();
