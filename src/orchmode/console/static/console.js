// The console's script: a run's page follows the store (server-sent events) and swaps in
// its body anew; and what the report's own script does (timeline toggles, open on #id).
(function () {
  "use strict";
  var MIN_GAP_MS = 250;  // at most four refreshes a second, however fast events come

  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    for (var el = target; el; el = el.parentElement) {
      if (el.tagName === "DETAILS") { el.open = true; }
    }
  }

  function openDetails(root) {
    var open = new Set();
    root.querySelectorAll("details[open]").forEach(function (d, i) {
      open.add(d.id || d.dataset.key || ("#" + i));
    });
    return open;
  }

  function reopen(root, open) {
    root.querySelectorAll("details").forEach(function (d, i) {
      if (open.has(d.id || d.dataset.key || ("#" + i))) { d.open = true; }
    });
  }

  // An agent's transcript is loaded when its details are opened (the body leaves it out,
  // so a run of a thousand agents stays a small page); the last copy is shown at once
  // when the body is swapped, then fetched anew, as a running agent's grows.
  var transcripts = new Map();

  function placeholder(details) {
    var body = details.querySelector(":scope > .agent-body");
    return body && body.querySelector(":scope > [data-transcript]");
  }

  function loadTranscript(details) {
    var slot = placeholder(details);
    var session = document.getElementById("run-body");
    if (!slot || !session || slot.dataset.loading === "yes") { return; }
    var id = slot.dataset.transcript;
    if (transcripts.has(id) && !slot.firstChild) { slot.innerHTML = transcripts.get(id); }
    slot.dataset.loading = "yes";
    var url = "/runs/" + encodeURIComponent(session.dataset.session) + "/agents/" +
      encodeURIComponent(id);
    fetch(url, { credentials: "same-origin" }).then(function (answer) {
      if (!answer.ok) { throw new Error(answer.status); }
      return answer.text();
    }).then(function (html) {
      transcripts.set(id, html);
      slot.innerHTML = html;
      slot.dataset.loaded = "yes";
    }).catch(function (error) {
      if (!slot.firstChild) { slot.textContent = "the transcript could not be loaded (" + error.message + ")"; }
    }).then(function () { delete slot.dataset.loading; });
  }

  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (details.tagName === "DETAILS" && details.open) { loadTranscript(details); }
  }, true);

  function follow(body) {
    var session = body.dataset.session;
    var base = "/runs/" + encodeURIComponent(session);
    var wanted = false, fetching = false, last = 0, timer = null;

    function refresh() {
      timer = null;
      if (fetching) { wanted = true; return; }
      wanted = false; fetching = true; last = Date.now();
      fetch(base + "/body", { credentials: "same-origin" }).then(function (answer) {
        if (!answer.ok) { throw new Error(answer.status); }
        var state = answer.headers.get("X-Run-State");
        var seq = answer.headers.get("X-Run-Seq");
        return answer.text().then(function (html) { return [html, state, seq]; });
      }).then(function (got) {
        var open = openDetails(body);
        body.innerHTML = got[0];
        reopen(body, open);
        body.querySelectorAll("details[open]").forEach(loadTranscript);
        var shown = document.getElementById("run-state");
        if (shown && got[1]) { shown.textContent = got[1]; }
        var stop = document.querySelector(".console-run-bar form");
        if (stop && got[1] && got[1] !== "running" && got[1] !== "waiting for approval") {
          stop.hidden = true;
        }
        if (got[2]) { body.dataset.seq = got[2]; }
        document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
      }).catch(function () {}).then(function () {
        fetching = false;
        if (wanted) { schedule(); }
      });
    }

    function schedule() {
      if (timer !== null) { return; }
      timer = setTimeout(refresh, Math.max(0, last + MIN_GAP_MS - Date.now()));
    }

    var stream = new EventSource(base + "/events?since=" + encodeURIComponent(body.dataset.seq));
    stream.addEventListener("change", function () { schedule(); });
    stream.addEventListener("open", function () {
      var live = document.getElementById("live");
      if (live) { live.hidden = false; }
      document.body.dataset.live = "yes";
    });
  }

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box && box.matches && box.matches("input[data-toggle]")) {
      var timeline = document.getElementById("timeline");
      if (timeline) { timeline.classList.toggle("hide-" + box.dataset.toggle, !box.checked); }
    }
  });
  window.addEventListener("hashchange", openTarget);
  openTarget();
  var body = document.getElementById("run-body");
  if (body) { follow(body); }
  document.body.dataset.ready = "yes";
})();
