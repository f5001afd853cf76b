(function () {
  "use strict";
  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    for (var el = target; el; el = el.parentElement) {  // a nested agent: open its makers too
      if (el.tagName === "DETAILS") { el.open = true; }
    }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
  var timeline = document.getElementById("timeline");
  document.querySelectorAll("input[data-toggle]").forEach(function (box) {
    box.addEventListener("change", function () {
      timeline.classList.toggle("hide-" + box.dataset.toggle, !box.checked);
    });
  });
  document.body.dataset.ready = "yes";
})();
